// KvAttentionModel on the CPU backend with a small geometry (Hq 4, Hkv 2, D 64,
// pages of 16 tokens, 8 blocks): prefill + decode against the float64 varlen
// reference over the whole sequence, and the sequence lifecycle errors.
#include "server/models/kv_attention_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "kernels/attention/attention_ref.h"
#include "common/dtype.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/batcher/scheduler.h"
#include "server/core/model_stats.h"
#include "server/metrics/metrics.h"

namespace flashq::server {
namespace {

constexpr int kHq = 4, kHkv = 2, kD = 64, kPage = 16, kBlocks = 8;

inference::ModelConfig KvConfig() {
  inference::ModelConfig c;
  const std::string text =
      "name: \"kv_attention\" backend: \"flashq\" max_batch_size: 0\n"
      "input [\n"
      "  { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, 4, 64 ] },\n"
      "  { name: \"K\" data_type: TYPE_FP16 dims: [ -1, 2, 64 ] },\n"
      "  { name: \"V\" data_type: TYPE_FP16 dims: [ -1, 2, 64 ] }\n"
      "]\n"
      "output [ { name: \"O\" data_type: TYPE_FP16 dims: [ -1, 4, 64 ] } ]\n"
      "parameters { key: \"kind\" value: { string_value: \"kv_attention\" } }\n"
      "parameters { key: \"num_heads_q\" value: { string_value: \"4\" } }\n"
      "parameters { key: \"num_heads_kv\" value: { string_value: \"2\" } }\n"
      "parameters { key: \"head_dim\" value: { string_value: \"64\" } }\n"
      "parameters { key: \"page_size\" value: { string_value: \"16\" } }\n"
      "parameters { key: \"num_blocks\" value: { string_value: \"8\" } }\n";
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c));
  return c;
}

// A whole sequence's Q/K/V (FP16-rounded floats and their bytes).
struct Sequence {
  int len = 0;
  std::vector<float> q, k, v;
  std::string qb, kb, vb;
};

Sequence MakeSequence(int len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Sequence s;
  s.len = len;
  auto fill = [&](int64_t n, std::vector<float>* vals, std::string* bytes) {
    std::vector<float> raw(n);
    for (auto& x : raw) x = dist(rng);
    AppendFromFloat(DType::kF16, raw.data(), n, bytes);
    AppendAsFloat(DType::kF16, *bytes, vals);
  };
  fill(int64_t(len) * kHq * kD, &s.q, &s.qb);
  fill(int64_t(len) * kHkv * kD, &s.k, &s.kb);
  fill(int64_t(len) * kHkv * kD, &s.v, &s.vb);
  return s;
}

void AddInput(inference::ModelInferRequest* r, const std::string& name, const std::string& datatype,
              const std::vector<int64_t>& shape, std::string bytes) {
  auto* in = r->add_inputs();
  in->set_name(name);
  in->set_datatype(datatype);
  for (int64_t d : shape) in->add_shape(d);
  r->add_raw_input_contents(std::move(bytes));
}

// Tokens [from, from + n) of `s` as one request of sequence `id`.
inference::ModelInferRequest Step(const Sequence& s, int from, int n, uint64_t id, bool start, bool end) {
  inference::ModelInferRequest r;
  r.set_model_name("kv_attention");
  const int64_t qrow = int64_t(kHq) * kD * 2, kvrow = int64_t(kHkv) * kD * 2;
  AddInput(&r, "Q", "FP16", {n, kHq, kD}, s.qb.substr(from * qrow, n * qrow));
  AddInput(&r, "K", "FP16", {n, kHkv, kD}, s.kb.substr(from * kvrow, n * kvrow));
  AddInput(&r, "V", "FP16", {n, kHkv, kD}, s.vb.substr(from * kvrow, n * kvrow));
  (*r.mutable_parameters())["sequence_id"].set_uint64_param(id);
  if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
  if (end) (*r.mutable_parameters())["sequence_end"].set_bool_param(true);
  return r;
}

// Causal float64 attention over the whole sequence: o [len, Hq, D].
std::vector<float> Reference(const Sequence& s) {
  const int32_t cu[2] = {0, s.len};
  attention::AttentionShape shape{1, kHq, kHkv, kD, float(1.0 / std::sqrt(double(kD))), true};
  std::vector<float> o(size_t(s.len) * kHq * kD);
  attention::VarlenAttentionRef<double>(s.q.data(), s.k.data(), s.v.data(), cu, cu, shape, o.data(), nullptr);
  return o;
}

// Output rows [from, from + n) against the reference rows, FP16 tolerance with the
// reference rounded through FP16: |o - ref| <= 1e-3 + |ref| / 1024.
void ExpectRowsClose(const Work& w, const std::vector<float>& ref, int from, int n, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(w.status.ok()) << w.status;
  ASSERT_EQ(w.outputs.size(), 1u);
  const OutputTensor& o = w.outputs[0];
  EXPECT_EQ(o.name, "O");
  EXPECT_EQ(o.shape, (std::vector<int64_t>{n, kHq, kD}));
  std::vector<float> got;
  AppendAsFloat(DType::kF16, o.data, &got);
  ASSERT_EQ(got.size(), size_t(n) * kHq * kD);
  std::string rb;
  AppendFromFloat(DType::kF16, ref.data() + size_t(from) * kHq * kD, int64_t(got.size()), &rb);
  std::vector<float> r16;
  AppendAsFloat(DType::kF16, rb, &r16);
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - r16[i]);
    worst = std::max(worst, err);
    if (!(err <= 1e-3 + std::fabs(r16[i]) / 1024)) ++bad;
  }
  EXPECT_EQ(bad, 0) << bad << " elements off; worst error " << worst;
}

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

class KvAttentionModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.cpu_threads = 2;
    backend_ = std::make_unique<CpuBackend>(o);
    auto m = KvAttentionModel::Create(KvConfig(), *backend_, /*kv_cache_blocks=*/0);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  const KvSessionTable& sessions() const { return static_cast<const KvAttentionModel&>(*model_).sessions(); }

  // Prepare + Admit (what the scheduler does as it queues a work): the reservation is made.
  absl::StatusOr<std::unique_ptr<Work>> Admitted(const inference::ModelInferRequest& r) {
    auto w = model_->Prepare(r);
    if (!w.ok()) return w.status();
    if (absl::Status s = model_->Admit(**w); !s.ok()) return s;
    return w;
  }

  // Admitted + Execute alone; returns the work (check its status), or the admission error.
  absl::StatusOr<std::unique_ptr<Work>> Run(const inference::ModelInferRequest& r) {
    auto w = Admitted(r);
    if (!w.ok()) return w.status();
    model_->Execute({w->get()});
    return w;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(KvAttentionModelTest, PrefillThenDecodeMatchesFullCausalAttention) {
  const Sequence s = MakeSequence(23, 1);
  const std::vector<float> ref = Reference(s);
  auto prefill = Run(Step(s, 0, 20, 7, /*start=*/true, false));
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  ExpectRowsClose(**prefill, ref, 0, 20, "prefill of 20 tokens");
  EXPECT_EQ(sessions().blocks_in_use(), 2);  // 20 tokens at 16 per page
  for (int t = 20; t < 23; ++t) {
    auto step = Run(Step(s, t, 1, 7, false, /*end=*/t == 22));
    ASSERT_TRUE(step.ok()) << step.status();
    ExpectRowsClose(**step, ref, t, 1, "decode step at position " + std::to_string(t));
  }
  EXPECT_EQ(sessions().blocks_in_use(), 0) << "sequence_end frees the blocks";
  EXPECT_EQ(sessions().live_sequences(), 0);
}

TEST_F(KvAttentionModelTest, SequencesShareABatch) {
  // Two sequences (one prefilling over a page boundary, one decoding) in one Execute.
  const Sequence a = MakeSequence(18, 2), b = MakeSequence(40, 3);
  const std::vector<float> ra = Reference(a), rb = Reference(b);
  auto a0 = Run(Step(a, 0, 17, 1, true, false));
  ASSERT_TRUE(a0.ok()) << a0.status();
  auto b0 = Run(Step(b, 0, 5, 2, true, false));
  ASSERT_TRUE(b0.ok()) << b0.status();
  // A work points into its request's bytes: keep the requests alive until Execute.
  const auto ra1 = Step(a, 17, 1, 1, false, true), rb1 = Step(b, 5, 35, 2, false, true);
  auto a1 = Admitted(ra1);
  auto b1 = Admitted(rb1);
  ASSERT_TRUE(a1.ok() && b1.ok());
  // The scheduler never puts a decode step and a prefill in one batch; Execute takes them together all the same.
  EXPECT_NE((*a1)->batch_key, (*b1)->batch_key);
  EXPECT_FALSE((*a1)->bulk);
  EXPECT_TRUE((*b1)->bulk);
  EXPECT_NE((*a1)->exclusive_key, (*b1)->exclusive_key);
  EXPECT_EQ((*b1)->tokens, 35);
  model_->Execute({a1->get(), b1->get()});
  ExpectRowsClose(**a0, ra, 0, 17, "a prefill");
  ExpectRowsClose(**a1, ra, 17, 1, "a decode, batched");
  ExpectRowsClose(**b0, rb, 0, 5, "b prefill");
  ExpectRowsClose(**b1, rb, 5, 35, "b second chunk, batched");
  EXPECT_EQ(sessions().blocks_in_use(), 0);
}

TEST_F(KvAttentionModelTest, NeverStartedSequence) {
  const Sequence s = MakeSequence(2, 4);
  auto w = Admitted(Step(s, 0, 1, 99, /*start=*/false, false));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
  EXPECT_TRUE(Has(w.status(), "sequence 99 ")) << w.status();
  EXPECT_TRUE(Has(w.status(), "sequence_start")) << w.status();
  EXPECT_EQ(sessions().blocks_in_use(), 0);
}

TEST_F(KvAttentionModelTest, DuplicateStart) {
  const Sequence s = MakeSequence(4, 5);
  auto w = Run(Step(s, 0, 2, 7, true, false));
  ASSERT_TRUE(w.ok() && (*w)->status.ok());
  auto again = Admitted(Step(s, 2, 2, 7, /*start=*/true, false));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(Has(again.status(), "sequence 7 ")) << again.status();
  // The live sequence is untouched: it continues at position 2.
  auto next = Run(Step(s, 2, 2, 7, false, true));
  ASSERT_TRUE(next.ok()) << next.status();
  ExpectRowsClose(**next, Reference(s), 2, 2, "after the rejected duplicate start");
}

TEST_F(KvAttentionModelTest, ReuseAfterEnd) {
  const Sequence s = MakeSequence(3, 6);
  auto w = Run(Step(s, 0, 2, 7, true, /*end=*/true));
  ASSERT_TRUE(w.ok() && (*w)->status.ok());
  auto after = Admitted(Step(s, 2, 1, 7, false, false));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition) << after.status();
  EXPECT_TRUE(Has(after.status(), "sequence 7 ")) << after.status();
  // The id can be started again.
  auto restart = Run(Step(s, 0, 3, 7, true, true));
  ASSERT_TRUE(restart.ok()) << restart.status();
  ExpectRowsClose(**restart, Reference(s), 0, 3, "restarted");
}

TEST_F(KvAttentionModelTest, CacheFullThenBlocksAreFreed) {
  const Sequence a = MakeSequence(114, 7), b = MakeSequence(20, 8);
  auto a0 = Run(Step(a, 0, 112, 1, true, false));  // 7 of 8 blocks
  ASSERT_TRUE(a0.ok() && (*a0)->status.ok());
  EXPECT_EQ(sessions().blocks_in_use(), 7);

  auto b0 = Admitted(Step(b, 0, 20, 2, true, false));  // needs 2 blocks, 1 free
  ASSERT_FALSE(b0.ok());
  EXPECT_EQ(b0.status().code(), absl::StatusCode::kResourceExhausted) << b0.status();
  EXPECT_TRUE(Has(b0.status(), "KV cache full")) << b0.status();
  EXPECT_TRUE(Has(b0.status(), "need 2 blocks, 1 free of 8")) << b0.status();
  EXPECT_EQ(sessions().blocks_in_use(), 7) << "a rejected request holds nothing";
  EXPECT_EQ(sessions().live_sequences(), 1) << "and starts nothing";

  // The live sequence goes on (the 8th block) and ends; then the new one fits.
  auto a1 = Run(Step(a, 112, 2, 1, false, true));
  ASSERT_TRUE(a1.ok()) << a1.status();
  ExpectRowsClose(**a1, Reference(a), 112, 2, "a continues over the last free block");
  EXPECT_EQ(sessions().blocks_in_use(), 0);
  auto b1 = Run(Step(b, 0, 20, 2, true, true));
  ASSERT_TRUE(b1.ok()) << b1.status();
  ExpectRowsClose(**b1, Reference(b), 0, 20, "b after a freed its blocks");
  EXPECT_EQ(sessions().blocks_in_use(), 0);
}

TEST_F(KvAttentionModelTest, DropAbortsTheSequence) {
  const Sequence s = MakeSequence(12, 9);
  auto w0 = Run(Step(s, 0, 10, 5, true, false));
  ASSERT_TRUE(w0.ok() && (*w0)->status.ok());
  auto w1 = Admitted(Step(s, 10, 1, 5, false, false));
  ASSERT_TRUE(w1.ok()) << w1.status();
  model_->Drop(**w1, absl::CancelledError("client went away"));
  EXPECT_EQ(sessions().blocks_in_use(), 0) << "the aborted sequence's blocks are freed";
  EXPECT_EQ(sessions().live_sequences(), 0);
  auto w2 = Admitted(Step(s, 10, 1, 5, false, false));
  ASSERT_FALSE(w2.ok());
  EXPECT_EQ(w2.status().code(), absl::StatusCode::kFailedPrecondition) << w2.status();
  EXPECT_TRUE(Has(w2.status(), "client went away")) << w2.status();
  // It can be started again.
  auto w3 = Run(Step(s, 0, 12, 5, true, true));
  ASSERT_TRUE(w3.ok()) << w3.status();
  ExpectRowsClose(**w3, Reference(s), 0, 12, "restarted after the abort");
}

TEST_F(KvAttentionModelTest, WorkQueuedBehindADroppedOneFails) {
  // Two requests of one sequence are admitted (reserved) back to back; the first is
  // dropped (cancelled in the queue), which aborts the sequence. The second must not
  // compute on the gap the first left in the cache (KvSessionTable::Valid).
  const Sequence s = MakeSequence(12, 10);
  auto w0 = Run(Step(s, 0, 10, 5, true, false));
  ASSERT_TRUE(w0.ok() && (*w0)->status.ok());
  const auto r1 = Step(s, 10, 1, 5, false, false), r2 = Step(s, 11, 1, 5, false, false);
  auto w1 = Admitted(r1);
  auto w2 = Admitted(r2);
  ASSERT_TRUE(w1.ok() && w2.ok());
  model_->Drop(**w1, absl::CancelledError("client went away"));
  model_->Execute({w2->get()});
  EXPECT_EQ((*w2)->status.code(), absl::StatusCode::kFailedPrecondition)
      << "computed on a sequence whose previous request was dropped: " << (*w2)->status;
  EXPECT_TRUE(Has((*w2)->status, "sequence 5 ")) << (*w2)->status;
  EXPECT_TRUE((*w2)->outputs.empty());
  EXPECT_EQ(sessions().blocks_in_use(), 0) << "the last request of the aborted sequence releases its blocks";
  auto w3 = Run(Step(s, 0, 12, 5, true, true));
  ASSERT_TRUE(w3.ok()) << w3.status();
  ExpectRowsClose(**w3, Reference(s), 0, 12, "restarted");
}

// Through the real batcher: five requests of two sequences are queued (delay 100 ms,
// so normally all before the first batch forms); request 2, the second of sequence 5,
// is cancelled. Returns each request's answer (the done status, or the work's status).
std::map<int, std::vector<absl::Status>> RunCancelScenario(Model& model) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  ModelStats stats;
  SchedulerOptions o;
  o.max_queue_delay = std::chrono::milliseconds(100);
  Scheduler scheduler(model, o, metrics.ForModel("kv_attention"), stats);
  const Sequence s = MakeSequence(12, 12), t = MakeSequence(3, 13);
  const std::vector<inference::ModelInferRequest> requests = {
      Step(s, 0, 10, 5, true, false), Step(t, 0, 2, 6, true, false), Step(s, 10, 1, 5, false, false),
      Step(s, 11, 1, 5, false, true), Step(t, 2, 1, 6, false, true)};
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::vector<absl::Status>> answers;
  for (int i = 0; i < int(requests.size()); ++i) {
    auto w = model.Prepare(requests[i]);
    EXPECT_TRUE(w.ok()) << i << ": " << w.status();
    if (!w.ok()) return answers;
    auto p = std::make_unique<Pending>();
    p->work = std::move(*w);
    if (i == 2) p->cancelled = [] { return true; };
    p->done = [&, i](Pending& p, const absl::Status& st) {
      std::lock_guard<std::mutex> l(mu);
      answers[i].push_back(st.ok() ? p.work->status : st);
      cv.notify_all();
    };
    EXPECT_TRUE(scheduler.Enqueue(std::move(p)).ok());
  }
  std::unique_lock<std::mutex> l(mu);
  EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(20), [&] { return answers.size() == requests.size(); }));
  l.unlock();
  scheduler.Shutdown();
  for (const auto& [i, a] : answers) EXPECT_EQ(a.size(), 1u) << "request " << i << " answered " << a.size() << " times";
  return answers;
}

TEST_F(KvAttentionModelTest, CancelledRequestFailsTheRestOfItsSequenceThroughTheScheduler) {
  auto answers = RunCancelScenario(*model_);
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_EQ(answers[2][0].code(), absl::StatusCode::kCancelled) << answers[2][0];
  EXPECT_EQ(answers[3][0].code(), absl::StatusCode::kFailedPrecondition)
      << "request 3 ran on the gap left by the cancelled request 2: " << answers[3][0];
  EXPECT_TRUE(answers[1][0].ok()) << "the other sequence is unaffected: " << answers[1][0];
  EXPECT_TRUE(answers[4][0].ok()) << answers[4][0];
  EXPECT_EQ(sessions().blocks_in_use(), 0);
  EXPECT_EQ(sessions().live_sequences(), 0);
}

// Request 0 (sequence 5's prefill) and the cancelled request 2 (a later request of
// sequence 5) come out of one FormBatch pass. The scheduler answers the drop after the
// batch has run, so request 0, earlier and complete, succeeds; request 3 still fails.
TEST_F(KvAttentionModelTest, EarlierRequestSurvivesTheDropOfALaterOneThroughTheScheduler) {
  auto answers = RunCancelScenario(*model_);
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_TRUE(answers[0][0].ok()) << "request 0 is earlier than the cancelled one and complete: " << answers[0][0];
  EXPECT_EQ(answers[2][0].code(), absl::StatusCode::kCancelled) << answers[2][0];
  EXPECT_EQ(answers[3][0].code(), absl::StatusCode::kFailedPrecondition) << answers[3][0];
}

TEST_F(KvAttentionModelTest, BadRequests) {
  const Sequence s = MakeSequence(2, 11);
  auto r = Step(s, 0, 1, 3, true, false);
  r.mutable_parameters()->erase("sequence_id");
  auto w = Admitted(r);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(w.status(), "sequence_id")) << w.status();

  r = Step(s, 0, 1, 3, true, false);
  r.mutable_inputs(0)->set_shape(1, 2);
  r.mutable_inputs(0)->set_shape(2, 128);  // same bytes, wrong heads
  w = Admitted(r);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(w.status(), "'Q'") && Has(w.status(), "[1, 4, 64]")) << w.status();
  EXPECT_EQ(sessions().live_sequences(), 0) << "a rejected request starts nothing";
}

}  // namespace
}  // namespace flashq::server

namespace flashq::server {
namespace {

// Two long prefills and a decode step of a third sequence, through the scheduler's two workers:
// the prefills may hold one worker, never both, so the decode step runs at once and is answered
// long before the first prefill.
TEST(KvAttentionLanes, DecodeStepDoesNotWaitBehindPrefills) {
  BackendOptions o;
  o.cpu_threads = 1;
  CpuBackend backend(o);
  inference::ModelConfig config = KvConfig();
  (*config.mutable_parameters())["num_blocks"].set_string_value("512");
  (*config.mutable_parameters())["max_tokens_per_sequence"].set_string_value("4096");
  auto m = KvAttentionModel::Create(config, backend, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  ModelStats stats;
  SchedulerOptions so;
  so.workers = 2;
  Scheduler scheduler(**m, so, metrics.ForModel("kv_attention"), stats);
  const Sequence p1 = MakeSequence(2048, 21), p2 = MakeSequence(2048, 22), d = MakeSequence(2, 23);
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::pair<absl::Status, Clock::time_point>> answers;
  auto enqueue = [&](int i, const inference::ModelInferRequest& r) {
    auto w = (*m)->Prepare(r);
    ASSERT_TRUE(w.ok()) << w.status();
    auto p = std::make_unique<Pending>();
    p->work = std::move(*w);
    p->done = [&, i](Pending& p, const absl::Status& st) {
      std::lock_guard<std::mutex> l(mu);
      answers[i] = {st.ok() ? p.work->status : st, Clock::now()};
      cv.notify_all();
    };
    ASSERT_TRUE(scheduler.Enqueue(std::move(p)).ok());
  };
  auto wait = [&](size_t n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(120), [&] { return answers.size() >= n; });
  };
  const auto rd0 = Step(d, 0, 1, 3, true, false);
  enqueue(0, rd0);
  ASSERT_TRUE(wait(1));
  const auto r1 = Step(p1, 0, 2048, 1, true, true), r2 = Step(p2, 0, 2048, 2, true, true);
  const auto rd1 = Step(d, 1, 1, 3, false, true);
  enqueue(1, r1);
  enqueue(2, r2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both prefills queued or running
  const auto t0 = Clock::now();
  enqueue(3, rd1);
  ASSERT_TRUE(wait(4));
  for (const auto& [i, a] : answers) EXPECT_TRUE(a.first.ok()) << i << ": " << a.first;
  EXPECT_LT(answers[3].second, answers[1].second) << "the decode step waited for a prefill";
  EXPECT_LT(answers[3].second, answers[2].second);
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(answers[3].second - t0).count(), 500);
  scheduler.Shutdown();
}

// A sequence at max_tokens_per_sequence cannot take another token, and one whose next
// token needs a block the full cache lacks cannot either: sequence_end with zero new
// tokens ends both and frees their blocks.
TEST_F(KvAttentionModelTest, EndWithZeroTokensReleasesAFullSequence) {
  const Sequence a = MakeSequence(128, 14), b = MakeSequence(1, 15);
  auto a0 = Run(Step(a, 0, 128, 1, true, false));  // all 8 blocks
  ASSERT_TRUE(a0.ok() && (*a0)->status.ok());
  auto more = Admitted(Step(a, 127, 1, 1, false, /*end=*/true));
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  auto end = Run(Step(a, 0, 0, 1, false, /*end=*/true));
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_TRUE((*end)->status.ok()) << (*end)->status;
  ASSERT_EQ((*end)->outputs.size(), 1u);
  EXPECT_EQ((*end)->outputs[0].shape, (std::vector<int64_t>{0, kHq, kD}));
  EXPECT_TRUE((*end)->outputs[0].data.empty());
  EXPECT_EQ(sessions().blocks_in_use(), 0);
  EXPECT_EQ(sessions().live_sequences(), 0);
  auto b0 = Run(Step(b, 0, 1, 2, true, true));
  ASSERT_TRUE(b0.ok()) << b0.status();
  ExpectRowsClose(**b0, Reference(b), 0, 1, "a new sequence in the freed cache");
  // Zero tokens is only an end: not a start, not a step.
  auto empty_start = Admitted(Step(b, 0, 0, 3, true, true));
  ASSERT_FALSE(empty_start.ok());
  EXPECT_TRUE(Has(empty_start.status(), "n = 0 only with sequence_end")) << empty_start.status();
}

TEST_F(KvAttentionModelTest, NumberAndStringIdsAreDifferentSequences) {
  const Sequence s = MakeSequence(2, 16);
  auto by_number = Run(Step(s, 0, 1, 42, true, false));
  ASSERT_TRUE(by_number.ok() && (*by_number)->status.ok());
  auto r = Step(s, 0, 1, 0, true, false);
  (*r.mutable_parameters())["sequence_id"].set_string_param("42");
  auto by_string = Run(r);
  ASSERT_TRUE(by_string.ok()) << "string \"42\" is not the number 42: " << by_string.status();
  EXPECT_EQ(sessions().live_sequences(), 2);
  // int64 42 is the number 42 (Triton reads an int64 id as its uint64 bits).
  auto r64 = Step(s, 1, 1, 0, false, true);
  (*r64.mutable_parameters())["sequence_id"].set_int64_param(42);
  auto again = Run(r64);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectRowsClose(**again, Reference(s), 1, 1, "int64 42 continues uint64 42");
}

TEST_F(KvAttentionModelTest, LongStringIdsAreRefused) {
  const Sequence s = MakeSequence(1, 17);
  auto r = Step(s, 0, 1, 0, true, false);
  (*r.mutable_parameters())["sequence_id"].set_string_param(std::string(4 << 20, 'x'));
  auto w = Admitted(r);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status().code();
  EXPECT_TRUE(Has(w.status(), "4194304 bytes; the limit is 256")) << w.status().message().substr(0, 200);
  EXPECT_EQ(sessions().live_sequences(), 0);
}

// Config numbers are checked before anything is allocated with them.
TEST(KvAttentionModelCreate, ConfigNumbersOutOfRangeAreRefused) {
  BackendOptions o;
  o.cpu_threads = 1;
  CpuBackend backend(o);
  struct Case { std::vector<std::pair<std::string, std::string>> params; std::string words; };
  for (const Case& c : std::vector<Case>{{{{"num_blocks", "4294967297"}}, "num_blocks is 4294967297; it must be in 1.."},
                                         {{{"page_size", "1000000000"}}, "page_size is 1000000000"},
                                         {{{"num_blocks", "0"}}, "num_blocks is 0"},
                                         {{{"head_dim", "-64"}}, "head_dim is -64"},
                                         {{{"num_blocks", "100000000"}}, "host memory"},
                                         {{{"num_blocks", "2147483647"}, {"page_size", "65536"}}, "limit of 2^50"}}) {
    inference::ModelConfig config = KvConfig();
    for (const auto& [k, v] : c.params) (*config.mutable_parameters())[k].set_string_value(v);
    auto m = KvAttentionModel::Create(config, backend, 0);
    ASSERT_FALSE(m.ok()) << c.words;
    EXPECT_TRUE(Has(m.status(), c.words)) << m.status();
  }
  auto flag = KvAttentionModel::Create(KvConfig(), backend, 100000000);
  ASSERT_FALSE(flag.ok());
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kResourceExhausted) << flag.status();
  EXPECT_TRUE(Has(flag.status(), "--kv-cache-blocks")) << flag.status();
}

}  // namespace
}  // namespace flashq::server
