#include "server/core/shared_memory.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/core/client_text.h"

namespace flashq::server {

class SharedMemoryMapping {
 public:
  SharedMemoryMapping() = default;
  ~SharedMemoryMapping() {
    device.reset();  // unlock (or close the IPC handle) before the memory goes
    if (base) munmap(base, length);
    if (fd >= 0) close(fd);
  }
  SharedMemoryMapping(const SharedMemoryMapping&) = delete;
  SharedMemoryMapping& operator=(const SharedMemoryMapping&) = delete;

  bool cuda = false;
  std::string key;                   // system: the object's name
  uint64_t offset = 0, byte_size = 0;  // the region within the object, as registered
  int fd = -1;                       // system: kept open to re-check the object's size
  void* base = nullptr;              // system: the mapping, from the page that holds `offset`
  size_t length = 0;
  char* data = nullptr;              // the region's first byte
  MemoryKind kind = MemoryKind::kHost;
  int gpu = -1;                      // CUDA: the device
  std::shared_ptr<void> device;      // system: page-lock handle; CUDA: the opened IPC handle
  DeviceMemoryAccess* access = nullptr;  // CUDA: copies to and from the region
};

absl::Status SharedMemoryBuffer::Write(size_t offset, const void* src, size_t n) const {
  if (n == 0) return absl::OkStatus();
  if (kind == MemoryKind::kDevice) return mapping->access->Copy(data + offset, src, n);
  std::memcpy(data + offset, src, n);
  return absl::OkStatus();
}

absl::Status SharedMemoryBuffer::Read(size_t offset, void* dst, size_t n) const {
  if (n == 0) return absl::OkStatus();
  if (kind == MemoryKind::kDevice) return mapping->access->Copy(dst, data + offset, n);
  std::memcpy(dst, data + offset, n);
  return absl::OkStatus();
}

namespace {

std::string ErrnoText(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string Region(const std::string& name) { return absl::StrCat("shared-memory region ", Quoted(name)); }

constexpr size_t kMaxNameBytes = SharedMemoryRegistry::kMaxNameBytes;

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("a shared-memory region needs a non-empty name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": the name is ", name.size(), " bytes; the limit is ", kMaxNameBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SharedMemoryRegistry::CheckNewName(const std::string& name) const {
  if (auto it = regions_.find(name); it != regions_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        Region(name), " is already registered (",
        it->second->cuda ? absl::StrCat("CUDA, device ", it->second->gpu) : absl::StrCat("key ", Quoted(it->second->key)),
        "); unregister it first"));
  }
  if (int64_t(regions_.size()) >= max_regions_) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot register ", Region(name), ": ", regions_.size(),
                                                     " regions are registered, the limit (--max-shared-memory-regions)"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Register(const std::string& name, const std::string& key, uint64_t offset,
                                            uint64_t byte_size) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  // shm_open takes "/name" (or "name"): one path component of at most NAME_MAX bytes.
  const size_t first = key.find_first_not_of('/');
  if (first == std::string::npos || key.find('\0') != std::string::npos || key.find('/', first) != std::string::npos ||
      key.size() - first > NAME_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(Region(name), ": key ", Quoted(key),
                                                   " is not a shared-memory object name such as '/my_region'"));
  }
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat(Region(name), ": byte_size is 0"));
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, byte_size, &end) || end > uint64_t(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": offset ", offset, " + byte_size ", byte_size, " is past any object's end"));
  }

  DeviceMemoryAccess* device = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (absl::Status s = CheckNewName(name); !s.ok()) return s;
    device = device_;
  }
  // Opening, mapping and page-locking run unlocked (page-locking a large region takes a
  // while, and requests look regions up meanwhile); Insert checks the name again.
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    std::string why =
        absl::StrCat(Region(name), ": cannot open shared-memory object ", Quoted(key), ": ", ErrnoText(e));
    return e == ENOENT ? absl::NotFoundError(why) : absl::InvalidArgumentError(why);
  }
  auto fail = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": cannot stat shared-memory object ", Quoted(key), ": ", ErrnoText(errno))));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": ", Quoted(key), " is not a shared-memory object")));
  }
  if (st.st_size < 0 || uint64_t(st.st_size) < end) {
    return fail(absl::InvalidArgumentError(absl::StrCat(Region(name), ": offset ", offset, " + byte_size ", byte_size,
                                                        " = ", end, " is past the end of shared-memory object ",
                                                        Quoted(key), " (", int64_t(st.st_size), " bytes)")));
  }
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset - offset % page;
  const size_t length = size_t(end - start);
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(start));
  if (base == MAP_FAILED) {
    const int e = errno;
    std::string why = absl::StrCat(Region(name), ": cannot map ", byte_size, " bytes at offset ", offset,
                                   " of shared-memory object ", Quoted(key), ": ", ErrnoText(e));
    return fail(e == ENOMEM ? absl::ResourceExhaustedError(why) : absl::InvalidArgumentError(why));
  }
  auto m = std::make_shared<SharedMemoryMapping>();
  m->key = key;
  m->offset = offset;
  m->byte_size = byte_size;
  m->fd = fd;
  m->base = base;
  m->length = length;
  m->data = static_cast<char*>(base) + (offset - start);
  // Page-locked, the region goes to and from the GPUs by DMA with no host copy.
  if (device && (m->device = device->PinHost(base, length))) m->kind = MemoryKind::kPinned;
  return Insert(name, std::move(m));
}

absl::Status SharedMemoryRegistry::Insert(const std::string& name, std::shared_ptr<const SharedMemoryMapping> m) {
  std::lock_guard<std::mutex> l(mu_);
  if (absl::Status s = CheckNewName(name); !s.ok()) return s;  // m is released, unmapped
  regions_.emplace(name, std::move(m));
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::RegisterCuda(const std::string& name, const std::string& raw_handle, int64_t device,
                                                uint64_t byte_size) {
  std::unique_lock<std::mutex> l(mu_);
  if (!device_known_) {
    return absl::UnavailableError(absl::StrCat("cannot register CUDA ", Region(name),
                                               " yet: the server is starting its backend; retry once it is ready"));
  }
  if (!device_) {
    return absl::UnimplementedError(absl::StrCat("cannot register CUDA ", Region(name),
                                                 ": this server runs no GPU (--backend=cpu); use system shared memory "
                                                 "or send the tensors in the message"));
  }
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat("CUDA ", Region(name), ": byte_size is 0"));
  if (device < 0 || device > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA ", Region(name), ": device_id ", device, " is not a device"));
  }
  if (absl::Status s = CheckNewName(name); !s.ok()) return s;
  DeviceMemoryAccess* access = device_;
  l.unlock();
  auto opened = access->OpenIpc(raw_handle, int(device), byte_size);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat("CUDA ", Region(name), ": ", opened.status().message()));
  }
  auto m = std::make_shared<SharedMemoryMapping>();
  m->cuda = true;
  m->byte_size = byte_size;
  m->data = opened->data;
  m->kind = MemoryKind::kDevice;
  m->gpu = int(device);
  m->device = std::move(opened->handle);
  m->access = access;
  return Insert(name, std::move(m));
}

void SharedMemoryRegistry::SetDeviceAccess(DeviceMemoryAccess* device) {
  std::lock_guard<std::mutex> l(mu_);
  device_known_ = true;
  device_ = device;
}

bool SharedMemoryRegistry::cuda_capable() const {
  std::lock_guard<std::mutex> l(mu_);
  return device_ != nullptr;
}

void SharedMemoryRegistry::Unregister(const std::string& name, bool cuda) {
  std::shared_ptr<const SharedMemoryMapping> last;  // unmapped (if unused) after the lock is released
  std::lock_guard<std::mutex> l(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end() || it->second->cuda != cuda) return;
  last = std::move(it->second);
  regions_.erase(it);
}

void SharedMemoryRegistry::UnregisterAll(bool cuda) {
  std::vector<std::shared_ptr<const SharedMemoryMapping>> gone;  // released after the lock
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second->cuda == cuda) {
      gone.push_back(std::move(it->second));
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryRegistry::Status(const std::string& name,
                                                                                   bool cuda) const {
  std::vector<SharedMemoryRegionStatus> out;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [n, m] : regions_) {
    if ((name.empty() || n == name) && m->cuda == cuda) out.push_back({n, m->key, m->offset, m->byte_size, m->gpu});
  }
  if (!name.empty() && out.empty()) {
    return absl::NotFoundError(absl::StrCat(cuda ? "CUDA " : "", Region(name), " is not registered"));
  }
  return out;
}

absl::StatusOr<SharedMemoryBuffer> SharedMemoryRegistry::Find(const std::string& name, uint64_t offset,
                                                              uint64_t byte_size) const {
  std::shared_ptr<const SharedMemoryMapping> m;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) return absl::NotFoundError(absl::StrCat(Region(name), " is not registered"));
    m = it->second;
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, byte_size, &end) || end > m->byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + byte_size ", byte_size, " is past the end of ",
                                                   Region(name), " (", m->byte_size, " bytes)"));
  }
  struct stat st;
  if (!m->cuda && (fstat(m->fd, &st) != 0 || st.st_size < 0 || uint64_t(st.st_size) < m->offset + m->byte_size)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory object ", Quoted(m->key), " of ", Region(name),
                     " no longer holds the registered offset ", m->offset, " + byte_size ", m->byte_size,
                     " (it was truncated); register the region again"));
  }
  char* data = m->data + offset;
  const MemoryKind kind = m->kind;
  const int gpu = m->gpu;
  return SharedMemoryBuffer{std::move(m), data, size_t(byte_size), kind, gpu};
}

}  // namespace flashq::server
