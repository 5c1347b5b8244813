#include "client/bench/shm_region.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lib/system_shared_memory.h"

namespace flashq::bench {

absl::StatusOr<SharedMemoryKind> ParseSharedMemoryKind(std::string_view s) {
  if (s == "none") return SharedMemoryKind::kNone;
  if (s == "system") return SharedMemoryKind::kSystem;
  if (s == "cuda") return SharedMemoryKind::kCuda;
  return absl::InvalidArgumentError(absl::StrFormat("--shared-memory: '%s' is not none, system or cuda", s));
}

const char* SharedMemoryKindName(SharedMemoryKind kind) {
  switch (kind) {
    case SharedMemoryKind::kSystem: return "system";
    case SharedMemoryKind::kCuda: return "cuda";
    case SharedMemoryKind::kNone: break;
  }
  return "none";
}

namespace {

absl::Status Annotate(const grpc::Status& s, const std::string& what) {
  return absl::Status(absl::StatusCode(int(s.error_code())), absl::StrCat(what, ": ", s.error_message()));
}

class SystemRegion : public Region {
 public:
  SystemRegion(client::Client& c, std::string name, std::unique_ptr<client::SystemSharedMemory> shm)
      : client_(c), name_(std::move(name)), shm_(std::move(shm)) {}
  ~SystemRegion() override { Unregister(); }
  void Unregister() override {
    for (; registered_ > 0; --registered_) (void)client_.SystemSharedMemoryUnregister(registered_ - 1, name_);
  }
  absl::Status RegisterEverywhere() {
    for (; registered_ < client_.num_endpoints(); ++registered_) {
      grpc::Status s = client_.SystemSharedMemoryRegister(registered_, name_, shm_->key(), 0, shm_->size());
      if (!s.ok())
        return Annotate(s, absl::StrCat("SystemSharedMemoryRegister of ", name_, " on ", client_.endpoint(registered_)));
    }
    shm_->Unlink();  // every server holds the object now
    return absl::OkStatus();
  }
  const std::string& name() const override { return name_; }
  size_t size() const override { return shm_->size(); }
  absl::Status Write(size_t offset, std::string_view bytes) override {
    if (offset > size() || bytes.size() > size() - offset) return absl::OutOfRangeError("write past the region");
    if (!bytes.empty()) std::memcpy(shm_->data() + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  absl::StatusOr<std::string_view> Read(size_t offset, size_t n, std::string*) override {
    if (offset > size() || n > size() - offset) return absl::OutOfRangeError("read past the region");
    return std::string_view(shm_->data() + offset, n);
  }

 private:
  client::Client& client_;
  std::string name_;
  std::unique_ptr<client::SystemSharedMemory> shm_;
  int registered_ = 0;
};

class CudaRegion : public Region {
 public:
  CudaRegion(client::Client& c, std::string name, std::unique_ptr<client::CudaSharedMemory> mem)
      : client_(c), name_(std::move(name)), mem_(std::move(mem)) {}
  ~CudaRegion() override { Unregister(); }
  void Unregister() override {
    for (; registered_ > 0; --registered_) (void)client_.CudaSharedMemoryUnregister(registered_ - 1, name_);
  }
  absl::Status RegisterEverywhere() {
    for (; registered_ < client_.num_endpoints(); ++registered_) {
      grpc::Status s =
          client_.CudaSharedMemoryRegister(registered_, name_, mem_->ipc_handle(), mem_->device(), mem_->size());
      if (!s.ok())
        return Annotate(s, absl::StrCat("CudaSharedMemoryRegister of ", name_, " on ", client_.endpoint(registered_)));
    }
    return absl::OkStatus();
  }
  const std::string& name() const override { return name_; }
  size_t size() const override { return mem_->size(); }
  absl::Status Write(size_t offset, std::string_view bytes) override {
    return mem_->Write(offset, bytes.data(), bytes.size());
  }
  absl::StatusOr<std::string_view> Read(size_t offset, size_t n, std::string* scratch) override {
    scratch->resize(n);
    if (absl::Status s = mem_->Read(offset, scratch->data(), n); !s.ok()) return s;
    return std::string_view(*scratch);
  }

 private:
  client::Client& client_;
  std::string name_;
  std::unique_ptr<client::CudaSharedMemory> mem_;
  int registered_ = 0;
};

class GrpcRegionFactory : public RegionFactory {
 public:
  GrpcRegionFactory(client::Client& c, SharedMemoryKind kind, std::shared_ptr<client::CudaRuntime> cuda)
      : client_(c), kind_(kind), cuda_(std::move(cuda)) {}
  absl::StatusOr<std::unique_ptr<Region>> Create(size_t byte_size) override {
    const std::string name = absl::StrCat("flashq-bench-", getpid(), "-", next_.fetch_add(1));
    if (kind_ == SharedMemoryKind::kSystem) {
      auto shm = client::SystemSharedMemory::Create("/" + name, byte_size);
      if (!shm.ok()) return shm.status();
      auto r = std::make_unique<SystemRegion>(client_, name, std::move(*shm));
      if (absl::Status s = r->RegisterEverywhere(); !s.ok()) return s;  // ~SystemRegion undoes what was done
      return std::unique_ptr<Region>(std::move(r));
    }
    auto mem = client::CudaSharedMemory::Create(cuda_, byte_size);
    if (!mem.ok()) return mem.status();
    auto r = std::make_unique<CudaRegion>(client_, name, std::move(*mem));
    if (absl::Status s = r->RegisterEverywhere(); !s.ok()) return s;
    return std::unique_ptr<Region>(std::move(r));
  }

 private:
  client::Client& client_;
  SharedMemoryKind kind_;
  std::shared_ptr<client::CudaRuntime> cuda_;
  std::atomic<int64_t> next_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<RegionFactory>> MakeGrpcRegionFactory(client::Client& client, SharedMemoryKind kind,
                                                                     std::shared_ptr<client::CudaRuntime> cuda) {
  if (kind == SharedMemoryKind::kNone) return absl::InvalidArgumentError("no shared memory requested");
  if (kind == SharedMemoryKind::kCuda && !cuda) {
    auto rt = client::CudaRuntime::Load(0);
    if (!rt.ok()) return rt.status();
    cuda = std::move(*rt);
  }
  return std::unique_ptr<RegionFactory>(new GrpcRegionFactory(client, kind, std::move(cuda)));
}

}  // namespace flashq::bench
