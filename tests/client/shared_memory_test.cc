// --shared-memory on the client side, without a server: the flag's values, the
// tensors' shared_memory_* parameters, POSIX objects, where a request's tensors go in
// a slot's region and the check of its outputs, the slot pool (waiting, growing, a
// factory that fails), and CUDA's clear refusal where libcudart or a GPU is missing.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "client/bench/placement.h"
#include "client/bench/shm_region.h"
#include "client/bench/slot_pool.h"
#include "client/bench/workload.h"
#include "client/lib/cuda_shared_memory.h"
#include "client/lib/system_shared_memory.h"
#include "client/lib/tensor.h"

namespace flashq::bench {
namespace {

using namespace std::chrono_literals;

TEST(SharedMemoryFlag, ParsesPerfAnalyzersValues) {
  EXPECT_EQ(*ParseSharedMemoryKind("none"), SharedMemoryKind::kNone);
  EXPECT_EQ(*ParseSharedMemoryKind("system"), SharedMemoryKind::kSystem);
  EXPECT_EQ(*ParseSharedMemoryKind("cuda"), SharedMemoryKind::kCuda);
  for (const char* bad : {"", "System", "gpu", "shm", "none "}) {
    auto k = ParseSharedMemoryKind(bad);
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_NE(k.status().message().find("none, system or cuda"), std::string::npos);
  }
  for (auto k : {SharedMemoryKind::kNone, SharedMemoryKind::kSystem, SharedMemoryKind::kCuda})
    EXPECT_EQ(*ParseSharedMemoryKind(SharedMemoryKindName(k)), k);
}

TEST(SharedMemoryParams, RoundTripOnInputsAndOutputs) {
  inference::ModelInferRequest req;
  auto* in = req.add_inputs();
  client::SetSharedMemory(*in, {"r", 128, 64});
  const auto& p = in->parameters();
  EXPECT_EQ(p.at("shared_memory_region").string_param(), "r");
  EXPECT_EQ(p.at("shared_memory_byte_size").int64_param(), 128);  // int64_param, as tritonclient sends
  EXPECT_EQ(p.at("shared_memory_offset").int64_param(), 64);
  auto ref = client::SharedMemoryOf(p);
  ASSERT_TRUE(ref.has_value());
  EXPECT_EQ(ref->region, "r");
  EXPECT_EQ(ref->byte_size, 128);
  EXPECT_EQ(ref->offset, 64);
  auto* out = req.add_outputs();
  EXPECT_FALSE(client::SharedMemoryOf(out->parameters()).has_value());
  client::SetSharedMemory(*out, {"o", 8});
  EXPECT_EQ(client::SharedMemoryOf(out->parameters())->offset, 0);
}

TEST(SystemSharedMemory, CreatesMapsAndUnlinks) {
  const std::string key = "/flashq-bench-test-" + std::to_string(getpid());
  const std::string path = "/dev/shm" + key;
  struct stat st;
  {
    auto shm = client::SystemSharedMemory::Create(key, 10000);
    ASSERT_TRUE(shm.ok()) << shm.status();
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 10000);
    std::memset((*shm)->data(), 7, 10000);
    EXPECT_EQ(client::SystemSharedMemory::Create(key, 10).status().code(), absl::StatusCode::kAlreadyExists);
    (*shm)->Unlink();
    EXPECT_NE(stat(path.c_str(), &st), 0);
    EXPECT_EQ((*shm)->data()[9999], 7);  // still mapped
  }
  {
    auto shm = client::SystemSharedMemory::Create(key, 100);
    ASSERT_TRUE(shm.ok()) << shm.status();
  }
  EXPECT_NE(stat(path.c_str(), &st), 0) << "the destructor unlinks";
  EXPECT_FALSE(client::SystemSharedMemory::Create(key, 0).ok());
}

TEST(CudaSharedMemory, WorksOrSaysWhatIsMissing) {
  auto cuda = client::CudaRuntime::Load(0);
  if (!cuda.ok()) {
    const std::string m(cuda.status().message());
    EXPECT_TRUE(m.find("libcudart") != std::string::npos || m.find("GPU") != std::string::npos) << m;
    return;
  }
  auto mem = client::CudaSharedMemory::Create(*cuda, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ((*mem)->ipc_handle().size(), 64u);
  ASSERT_TRUE((*mem)->Write(100, "abcdef", 6).ok());
  char back[6];
  ASSERT_TRUE((*mem)->Read(100, back, 6).ok());
  EXPECT_EQ(std::string(back, 6), "abcdef");
  EXPECT_FALSE((*mem)->Write(4093, "abcdef", 6).ok());
}

// A region in this process's memory, registered nowhere.
class HeapRegion : public Region {
 public:
  HeapRegion(std::string name, size_t size) : name_(std::move(name)), bytes_(size, '\0') {}
  const std::string& name() const override { return name_; }
  size_t size() const override { return bytes_.size(); }
  absl::Status Write(size_t offset, std::string_view b) override {
    if (offset + b.size() > bytes_.size()) return absl::OutOfRangeError("past the end");
    bytes_.replace(offset, b.size(), b);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string_view> Read(size_t offset, size_t n, std::string*) override {
    if (offset + n > bytes_.size()) return absl::OutOfRangeError("past the end");
    return std::string_view(bytes_).substr(offset, n);
  }
  void Unregister() override { registered_ = false; }
  std::string bytes_;
  bool registered_ = true;

 private:
  std::string name_;
};

inference::ModelInferRequest AttentionLike() {
  inference::ModelInferRequest req;
  req.set_model_name("attention");
  req.set_id("7");
  client::SetBoolParam(req, "causal", true);
  const int64_t qs[] = {3, 2, 4}, cs[] = {2};
  EXPECT_TRUE(client::AddRawInput(req, "Q", DType::kF16, qs, std::string(48, 'q')).ok());
  EXPECT_TRUE(client::AddInt32Input(req, "CU_SEQLENS_Q", cs, std::vector<int32_t>{0, 3}).ok());
  client::RequestOutput(req, "O");
  return req;
}

// The server's side: a response naming O, written where the request asked.
inference::ModelInferResponse Respond(const inference::ModelInferRequest& sent, HeapRegion* region) {
  inference::ModelInferResponse resp;
  auto* o = resp.add_outputs();
  o->set_name("O");
  o->set_datatype("FP16");
  for (int64_t d : {3, 2, 4}) o->add_shape(d);
  auto ref = client::SharedMemoryOf(sent.outputs(0).parameters());
  if (ref) {
    resp.add_raw_output_contents();  // empty: the bytes are in the region
    if (region) EXPECT_TRUE(region->Write(size_t(ref->offset), std::string(size_t(ref->byte_size), 'o')).ok());
  } else {
    resp.add_raw_output_contents(std::string(48, 'o'));
  }
  return resp;
}

TEST(Placement, PutsInputsAndOutputsInTheRegion) {
  const auto req = AttentionLike();
  const int64_t out_bytes[] = {48};
  EXPECT_EQ(PlacedBytes(req, {out_bytes}), 64u + 64u + 64u);
  HeapRegion region("slot0", 192);
  auto placed = PlaceInRegion(req, {out_bytes}, region);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->raw_input_contents_size(), 0);
  EXPECT_EQ(placed->model_name(), "attention");
  EXPECT_EQ(placed->id(), "7");
  EXPECT_TRUE(placed->parameters().at("causal").bool_param());
  ASSERT_EQ(placed->inputs_size(), 2);
  EXPECT_EQ(placed->inputs(0).datatype(), "FP16");
  EXPECT_EQ(placed->inputs(0).shape_size(), 3);
  auto q = client::SharedMemoryOf(placed->inputs(0).parameters());
  auto cu = client::SharedMemoryOf(placed->inputs(1).parameters());
  auto o = client::SharedMemoryOf(placed->outputs(0).parameters());
  ASSERT_TRUE(q && cu && o);
  EXPECT_EQ(q->region, "slot0");
  EXPECT_EQ(q->offset, 0);
  EXPECT_EQ(q->byte_size, 48);
  EXPECT_EQ(cu->offset, 64);  // 64-byte aligned
  EXPECT_EQ(cu->byte_size, 8);
  EXPECT_EQ(o->offset, 128);
  EXPECT_EQ(o->byte_size, 48);
  EXPECT_EQ(region.bytes_.substr(0, 48), std::string(48, 'q'));
  EXPECT_EQ(region.bytes_.substr(128, 8), std::string(8, '\xFF'));  // the output's marks
  EXPECT_EQ(region.bytes_.substr(168, 8), std::string(8, '\xFF'));

  HeapRegion small("slot1", 100);
  EXPECT_EQ(PlaceInRegion(req, {out_bytes}, small).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(PlaceInRegion(req, Placement{}, region).ok()) << "an output without a size cannot be placed";
}

// Resident inputs are not written: they name the slot's random bytes in place, and the
// outputs, packed at the region's end, never cover a later request's inputs.
TEST(Placement, ResidentInputsStayInPlaceAndOutputsGoToTheEnd) {
  auto req = AttentionLike();
  req.set_raw_input_contents(0, "");  // Q resident: 48 bytes
  const int64_t out_bytes[] = {48}, resident[] = {48};
  EXPECT_EQ(PlacedBytes(req, {out_bytes, resident}), 64u + 64u + 64u);
  HeapRegion region("slot0", 1000);  // the usable end is 960, a 64-byte boundary
  region.bytes_.assign(1000, 'r');
  auto placed = PlaceInRegion(req, {out_bytes, resident}, region);
  ASSERT_TRUE(placed.ok()) << placed.status();
  auto q = client::SharedMemoryOf(placed->inputs(0).parameters());
  auto cu = client::SharedMemoryOf(placed->inputs(1).parameters());
  auto o = client::SharedMemoryOf(placed->outputs(0).parameters());
  ASSERT_TRUE(q && cu && o);
  EXPECT_EQ(q->offset, 0);
  EXPECT_EQ(q->byte_size, 48);
  EXPECT_EQ(region.bytes_.substr(0, 64), std::string(64, 'r')) << "a resident input is not written";
  EXPECT_EQ(cu->offset, 64);
  EXPECT_EQ(region.bytes_.substr(64, 8), std::string("\0\0\0\0\3\0\0\0", 8)) << "CU_SEQLENS {0, 3} is";
  EXPECT_EQ(o->offset, 960 - 64);
  EXPECT_EQ(region.bytes_.substr(896, 8), std::string(8, '\xFF'));

  // Workloads leave their random inputs empty and give their sizes instead.
  std::vector<std::unique_ptr<Workload>> workloads;
  workloads.push_back(MakeAttentionWorkload({.resident_inputs = true}));
  workloads.push_back(MakeKvWorkload({.resident_inputs = true}));
  workloads.push_back(MakeLinearWorkload({.n = 64, .resident_inputs = true}));
  for (auto& w : workloads) {
    Work work = w->Next();
    ASSERT_GE(work.resident_bytes.size(), 1u) << w->model();
    for (size_t i = 0; i < work.resident_bytes.size(); ++i) {
      EXPECT_GT(work.resident_bytes[i], 0) << w->model();
      EXPECT_TRUE(work.request->raw_input_contents(int(i)).empty()) << w->model();
    }
    EXPECT_GT(w->random_bytes().size(), 0u);
  }
}

TEST(Placement, CheckOutputsInTheRegionAndInTheMessage) {
  const auto req = AttentionLike();
  const int64_t out_bytes[] = {48};
  HeapRegion region("slot0", 192);
  auto placed = PlaceInRegion(req, {out_bytes}, region);
  ASSERT_TRUE(placed.ok());
  // The server answered but wrote nothing: the marks are still there.
  auto unwritten = Respond(*placed, nullptr);
  EXPECT_EQ(CheckOutputs(*placed, unwritten, &region).code(), absl::StatusCode::kDataLoss);
  auto written = Respond(*placed, &region);
  EXPECT_TRUE(CheckOutputs(*placed, written, &region).ok());
  // Another shape than the range was sized for.
  auto wrong = written;
  wrong.mutable_outputs(0)->set_shape(0, 2);
  EXPECT_FALSE(CheckOutputs(*placed, wrong, &region).ok());
  // Bytes in the message as well as in the region.
  auto both = written;
  both.set_raw_output_contents(0, "x");
  EXPECT_FALSE(CheckOutputs(*placed, both, &region).ok());
  // Over the message: the bytes must match the shape.
  auto plain = Respond(req, nullptr);
  EXPECT_TRUE(CheckOutputs(req, plain, nullptr).ok());
  plain.set_raw_output_contents(0, std::string(40, 'o'));
  EXPECT_EQ(CheckOutputs(req, plain, nullptr).code(), absl::StatusCode::kDataLoss);
  inference::ModelInferResponse none;
  EXPECT_EQ(CheckOutputs(req, none, nullptr).code(), absl::StatusCode::kNotFound);
}

TEST(Placement, WorkloadsGiveOutputSizesAndABound) {
  std::vector<std::unique_ptr<Workload>> workloads;
  workloads.push_back(MakeAttentionWorkload({}));
  workloads.push_back(MakeKvWorkload({}));
  workloads.push_back(MakeLinearWorkload({.n = 14336}));
  for (auto& w : workloads) {
    for (int i = 0; i < 20; ++i) {
      Work work = w->Next();
      ASSERT_EQ(int(work.output_bytes.size()), work.request->outputs_size());
      EXPECT_GT(work.output_bytes[0], 0);
      EXPECT_LE(int64_t(PlacedBytes(*work.request, {work.output_bytes})), w->max_request_bytes() + 4096) << w->model();
    }
  }
}

// Regions in memory; can be told to fail after some.
class FakeFactory : public RegionFactory {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Create(size_t bytes) override {
    if (fail_after >= 0 && made.load() >= fail_after) return absl::ResourceExhaustedError("region limit");
    return std::unique_ptr<Region>(new HeapRegion("r" + std::to_string(made++), bytes));
  }
  std::atomic<int> made{0};
  int fail_after = -1;
};

SlotPool::Slot* Take(SlotPool& pool, size_t bytes, absl::Status* why = nullptr) {
  std::promise<SlotPool::Slot*> p;
  pool.Acquire(bytes, [&](SlotPool::Slot* s, const absl::Status& st) {
    if (why) *why = st;
    p.set_value(s);
  });
  return p.get_future().get();
}

// Every region a pool makes holds the fill, repeated to its end.
TEST(SlotPool, FillsItsRegionsOnce) {
  FakeFactory factory;
  auto pool = SlotPool::Create(factory, 1, 2, 10, "abc");
  ASSERT_TRUE(pool.ok());
  SlotPool::Slot* s = Take(**pool, 10);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(static_cast<HeapRegion&>(*s->region).bytes_, "abcabcabca");
  (*pool)->Release(s);
}

TEST(SlotPool, PlansOneSlotPerOutstandingRequest) {
  LoadPoint c1, c16, open;
  c1.concurrency = 1;
  c16.concurrency = 16;
  open.mode = LoadPoint::Mode::kOpen;
  SlotPlan p = PlanSlots(1000, {c1, c16}, 4096);
  EXPECT_EQ(p.initial, 16);
  EXPECT_EQ(p.max, 16);
  EXPECT_EQ(p.slot_bytes, 1000u + 4096u);
  p = PlanSlots(int64_t(1) << 40, {open}, 100);
  EXPECT_EQ(p.initial, 4);
  EXPECT_EQ(p.max, 100);
  EXPECT_EQ(p.slot_bytes, SlotPlan::kMaxInitialSlotBytes);
}

TEST(SlotPool, WaitsForAFreeSlotAndGrowsOneForALargeRequest) {
  FakeFactory f;
  auto pool = SlotPool::Create(f, 2, 2, 1000);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->slots(), 2);
  SlotPool::Slot* a = Take(**pool, 500);
  SlotPool::Slot* b = Take(**pool, 1000);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a, b);
  // Both busy and the pool is full: the third waits until one is released.
  std::atomic<SlotPool::Slot*> c{nullptr};
  (*pool)->Acquire(10, [&](SlotPool::Slot* s, const absl::Status&) { c = s; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(c.load(), nullptr);
  (*pool)->Release(a);
  EXPECT_EQ(c.load(), a);
  // A request larger than every free slot grows one, on the pool's thread.
  (*pool)->Release(b);
  SlotPool::Slot* big = Take(**pool, 5000);
  ASSERT_NE(big, nullptr);
  EXPECT_GE(big->region->size(), 5000u);
  EXPECT_EQ((*pool)->slots(), 2);
  (*pool)->Release(big);
  (*pool)->Release(c.load());
}

TEST(SlotPool, MakesSlotsUpToTheMaxThenKeepsWhatTheFactoryAllows) {
  FakeFactory f;
  f.fail_after = 3;
  auto pool = SlotPool::Create(f, 1, 8, 100);
  ASSERT_TRUE(pool.ok());
  std::vector<SlotPool::Slot*> held;
  for (int i = 0; i < 3; ++i) held.push_back(Take(**pool, 100));
  EXPECT_EQ((*pool)->slots(), 3);
  // The fourth cannot be made: the request waits for one of the three.
  std::atomic<SlotPool::Slot*> d{nullptr};
  (*pool)->Acquire(100, [&](SlotPool::Slot* s, const absl::Status&) { d = s; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(d.load(), nullptr);
  EXPECT_NE((*pool)->note().find("region limit"), std::string::npos);
  (*pool)->Release(held[1]);
  EXPECT_EQ(d.load(), held[1]);
  for (auto* s : {held[0], held[2], d.load()}) (*pool)->Release(s);
}

TEST(SlotPool, RetiredSlotsLeaveUseAndAreReplaced) {
  FakeFactory f;
  auto pool = SlotPool::Create(f, 2, 2, 100);
  ASSERT_TRUE(pool.ok());
  SlotPool::Slot* a = Take(**pool, 100);
  SlotPool::Slot* b = Take(**pool, 100);
  Region* a_region = a->region.get();
  std::atomic<SlotPool::Slot*> c{nullptr};
  (*pool)->Acquire(100, [&](SlotPool::Slot* s, const absl::Status&) { c = s; });
  // a's call timed out: the server may still use its memory. The waiter gets a new slot.
  (*pool)->Retire(a);
  for (int i = 0; i < 200 && !c.load(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_NE(c.load(), nullptr);
  EXPECT_NE(c.load()->region.get(), a_region);
  EXPECT_FALSE(static_cast<HeapRegion*>(a_region)->registered_) << "unregistered at once";
  EXPECT_EQ(static_cast<HeapRegion*>(a_region)->bytes_.size(), 100u) << "its memory kept while the pool lives";
  EXPECT_EQ((*pool)->slots(), 2);
  EXPECT_EQ(f.made.load(), 3);
  (*pool)->Release(b);
  (*pool)->Release(c.load());
}

TEST(SlotPool, FailsWhenNoSlotCanBeMade) {
  FakeFactory f;
  f.fail_after = 0;
  EXPECT_EQ(SlotPool::Create(f, 1, 1, 100).status().code(), absl::StatusCode::kResourceExhausted);
  FakeFactory g;
  g.fail_after = 1;
  auto pool = SlotPool::Create(g, 1, 1, 100);
  ASSERT_TRUE(pool.ok());
  absl::Status why;
  EXPECT_EQ(Take(**pool, 1000, &why), nullptr) << "the only slot cannot grow";
  EXPECT_EQ(why.code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace flashq::bench
