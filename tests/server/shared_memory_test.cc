#include "server/core/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "server/core/request_decoder.h"

namespace flashq::server {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// A POSIX shared-memory object as a client makes one; its bytes are i % 251. Written with
// pwrite, not mapped, so that the only mappings of it in this process are the registry's.
class ShmObject {
 public:
  explicit ShmObject(size_t size) : key_("/flashq_shm_test_" + std::to_string(getpid()) + "_" + std::to_string(next_++)) {
    fd_ = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0) << key_;
    EXPECT_EQ(ftruncate(fd_, off_t(size)), 0);
    std::vector<char> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = char(i % 251);
    EXPECT_EQ(pwrite(fd_, bytes.data(), size, 0), ssize_t(size));
  }
  ~ShmObject() {
    close(fd_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  int fd() const { return fd_; }
  char At(size_t i) const {
    char c = 0;
    EXPECT_EQ(pread(fd_, &c, 1, off_t(i)), 1);
    return c;
  }

 private:
  static inline int next_ = 0;
  std::string key_;
  int fd_ = -1;
};

// Bytes of this process's mappings of /dev/shm/<key> (from /proc/self/maps).
std::vector<size_t> MappingSizes(const std::string& key) {
  std::vector<size_t> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm" + key) == std::string::npos) continue;
    const size_t dash = line.find('-'), space = line.find(' ');
    out.push_back(std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16) -
                  std::stoull(line.substr(0, dash), nullptr, 16));
  }
  return out;
}

TEST(SharedMemoryRegistryTest, ReadsAndWritesTheRegisteredRange) {
  ShmObject obj(64 << 10);
  SharedMemoryRegistry r;
  // An offset that is not a multiple of the page: the mapping starts at its page.
  ASSERT_TRUE(r.Register("in", obj.key(), 5000, 6000).ok());
  auto b = r.Find("in", 10, 100);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size, 100u);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(b->data[i], char((5010 + i) % 251)) << i;
  b->data[0] = 'x';
  EXPECT_EQ(obj.At(5010), 'x') << "writes reach the client's object";
  auto whole = r.Find("in", 0, 6000);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->data[5999], char((5000 + 5999) % 251));
  auto empty = r.Find("in", 6000, 0);
  EXPECT_TRUE(empty.ok()) << empty.status();

  auto st = r.Status("");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->size(), 1u);
  EXPECT_EQ((*st)[0].name, "in");
  EXPECT_EQ((*st)[0].key, obj.key());
  EXPECT_EQ((*st)[0].offset, 5000u);
  EXPECT_EQ((*st)[0].byte_size, 6000u);
}

TEST(SharedMemoryRegistryTest, MapsOnlyTheDeclaredBytes) {
  ShmObject obj(1 << 20);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  SharedMemoryRegistry r;
  ASSERT_TRUE(r.Register("r", obj.key(), 3 * page + 100, 2 * page).ok());
  // From the page that holds the offset to the page that holds the last byte: 3 pages of
  // the 256 in the object.
  EXPECT_EQ(MappingSizes(obj.key()), std::vector<size_t>{3 * page});
  r.Unregister("r");
  EXPECT_TRUE(MappingSizes(obj.key()).empty()) << "unmapped once unregistered and unused";
}

TEST(SharedMemoryRegistryTest, UnregisterInUseDefersTheUnmap) {
  ShmObject obj(8192);
  SharedMemoryRegistry r;
  ASSERT_TRUE(r.Register("busy", obj.key(), 0, 8192).ok());
  auto held = r.Find("busy", 4096, 16);  // what a request in flight holds
  ASSERT_TRUE(held.ok());
  r.Unregister("busy");
  EXPECT_EQ(r.Find("busy", 0, 1).status().code(), absl::StatusCode::kNotFound) << "no new users";
  EXPECT_EQ(r.Status("busy").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MappingSizes(obj.key()).size(), 1u) << "still mapped for the request in flight";
  held->data[0] = 'y';  // the request can still write its output
  EXPECT_EQ(obj.At(4096), 'y');
  // The name is free again at once, with a mapping of its own.
  ASSERT_TRUE(r.Register("busy", obj.key(), 0, 4096).ok());
  EXPECT_EQ(MappingSizes(obj.key()).size(), 2u);
  *held = SharedMemoryBuffer{};  // the request finishes
  EXPECT_EQ(MappingSizes(obj.key()).size(), 1u);
  r.UnregisterAll();
  EXPECT_TRUE(MappingSizes(obj.key()).empty());
}

TEST(SharedMemoryRegistryTest, RegisterErrors) {
  ShmObject obj(4096);
  SharedMemoryRegistry r(/*max_regions=*/2);
  auto code = [&](const std::string& name, const std::string& key, uint64_t off, uint64_t size) {
    return r.Register(name, key, off, size);
  };
  EXPECT_EQ(code("", obj.key(), 0, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(std::string(300, 'n'), obj.key(), 0, 16).code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& key : std::vector<std::string>{"", "/", "//", "/a/b", std::string("/a\0b", 4), "/" + std::string(300, 'k')}) {
    auto s = code("r", key, 0, 16);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key << ": " << s;
  }
  auto missing = code("r", "/flashq_shm_test_no_such_object", 0, 16);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_TRUE(Contains(missing, "'/flashq_shm_test_no_such_object'")) << missing;
  EXPECT_EQ(code("r", obj.key(), 0, 0).code(), absl::StatusCode::kInvalidArgument) << "byte_size 0";
  auto past = code("r", obj.key(), 4000, 97);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
  EXPECT_TRUE(Contains(past, "4097") && Contains(past, "4096 bytes")) << past;
  EXPECT_EQ(code("r", obj.key(), UINT64_MAX, 2).code(), absl::StatusCode::kInvalidArgument) << "wraps";
  EXPECT_EQ(code("r", obj.key(), uint64_t(1) << 63, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.Status("").value().empty()) << "nothing registered by the failures";

  ASSERT_TRUE(code("r", obj.key(), 0, 4096).ok());
  auto dup = code("r", obj.key(), 0, 16);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  EXPECT_TRUE(Contains(dup, "'r'")) << dup;
  ASSERT_TRUE(code("r2", obj.key(), 16, 16).ok()) << "two regions of one object";
  auto full = code("r3", obj.key(), 0, 16);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  r.Unregister("no-such-region");  // not an error, as in Triton
  EXPECT_EQ(r.Status("").value().size(), 2u);
}

TEST(SharedMemoryRegistryTest, FindErrors) {
  ShmObject obj(4096);
  SharedMemoryRegistry r;
  ASSERT_TRUE(r.Register("r", obj.key(), 1000, 1000).ok());
  auto missing = r.Find("nope", 0, 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "'nope'")) << missing.status();
  auto past = r.Find("r", 999, 2);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(past.status(), "'r'") && Contains(past.status(), "1000 bytes")) << past.status();
  EXPECT_EQ(r.Find("r", UINT64_MAX, 2).status().code(), absl::StatusCode::kInvalidArgument) << "wraps";
  EXPECT_EQ(r.Find("r", 1001, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Status("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(SharedMemoryRegistryTest, ATruncatedObjectIsRefusedNotRead) {
  ShmObject obj(8192);
  SharedMemoryRegistry r;
  ASSERT_TRUE(r.Register("r", obj.key(), 4096, 4096).ok());
  ASSERT_EQ(ftruncate(obj.fd(), 4096), 0);  // the region's bytes are gone: reading them would fault
  auto b = r.Find("r", 0, 16);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(b.status(), "truncated")) << b.status();
}

// ---- requests whose tensors are in regions --------------------------------------------

inference::ModelConfig TwoInputConfig() {
  inference::ModelConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"(name: "m"
         input [ { name: "A" data_type: TYPE_FP16 dims: [ -1, 4 ] },
                 { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]
         output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1, 4 ] } ])",
      &c));
  return c;
}

void SetShm(google::protobuf::Map<std::string, inference::InferParameter>* p, const std::string& region, int64_t size,
            int64_t offset) {
  (*p)["shared_memory_region"].set_string_param(region);
  (*p)["shared_memory_byte_size"].set_int64_param(size);
  (*p)["shared_memory_offset"].set_int64_param(offset);
}

// A [3, 4] FP16 from region "r" at offset 40, B [2] FP32 in raw_input_contents.
inference::ModelInferRequest MixedRequest() {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  auto* a = r.add_inputs();
  a->set_name("A");
  a->set_datatype("FP16");
  a->add_shape(3);
  a->add_shape(4);
  SetShm(a->mutable_parameters(), "r", 24, 40);
  auto* b = r.add_inputs();
  b->set_name("B");
  b->set_datatype("FP32");
  b->add_shape(2);
  r.add_raw_input_contents(std::string(8, '\1'));
  return r;
}

// The registry's CUDA side with a stand-in for the backend (no GPU here): a "handle" names a host
// buffer, opening counts, closing counts, and the page-lock is recorded. The CUDA backend's own
// OpenIpc/PinHost run on a GPU in tests/server_gpu/test_cuda_server.py.
class FakeDevice : public DeviceMemoryAccess {
 public:
  std::shared_ptr<void> PinHost(void* data, size_t size) override {
    ++pinned;
    return std::shared_ptr<void>(data, [this](void*) { ++unpinned; });
  }
  absl::StatusOr<OpenedIpc> OpenIpc(const std::string& raw_handle, int device, uint64_t byte_size) override {
    if (raw_handle != "good") return absl::InvalidArgumentError("cannot open the CUDA IPC handle");
    if (byte_size > memory.size()) return absl::InvalidArgumentError("past the end of the allocation");
    ++opened;
    return OpenedIpc{memory.data(), std::shared_ptr<void>(memory.data(), [this](void*) { ++closed; })};
  }
  absl::Status Copy(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  std::string memory = std::string(4096, 'x');
  int pinned = 0, unpinned = 0, opened = 0, closed = 0;
};

TEST(SharedMemoryRegistryTest, CudaRegionsShareNamesButNotStatusOrUnregister) {
  FakeDevice dev;
  SharedMemoryRegistry reg(8);
  // Before the backend is up: UNAVAILABLE; without a GPU backend: UNIMPLEMENTED.
  EXPECT_EQ(reg.RegisterCuda("c", "good", 0, 64).code(), absl::StatusCode::kUnavailable);
  reg.SetDeviceAccess(nullptr);
  EXPECT_EQ(reg.RegisterCuda("c", "good", 0, 64).code(), absl::StatusCode::kUnimplemented);
  reg.SetDeviceAccess(&dev);
  EXPECT_TRUE(reg.cuda_capable());
  ShmObject obj(8192);
  ASSERT_TRUE(reg.Register("sys", obj.key(), 0, 8192).ok());
  EXPECT_EQ(dev.pinned, 1);  // a system region is page-locked once the backend can
  ASSERT_TRUE(reg.RegisterCuda("c", "good", 0, 1024).ok());
  // One namespace: neither kind may take the other's name.
  EXPECT_EQ(reg.RegisterCuda("sys", "good", 0, 64).code(), absl::StatusCode::kAlreadyExists);
  absl::Status dup = reg.Register("c", obj.key(), 0, 64);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(dup, "CUDA, device 0")) << dup;
  // The backend's refusals keep their code and gain the region's name.
  absl::Status bad = reg.RegisterCuda("bad", "junk", 0, 64);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad, "'bad'")) << bad;
  EXPECT_EQ(reg.RegisterCuda("big", "good", 0, 1 << 20).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.RegisterCuda("zero", "good", 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.RegisterCuda("neg", "good", -1, 64).code(), absl::StatusCode::kInvalidArgument);
  // Status and Unregister see only their own kind.
  auto sys = reg.Status("");
  auto cuda = reg.Status("", /*cuda=*/true);
  ASSERT_TRUE(sys.ok() && cuda.ok());
  ASSERT_EQ(sys->size(), 1u);
  EXPECT_EQ((*sys)[0].name, "sys");
  ASSERT_EQ(cuda->size(), 1u);
  EXPECT_EQ((*cuda)[0].name, "c");
  EXPECT_EQ((*cuda)[0].byte_size, 1024u);
  EXPECT_EQ(reg.Status("c").status().code(), absl::StatusCode::kNotFound);
  reg.Unregister("c");  // a system unregister leaves a CUDA region alone
  EXPECT_TRUE(reg.Status("c", true).ok());
  // A CUDA buffer reads and writes through the backend, and stays open while a request holds it.
  auto buf = reg.Find("c", 16, 4);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->kind, MemoryKind::kDevice);
  EXPECT_EQ(buf->device, 0);
  ASSERT_TRUE(buf->Write(0, "abcd", 4).ok());
  char back[4];
  ASSERT_TRUE(buf->Read(0, back, 4).ok());
  EXPECT_EQ(std::string(back, 4), "abcd");
  EXPECT_EQ(reg.Find("c", 1020, 8).status().code(), absl::StatusCode::kInvalidArgument);
  reg.UnregisterAll(/*cuda=*/true);
  EXPECT_EQ(reg.Find("c", 0, 4).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dev.closed, 0);  // still held
  *buf = SharedMemoryBuffer();
  EXPECT_EQ(dev.closed, 1);
  EXPECT_TRUE(reg.Status("sys").ok());
  reg.UnregisterAll();
  EXPECT_EQ(dev.unpinned, 1);
}

TEST(SharedMemoryDecodeTest, InputsAreReadInPlace) {
  ShmObject obj(4096);
  SharedMemoryRegistry reg;
  ASSERT_TRUE(reg.Register("r", obj.key(), 1000, 100).ok());
  auto d = DecodeInputs(MixedRequest(), {.shared_memory = &reg}, TwoInputConfig());
  ASSERT_TRUE(d.ok()) << d.status();
  auto region = reg.Find("r", 40, 24);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(d->Find("A")->data.data(), region->data) << "no copy: the tensor points into the mapping";
  EXPECT_EQ(d->Find("A")->data.size(), 24u);
  EXPECT_EQ(d->Find("A")->data[0], char(1040 % 251));
  EXPECT_EQ(d->Find("B")->data, std::string(8, '\1')) << "raw_input_contents count only the other inputs";
  EXPECT_EQ(d->regions.size(), 1u);
}

TEST(SharedMemoryDecodeTest, BadInputsNameTheTensorAndRegion) {
  ShmObject obj(4096);
  SharedMemoryRegistry reg;
  ASSERT_TRUE(reg.Register("r", obj.key(), 0, 60).ok());
  auto expect = [&](const inference::ModelInferRequest& req, absl::StatusCode code,
                    std::initializer_list<const char*> words, const SharedMemoryRegistry* r) {
    auto d = DecodeInputs(req, {.shared_memory = r}, TwoInputConfig());
    EXPECT_EQ(d.status().code(), code) << d.status();
    for (const char* w : words) EXPECT_TRUE(Contains(d.status(), w)) << w << ": " << d.status();
  };
  auto req = MixedRequest();
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "'r'", "60 bytes"}, &reg);  // 40 + 24 > 60
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 24, 0);
  expect(req, absl::StatusCode::kOk, {}, &reg);
  expect(req, absl::StatusCode::kUnimplemented, {"'A'", "'r'"}, nullptr);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "nope", 24, 0);
  expect(req, absl::StatusCode::kNotFound, {"'A'", "'nope'"}, &reg);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 20, 0);
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "needs 24 bytes", "20"}, &reg);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 24, -1);
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "shared_memory_offset", "-1"}, &reg);
  (*req.mutable_inputs(0)->mutable_parameters())["shared_memory_offset"].set_string_param("0");
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "shared_memory_offset", "integer"}, &reg);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 24, 0);
  req.mutable_inputs(0)->mutable_parameters()->erase("shared_memory_byte_size");
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "shared_memory_byte_size"}, &reg);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 24, 0);
  req.mutable_inputs(0)->mutable_parameters()->erase("shared_memory_region");
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "without 'shared_memory_region'"}, &reg);
  SetShm(req.mutable_inputs(0)->mutable_parameters(), "r", 24, 0);
  req.add_raw_input_contents(std::string(24, '\0'));  // one for A as well: Triton counts only B
  expect(req, absl::StatusCode::kInvalidArgument, {"2 inputs (1 in shared memory)", "2 raw_input_contents"}, &reg);
  req.mutable_raw_input_contents()->RemoveLast();
  req.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
  expect(req, absl::StatusCode::kInvalidArgument, {"'A'", "typed contents", "shared-memory region"}, &reg);
}

TEST(SharedMemoryDecodeTest, OutputsAreBoundAfterTheirSizeIsChecked) {
  ShmObject obj(4096);
  SharedMemoryRegistry reg;
  ASSERT_TRUE(reg.Register("out", obj.key(), 0, 4096).ok());
  inference::ModelInferRequest req;
  auto* o = req.add_outputs();
  o->set_name("Y");
  Work w;
  w.ExpectOutput("Y", 1000);
  SetShm(o->mutable_parameters(), "out", 999, 8);
  auto small = BindSharedMemoryOutputs(req, &reg, w);
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument) << small;
  EXPECT_TRUE(Contains(small, "'Y'") && Contains(small, "'out'") && Contains(small, "1000") && Contains(small, "999"))
      << small;
  EXPECT_TRUE(w.shm_outputs.empty());
  SetShm(o->mutable_parameters(), "out", 1000, 3500);
  EXPECT_EQ(BindSharedMemoryOutputs(req, &reg, w).code(), absl::StatusCode::kInvalidArgument) << "past the region";
  SetShm(o->mutable_parameters(), "out", 1000, 8);
  ASSERT_TRUE(BindSharedMemoryOutputs(req, &reg, w).ok());
  ASSERT_EQ(w.shm_outputs.size(), 1u);
  EXPECT_EQ(w.shm_outputs[0].name, "Y");
  EXPECT_EQ(w.shm_outputs[0].buffer.size, 1000u);
  EXPECT_EQ(w.MessageBytes(), 0) << "Y goes to the region, not the message";
}

}  // namespace
}  // namespace flashq::server
