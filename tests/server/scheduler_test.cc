// Scheduler (per-model bounded queue + dynamic batcher) with a fake Model that
// records every batch, can hold a batch on a gate to simulate long compute, and
// sets one output per work. Real ServerMetrics and ModelStats.
//
// Most tests "plug" the single worker first: a work whose Execute blocks on a gate.
// Everything enqueued while the plug runs is queued before the next batch forms, so
// the batches are deterministic however loaded the machine is.
#include "server/batcher/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

using std::chrono::milliseconds;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct FakeWork : Work {
  int id = 0;
  bool block = false;  // Execute of its batch waits on the model's gate
};

inference::ModelConfig FakeConfig() {
  inference::ModelConfig c;
  c.set_name("fake");
  return c;
}

class FakeModel : public Model {
 public:
  FakeModel() : Model(FakeConfig()) {}

  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest&,
                                                const RequestBytes&) override {
    return absl::UnimplementedError("not used");
  }

  void Execute(const std::vector<Work*>& batch) override {
    std::vector<int> ids;
    bool block = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      std::set<std::string> in_batch;
      for (Work* w : batch) {
        const auto& fw = static_cast<const FakeWork&>(*w);
        ids.push_back(fw.id);
        block |= fw.block;
        const std::string& ex = w->exclusive_key;
        if (ex.empty()) continue;
        if (!in_batch.insert(ex).second) ++exclusive_shared_batch_;
        if (running_exclusive_.count(ex)) ++exclusive_concurrent_;
        running_exclusive_.insert(ex);
      }
      batches_.push_back(ids);
      batch_keys_.push_back(batch.empty() ? "" : batch[0]->batch_key);
      for (Work* w : batch) mixed_keys_ += w->batch_key != batch[0]->batch_key;
      ++running_;
      max_running_ = std::max(max_running_, running_);
    }
    cv_.notify_all();
    if (block) gate.Wait();
    if (compute_time.count() > 0) std::this_thread::sleep_for(compute_time);
    for (Work* w : batch) {
      const int id = static_cast<const FakeWork&>(*w).id;
      w->status = absl::OkStatus();
      w->outputs.push_back({"OUT", DType::kI32, {1}, std::string(reinterpret_cast<const char*>(&id), 4)});
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      for (Work* w : batch) {
        if (!w->exclusive_key.empty()) running_exclusive_.erase(w->exclusive_key);
      }
      --running_;
    }
  }

  void Drop(Work& work, const absl::Status& why) override {
    std::lock_guard<std::mutex> l(mu_);
    drops_[static_cast<FakeWork&>(work).id].push_back(why.code());
  }

  // Waits until Execute has been entered `n` times in all.
  bool WaitForBatches(size_t n, milliseconds timeout = milliseconds(10000)) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return batches_.size() >= n; });
  }

  std::vector<std::vector<int>> batches() const { std::lock_guard<std::mutex> l(mu_); return batches_; }
  std::vector<std::string> batch_keys() const { std::lock_guard<std::mutex> l(mu_); return batch_keys_; }
  std::map<int, std::vector<absl::StatusCode>> drops() const { std::lock_guard<std::mutex> l(mu_); return drops_; }
  int exclusive_shared_batch() const { std::lock_guard<std::mutex> l(mu_); return exclusive_shared_batch_; }
  int exclusive_concurrent() const { std::lock_guard<std::mutex> l(mu_); return exclusive_concurrent_; }
  int max_running() const { std::lock_guard<std::mutex> l(mu_); return max_running_; }
  int mixed_keys() const { std::lock_guard<std::mutex> l(mu_); return mixed_keys_; }
  bool Executed(int id) const {
    for (const auto& b : batches()) {
      if (std::count(b.begin(), b.end(), id)) return true;
    }
    return false;
  }

  Gate gate;
  milliseconds compute_time{0};

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<int>> batches_;
  std::vector<std::string> batch_keys_;
  std::map<int, std::vector<absl::StatusCode>> drops_;
  std::multiset<std::string> running_exclusive_;
  int exclusive_shared_batch_ = 0, exclusive_concurrent_ = 0, mixed_keys_ = 0;
  int running_ = 0, max_running_ = 0;
};

// Every `done` call, by request id.
class Answers {
 public:
  void Record(int id, const absl::Status& s, const Pending& p) {
    {
      std::lock_guard<std::mutex> l(mu_);
      codes_[id].push_back(s.code());
      order_.push_back(id);
      messages_[id] = std::string(s.message());
      queue_ns_[id] = p.queue_ns;
      if (s.ok()) {
        bool good = p.work->status.ok() && p.work->outputs.size() == 1 && p.work->outputs[0].data.size() == 4;
        int out = -1;
        if (good) std::memcpy(&out, p.work->outputs[0].data.data(), 4);
        if (!good || out != id) bad_outputs_.push_back(id);
      }
      ++total_;
    }
    cv_.notify_all();
  }
  bool WaitFor(int n, milliseconds timeout = milliseconds(10000)) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return total_ >= n; });
  }
  // Each id in `ids` was answered exactly once, and nothing else was answered.
  void ExpectEachOnce(const std::vector<int>& ids) {
    std::lock_guard<std::mutex> l(mu_);
    for (int id : ids) EXPECT_EQ(codes_[id].size(), 1u) << "request " << id << " answered " << codes_[id].size() << " times";
    EXPECT_EQ(total_, int(ids.size())) << "answers in all";
    EXPECT_TRUE(bad_outputs_.empty()) << "requests answered OK without their output: " << bad_outputs_.size();
  }
  absl::StatusCode code(int id) {
    std::lock_guard<std::mutex> l(mu_);
    return codes_[id].empty() ? absl::StatusCode::kUnknown : codes_[id][0];
  }
  int count(int id) {
    std::lock_guard<std::mutex> l(mu_);
    return int(codes_[id].size());
  }
  std::string message(int id) { std::lock_guard<std::mutex> l(mu_); return messages_[id]; }
  uint64_t queue_ns(int id) { std::lock_guard<std::mutex> l(mu_); return queue_ns_[id]; }
  std::vector<int> order() { std::lock_guard<std::mutex> l(mu_); return order_; }  // ids as answered

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::vector<absl::StatusCode>> codes_;
  std::map<int, std::string> messages_;
  std::map<int, uint64_t> queue_ns_;
  std::vector<int> bad_outputs_;
  std::vector<int> order_;
  int total_ = 0;
};

struct Req {
  int id = 0;
  int64_t tokens = 1;
  std::string batch_key;
  std::string exclusive_key;
  bool block = false;
  bool bulk = false;
  std::optional<Clock::time_point> deadline;
  std::function<bool()> cancelled;
  std::optional<std::chrono::microseconds> timeout;  // the request's own queue timeout
  uint64_t priority = 0;
};

// Members are destroyed in reverse order: the scheduler (joins its workers) first.
struct Harness {
  explicit Harness(SchedulerOptions o, ResponderPool* responders = nullptr) : options(o) {
    scheduler = std::make_unique<Scheduler>(model, options, metrics.ForModel("fake"), stats, responders);
  }

  absl::Status Enqueue(const Req& r) {
    auto w = std::make_unique<FakeWork>();
    w->id = r.id;
    w->block = r.block;
    w->tokens = r.tokens;
    w->batch_key = r.batch_key;
    w->exclusive_key = r.exclusive_key;
    w->bulk = r.bulk;
    auto p = std::make_unique<Pending>();
    p->work = std::move(w);
    p->deadline = r.deadline;
    p->cancelled = r.cancelled;
    p->timeout = r.timeout;
    p->priority = r.priority;
    const int id = r.id;
    p->done = [this, id](Pending& p, const absl::Status& s) { answers.Record(id, s, p); };
    return scheduler->Enqueue(std::move(p));
  }

  // Enqueues a work that holds the (single) worker until model.gate opens, and waits
  // until it is executing.
  void Plug(int id) {
    Req r;
    r.id = id;
    r.batch_key = "plug";
    r.block = true;
    ASSERT_TRUE(Enqueue(r).ok());
    ASSERT_TRUE(model.WaitForBatches(1));
  }

  prometheus::ClientMetric::Histogram Hist(prometheus::Histogram* h) { return h->Collect().histogram; }

  SchedulerOptions options;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics{registry};
  ModelStats stats;
  FakeModel model;
  Answers answers;
  std::unique_ptr<Scheduler> scheduler;
};

SchedulerOptions Options(milliseconds delay, int64_t budget = 16384, int workers = 1, int64_t queue = 1024) {
  SchedulerOptions o;
  o.max_queue_delay = delay;
  o.max_batch_tokens = budget;
  o.workers = workers;
  o.max_queue_size = queue;
  return o;
}

std::vector<int> Range(int a, int b) {
  std::vector<int> v;
  for (int i = a; i < b; ++i) v.push_back(i);
  return v;
}

TEST(SchedulerTest, MergesRequestsWithinTheDelay) {
  // The first request opens a batch that stays open for 250 ms; the other seven
  // arrive within microseconds, so all eight run as one batch, in arrival order.
  Harness h(Options(milliseconds(250)));
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(h.Enqueue({.id = i, .tokens = 3}).ok());
  ASSERT_TRUE(h.answers.WaitFor(8));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.batches(), (std::vector<std::vector<int>>{Range(0, 8)}));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(h.answers.code(i), absl::StatusCode::kOk);
  h.answers.ExpectEachOnce(Range(0, 8));
  EXPECT_TRUE(h.model.drops().empty());

  ServerMetrics::Model& m = h.metrics.ForModel("fake");
  auto requests = h.Hist(m.batch_requests);
  EXPECT_EQ(requests.sample_count, 1u);
  EXPECT_DOUBLE_EQ(requests.sample_sum, 8.0);
  auto tokens = h.Hist(m.batch_tokens);
  EXPECT_EQ(tokens.sample_count, 1u);
  EXPECT_DOUBLE_EQ(tokens.sample_sum, 24.0);
  EXPECT_EQ(h.Hist(m.queue_seconds).sample_count, 8u) << "one queue-time sample per request";
  EXPECT_EQ(h.Hist(m.compute_seconds).sample_count, 8u);
  EXPECT_DOUBLE_EQ(m.queue_depth->Value(), 0.0);

  inference::ModelStatistics st;
  h.stats.Fill(&st);
  EXPECT_EQ(st.execution_count(), 1u);
  ASSERT_EQ(st.batch_stats_size(), 1);
  EXPECT_EQ(st.batch_stats(0).batch_size(), 8u);
  EXPECT_EQ(st.batch_stats(0).compute_infer().count(), 1u);
  EXPECT_EQ(st.batch_stats(0).compute_input().count(), 1u);
}

TEST(SchedulerTest, TokenBudgetSplitsBatches) {
  Harness h(Options(milliseconds(20), /*budget=*/10));
  h.Plug(100);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.Enqueue({.id = i, .tokens = 4}).ok());  // 16 tokens, budget 10
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(5));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.batches(), (std::vector<std::vector<int>>{{100}, {0, 1}, {2, 3}}));
  h.answers.ExpectEachOnce({100, 0, 1, 2, 3});
  auto tokens = h.Hist(h.metrics.ForModel("fake").batch_tokens);
  EXPECT_EQ(tokens.sample_count, 3u);
  EXPECT_DOUBLE_EQ(tokens.sample_sum, 17.0);  // plug 1 + 8 + 8
  // Bucket le=8 holds the two 8-token batches and the plug (cumulative counts).
  for (const auto& b : tokens.bucket) {
    if (b.upper_bound == 8.0) EXPECT_EQ(b.cumulative_count, 3u);
    if (b.upper_bound == 4.0) EXPECT_EQ(b.cumulative_count, 1u);
  }
}

TEST(SchedulerTest, RequestOverTheBudgetRunsAlone) {
  Harness h(Options(milliseconds(20), /*budget=*/10));
  h.Plug(100);
  ASSERT_TRUE(h.Enqueue({.id = 0, .tokens = 3}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .tokens = 25}).ok());  // larger than the whole budget
  ASSERT_TRUE(h.Enqueue({.id = 2, .tokens = 3}).ok());
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(4));
  // Arrival order within the key is kept inside each batch; the big one never waits forever.
  ASSERT_TRUE(h.Enqueue({.id = 3, .tokens = 40}).ok());  // alone in an empty queue
  ASSERT_TRUE(h.answers.WaitFor(5));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.batches(), (std::vector<std::vector<int>>{{100}, {0, 2}, {1}, {3}}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.answers.code(i), absl::StatusCode::kOk);
  h.answers.ExpectEachOnce({100, 0, 1, 2, 3});
}

// The default delay is 0: a request that finds a worker idle runs at once; requests merge
// only while every worker is busy, and the worker that frees up takes them all.
TEST(SchedulerTest, WorkConservingByDefault) {
  SchedulerOptions defaults;
  EXPECT_EQ(defaults.max_queue_delay.count(), 0);
  Harness h(Options(milliseconds(0), 16384, /*workers=*/2));
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    ASSERT_TRUE(h.Enqueue({.id = i}).ok());
    ASSERT_TRUE(h.answers.WaitFor(i + 1));
    EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 100) << "request " << i;
  }
  std::vector<uint64_t> queued;
  for (int i = 0; i < 20; ++i) queued.push_back(h.answers.queue_ns(i));
  std::sort(queued.begin(), queued.end());
  EXPECT_LT(queued[10], uint64_t(2'000'000)) << "median queue time of a lone request: no batching window";
  // Both workers busy: the requests that arrive meanwhile form one batch when a worker frees.
  ASSERT_TRUE(h.Enqueue({.id = 100, .batch_key = "plug-a", .block = true}).ok());
  ASSERT_TRUE(h.model.WaitForBatches(21));
  ASSERT_TRUE(h.Enqueue({.id = 101, .batch_key = "plug-b", .block = true}).ok());
  const bool both_busy = h.model.WaitForBatches(22);
  for (int i = 200; i < 205; ++i) EXPECT_TRUE(h.Enqueue({.id = i}).ok());
  h.model.gate.Open();  // before any assertion can return: the workers must not stay blocked
  ASSERT_TRUE(both_busy);
  ASSERT_TRUE(h.answers.WaitFor(27));
  const auto batches = h.model.batches();
  EXPECT_TRUE(std::count(batches.begin(), batches.end(), std::vector<int>{200, 201, 202, 203, 204}))
      << "the queued requests were not merged into one batch";
}

// Bulk batches take at most half the workers: with two workers, a second bulk request
// waits while one runs, and a short request behind it runs at once on the other worker.
TEST(SchedulerTest, BulkWorkLeavesAWorkerForShortWork) {
  Harness h(Options(milliseconds(0), 16384, /*workers=*/2));
  ASSERT_TRUE(h.Enqueue({.id = 0, .batch_key = "bulk", .block = true, .bulk = true}).ok());
  const bool first_running = h.model.WaitForBatches(1);
  EXPECT_TRUE(h.Enqueue({.id = 1, .batch_key = "bulk", .bulk = true}).ok());
  EXPECT_TRUE(h.Enqueue({.id = 2, .batch_key = "short"}).ok());
  const bool short_ran = h.answers.WaitFor(1, milliseconds(5000));
  const bool second_bulk_waited = !h.model.Executed(1);
  h.model.gate.Open();  // before any assertion can return: the worker must not stay blocked
  ASSERT_TRUE(first_running);
  EXPECT_TRUE(short_ran) << "the short request waited for the bulk one";
  EXPECT_EQ(h.answers.code(2), absl::StatusCode::kOk);
  EXPECT_TRUE(second_bulk_waited) << "two bulk batches held both workers";
  ASSERT_TRUE(h.answers.WaitFor(3));
  h.answers.ExpectEachOnce({0, 1, 2});
  EXPECT_EQ(h.model.max_running(), 2);
}

TEST(SchedulerTest, LoneRequestWaitsAboutTheDelay) {
  const milliseconds delay(60);
  Harness h(Options(delay));
  const auto t0 = Clock::now();
  ASSERT_TRUE(h.Enqueue({.id = 0}).ok());
  ASSERT_TRUE(h.answers.WaitFor(1));
  const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  EXPECT_GE(waited.count(), delay.count()) << "a lone request waits for company up to max_queue_delay";
  EXPECT_LT(waited.count(), delay.count() + 500) << "and not much longer (generous bound: shared CI machine)";
  EXPECT_GE(h.answers.queue_ns(0), uint64_t(delay.count()) * 1000000);
  h.answers.ExpectEachOnce({0});

  // A full budget closes the batch at once, without waiting for the delay.
  Harness big(Options(milliseconds(5000), /*budget=*/4));
  const auto t1 = Clock::now();
  ASSERT_TRUE(big.Enqueue({.id = 0, .tokens = 4}).ok());
  ASSERT_TRUE(big.answers.WaitFor(1));
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t1).count(), 2500)
      << "a batch that fills the budget does not wait for max_queue_delay";
  big.answers.ExpectEachOnce({0});
}

TEST(SchedulerTest, BatchKeysNeverMix) {
  Harness h(Options(milliseconds(20)));
  h.Plug(100);
  const std::vector<std::string> keys = {"a", "b", "a", "b", "a", "c", "b", "a"};
  for (int i = 0; i < int(keys.size()); ++i) ASSERT_TRUE(h.Enqueue({.id = i, .batch_key = keys[i]}).ok());
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(9));
  h.scheduler->Shutdown();
  // The oldest's key is served first; arrival order is kept within each key.
  EXPECT_EQ(h.model.batches(), (std::vector<std::vector<int>>{{100}, {0, 2, 4, 7}, {1, 3, 6}, {5}}));
  EXPECT_EQ(h.model.batch_keys(), (std::vector<std::string>{"plug", "a", "b", "c"}));
  EXPECT_EQ(h.model.mixed_keys(), 0);
  std::vector<int> all = Range(0, 8);
  all.push_back(100);
  h.answers.ExpectEachOnce(all);
}

TEST(SchedulerTest, BatchKeysNeverMixUnderLoad) {
  // No plug: requests of three keys from three threads; whatever the timing, a batch
  // holds one key and each key's requests run in the order they were enqueued.
  Harness h(Options(milliseconds(2), 16384, /*workers=*/2));
  constexpr int kPerThread = 60;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kPerThread; ++i) {
        ASSERT_TRUE(h.Enqueue({.id = t * 1000 + i, .batch_key = std::string(1, char('a' + t))}).ok());
        if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(h.answers.WaitFor(3 * kPerThread));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.mixed_keys(), 0);
  std::vector<int> all;
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < kPerThread; ++i) all.push_back(t * 1000 + i);
  }
  h.answers.ExpectEachOnce(all);
  // With one key per thread and one batch per key at a time per worker, the order
  // inside each batch is arrival order.
  for (const auto& b : h.model.batches()) EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

TEST(SchedulerTest, ExclusiveKeysNeverShareNorOverlap) {
  Harness h(Options(milliseconds(1), 16384, /*workers=*/2));
  h.model.compute_time = milliseconds(3);
  // Two sequences (exclusive keys) and stateless work, all with one batch key.
  std::vector<int> ids;
  for (int i = 0; i < 12; ++i) {
    Req r{.id = i};
    if (i % 3 == 0) r.exclusive_key = "s1";
    if (i % 3 == 1) r.exclusive_key = "s2";
    ASSERT_TRUE(h.Enqueue(r).ok());
    ids.push_back(i);
    if (i % 4 == 3) std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(h.answers.WaitFor(12));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.exclusive_shared_batch(), 0) << "two works of one sequence in one batch";
  EXPECT_EQ(h.model.exclusive_concurrent(), 0) << "two batches of one sequence ran at once";
  // Each sequence's works ran in arrival order.
  std::map<int, int> position;
  int pos = 0;
  for (const auto& b : h.model.batches()) {
    for (int id : b) position[id] = pos++;
  }
  for (int first : {0, 1}) {
    for (int i = first; i + 3 < 12; i += 3) EXPECT_LT(position[i], position[i + 3]) << "sequence order " << i;
  }
  h.answers.ExpectEachOnce(ids);
}

TEST(SchedulerTest, ExclusiveKeyWaitsForItsRunningBatch) {
  // Worker 1 holds s1's first work; worker 2 must not start s1's second work but may
  // run everything else meanwhile.
  Harness h(Options(milliseconds(1), 16384, /*workers=*/2));
  ASSERT_TRUE(h.Enqueue({.id = 0, .exclusive_key = "s1", .block = true}).ok());
  ASSERT_TRUE(h.model.WaitForBatches(1));
  ASSERT_TRUE(h.Enqueue({.id = 1, .exclusive_key = "s1"}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 2, .exclusive_key = "s2"}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 3}).ok());
  ASSERT_TRUE(h.answers.WaitFor(2));  // 2 and 3, on the second worker
  EXPECT_EQ(h.answers.count(2), 1);
  EXPECT_EQ(h.answers.count(3), 1);
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(h.answers.count(1), 0) << "s1's second work ran while its first was running";
  EXPECT_FALSE(h.model.Executed(1));
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(4));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.model.exclusive_concurrent(), 0);
  EXPECT_EQ(h.model.batches().back(), std::vector<int>{1});
  h.answers.ExpectEachOnce({0, 1, 2, 3});
}

TEST(SchedulerTest, ExpiredDeadlineIsAnsweredAndNeverComputed) {
  Harness h(Options(milliseconds(5)));
  h.Plug(100);
  ASSERT_TRUE(h.Enqueue({.id = 0, .deadline = Clock::now() + milliseconds(10)}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .deadline = Clock::now() + std::chrono::seconds(60)}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 2}).ok());
  std::this_thread::sleep_for(milliseconds(40));  // 0's deadline passes while it waits
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(4));
  // Already expired on arrival: dropped too.
  ASSERT_TRUE(h.Enqueue({.id = 3, .deadline = Clock::now() - milliseconds(1)}).ok());
  ASSERT_TRUE(h.answers.WaitFor(5));
  h.scheduler->Shutdown();

  for (int id : {0, 3}) {
    EXPECT_EQ(h.answers.code(id), absl::StatusCode::kDeadlineExceeded) << id;
    EXPECT_TRUE(h.answers.message(id).find("deadline") != std::string::npos) << h.answers.message(id);
    EXPECT_FALSE(h.model.Executed(id)) << "expired request " << id << " reached Execute";
    EXPECT_EQ(h.model.drops()[id], std::vector<absl::StatusCode>{absl::StatusCode::kDeadlineExceeded}) << id;
  }
  EXPECT_EQ(h.answers.code(1), absl::StatusCode::kOk);
  EXPECT_EQ(h.answers.code(2), absl::StatusCode::kOk);
  EXPECT_EQ(h.model.drops().size(), 2u);
  h.answers.ExpectEachOnce({100, 0, 1, 2, 3});
}

// Triton's queue policy: default_timeout_microseconds, and a request's own timeout
// where allow_timeout_override.
TEST(SchedulerTest, QueueTimeoutAnswersAndNeverComputes) {
  for (bool allow_override : {true, false}) {
    SchedulerOptions o = Options(milliseconds(0));
    o.queue_timeout = milliseconds(10);
    o.allow_timeout_override = allow_override;
    Harness h(o);
    h.Plug(100);
    ASSERT_TRUE(h.Enqueue({.id = 0}).ok());
    ASSERT_TRUE(h.Enqueue({.id = 1, .timeout = std::chrono::seconds(60)}).ok());
    std::this_thread::sleep_for(milliseconds(40));  // the default timeout passes while they wait
    h.model.gate.Open();
    ASSERT_TRUE(h.answers.WaitFor(3));
    h.scheduler->Shutdown();

    EXPECT_EQ(h.answers.code(0), absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(h.answers.message(0).find("queue timeout 10000 us") != std::string::npos) << h.answers.message(0);
    EXPECT_FALSE(h.model.Executed(0));
    EXPECT_EQ(h.answers.code(1), allow_override ? absl::StatusCode::kOk : absl::StatusCode::kDeadlineExceeded)
        << "allow_timeout_override " << allow_override;
    EXPECT_EQ(h.model.Executed(1), allow_override);
    h.answers.ExpectEachOnce({100, 0, 1});
  }
}

// Triton's priority levels: 1 first; 0 and out-of-range priorities take the default
// level; a sequence's requests keep their order whatever their levels.
TEST(SchedulerTest, PriorityLevelsOrderTheQueue) {
  SchedulerOptions o = Options(milliseconds(0));
  o.priority_levels = 3;
  o.default_priority = 2;
  Harness h(o);
  h.Plug(100);
  ASSERT_TRUE(h.Enqueue({.id = 0, .batch_key = "a", .priority = 3}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .batch_key = "b", .priority = 0}).ok());   // default: 2
  ASSERT_TRUE(h.Enqueue({.id = 2, .batch_key = "c", .priority = 1}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 3, .batch_key = "d", .priority = 9}).ok());   // out of range: 2
  ASSERT_TRUE(h.Enqueue({.id = 4, .batch_key = "e", .exclusive_key = "s", .priority = 3}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 5, .batch_key = "f", .exclusive_key = "s", .priority = 1}).ok());
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(7));
  h.scheduler->Shutdown();
  std::vector<int> order;
  for (const auto& b : h.model.batches()) order.insert(order.end(), b.begin(), b.end());
  // 5 may not pass 4 (same sequence), so it waits behind 4 at level 3 in arrival order.
  EXPECT_EQ(order, (std::vector<int>{100, 2, 1, 3, 0, 4, 5}));
  h.answers.ExpectEachOnce({100, 0, 1, 2, 3, 4, 5});
}

// Triton's timeout_action DELAY: a request whose queue timeout passed is not dropped; it
// runs once nothing else can.
TEST(SchedulerTest, DelayedRequestsRunAfterTheOthers) {
  SchedulerOptions o = Options(milliseconds(0));
  o.queue_timeout = milliseconds(10);
  o.delay_on_timeout = true;
  o.allow_timeout_override = true;  // 2 and 3 below carry a long timeout of their own
  Harness h(o);
  h.Plug(100);
  ASSERT_TRUE(h.Enqueue({.id = 0, .batch_key = "a"}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .batch_key = "b"}).ok());
  std::this_thread::sleep_for(milliseconds(40));  // 0 and 1 pass their timeout
  ASSERT_TRUE(h.Enqueue({.id = 2, .batch_key = "c", .timeout = std::chrono::seconds(60)}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 3, .batch_key = "c", .timeout = std::chrono::seconds(60)}).ok());
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(5));
  h.scheduler->Shutdown();
  std::vector<int> order;
  for (const auto& b : h.model.batches()) order.insert(order.end(), b.begin(), b.end());
  EXPECT_EQ(order, (std::vector<int>{100, 2, 3, 0, 1}));
  h.answers.ExpectEachOnce({100, 0, 1, 2, 3});
}

// Triton's priority_queue_policy: a level's own queue length and timeout.
TEST(SchedulerTest, PriorityLevelHasItsOwnQueuePolicy) {
  SchedulerOptions o = Options(milliseconds(0));
  o.priority_levels = 2;
  o.default_priority = 2;
  o.level_policies[1] = {.max_queue_size = 2, .queue_timeout = milliseconds(10)};
  Harness h(o);
  h.Plug(100);
  ASSERT_TRUE(h.Enqueue({.id = 0, .batch_key = "a", .priority = 1}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .batch_key = "a", .priority = 1}).ok());
  absl::Status full = h.Enqueue({.id = 2, .batch_key = "a", .priority = 1});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(full, "priority level 1")) << full;
  ASSERT_TRUE(h.Enqueue({.id = 3, .batch_key = "b", .priority = 2}).ok());  // its level has room
  std::this_thread::sleep_for(milliseconds(40));  // level 1's timeout passes; level 2 has none
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(4));
  // Level 1 has room again once its requests left the queue.
  ASSERT_TRUE(h.Enqueue({.id = 4, .batch_key = "a", .priority = 1}).ok());
  ASSERT_TRUE(h.answers.WaitFor(5));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.answers.code(0), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h.answers.code(1), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(h.answers.code(3), absl::StatusCode::kOk);
  EXPECT_EQ(h.answers.code(4), absl::StatusCode::kOk);
  h.answers.ExpectEachOnce({100, 0, 1, 3, 4});
}

// Triton's preserve_ordering: with two workers a short batch finishes while an earlier
// request still computes, and its answer waits for the earlier one's; drops wait too.
TEST(SchedulerTest, PreserveOrderingAnswersInAdmissionOrder) {
  for (bool preserve : {true, false}) {
    SchedulerOptions o = Options(milliseconds(0), 16384, /*workers=*/2);
    o.preserve_ordering = preserve;
    Harness h(o);
    h.Plug(100);                                  // holds one worker
    ASSERT_TRUE(h.Enqueue({.id = 1, .batch_key = "b"}).ok());
    ASSERT_TRUE(h.model.WaitForBatches(2));
    ASSERT_TRUE(h.Enqueue({.id = 2, .batch_key = "b", .deadline = Clock::now() - milliseconds(1)}).ok());
    ASSERT_TRUE(h.Enqueue({.id = 3, .batch_key = "c"}).ok());
    ASSERT_TRUE(h.model.WaitForBatches(3));
    std::this_thread::sleep_for(milliseconds(20));  // 1 and 3 are done computing, 2 is dropped
    EXPECT_EQ(h.answers.count(1), preserve ? 0 : 1) << "preserve_ordering " << preserve;
    h.model.gate.Open();
    ASSERT_TRUE(h.answers.WaitFor(4));
    h.scheduler->Shutdown();
    if (preserve) EXPECT_EQ(h.answers.order(), (std::vector<int>{100, 1, 2, 3}));
    else EXPECT_EQ(h.answers.order().back(), 100);
    EXPECT_EQ(h.answers.code(2), absl::StatusCode::kDeadlineExceeded);
    h.answers.ExpectEachOnce({100, 1, 2, 3});
  }
}

TEST(SchedulerTest, CancelledRequestIsDroppedBeforeCompute) {
  Harness h(Options(milliseconds(5)));
  h.Plug(100);
  std::atomic<bool> cancelled{false};
  ASSERT_TRUE(h.Enqueue({.id = 0, .cancelled = [&] { return cancelled.load(); }}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1, .cancelled = [] { return false; }}).ok());
  cancelled = true;  // the client goes away while the request waits
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(3));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.answers.code(0), absl::StatusCode::kCancelled);
  EXPECT_FALSE(h.model.Executed(0));
  EXPECT_EQ(h.model.drops()[0], std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
  EXPECT_EQ(h.answers.code(1), absl::StatusCode::kOk);
  EXPECT_EQ(h.model.batches(), (std::vector<std::vector<int>>{{100}, {1}}));
  h.answers.ExpectEachOnce({100, 0, 1});
}

TEST(SchedulerTest, FullQueueRejectsAtOnce) {
  Harness h(Options(milliseconds(5), 16384, 1, /*queue=*/2));
  h.Plug(100);  // executing, so no longer queued
  ASSERT_TRUE(h.Enqueue({.id = 0}).ok());
  ASSERT_TRUE(h.Enqueue({.id = 1}).ok());
  EXPECT_EQ(h.scheduler->depth(), 2);
  absl::Status s = h.Enqueue({.id = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Contains(s, "max_queue_size")) << s;
  EXPECT_TRUE(Contains(s, "2")) << s;
  EXPECT_EQ(h.model.drops()[2], std::vector<absl::StatusCode>{absl::StatusCode::kResourceExhausted});
  EXPECT_DOUBLE_EQ(h.metrics.ForModel("fake").queue_depth->Value(), 2.0);
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(3));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.answers.count(2), 0) << "done must not be called for a rejected request";
  EXPECT_FALSE(h.model.Executed(2));
  h.answers.ExpectEachOnce({100, 0, 1});
}

TEST(SchedulerTest, ShutdownDrainsTheQueue) {
  // A long delay: nothing would run for 10 s, but Shutdown runs everything queued
  // at once, including the batch in flight, and answers each request once.
  Harness h(Options(milliseconds(10000), /*budget=*/8, /*workers=*/2));
  ASSERT_TRUE(h.Enqueue({.id = 100, .tokens = 8, .block = true}).ok());  // full budget: runs at once
  ASSERT_TRUE(h.model.WaitForBatches(1));
  std::vector<int> ids = {100};
  for (int i = 0; i < 20; ++i) {
    Req r{.id = i, .tokens = 3, .batch_key = i % 2 ? "x" : "y"};
    if (i % 5 == 0) r.exclusive_key = "seq";
    ASSERT_TRUE(h.Enqueue(r).ok());
    ids.push_back(i);
  }
  const auto t0 = Clock::now();
  std::thread stopper([&] { h.scheduler->Shutdown(); });
  std::this_thread::sleep_for(milliseconds(50));
  h.model.gate.Open();
  stopper.join();
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 5000)
      << "Shutdown waited for max_queue_delay";
  EXPECT_EQ(h.scheduler->depth(), 0);
  for (int id : ids) EXPECT_EQ(h.answers.code(id), absl::StatusCode::kOk) << id;
  int executed = 0;
  for (const auto& b : h.model.batches()) executed += int(b.size());
  EXPECT_EQ(executed, int(ids.size())) << "each request executed exactly once";
  EXPECT_EQ(h.model.exclusive_shared_batch(), 0);
  EXPECT_EQ(h.model.mixed_keys(), 0);
  h.answers.ExpectEachOnce(ids);

  absl::Status late = h.Enqueue({.id = 500});
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_EQ(h.model.drops()[500], std::vector<absl::StatusCode>{absl::StatusCode::kUnavailable});
  EXPECT_EQ(h.answers.count(500), 0) << "done must not be called for a rejected request";
  h.scheduler->Shutdown();  // idempotent
}

// With responders, a batch's answers beyond its first four are sent from their threads: each
// request is answered once, the responders carry answers of every batch, and Shutdown returns
// only once the last answer is sent.
TEST(SchedulerTest, RespondersSendTheAnswersOfLargeBatches) {
  ResponderPool responders(2);
  Harness h(Options(milliseconds(0), 16384, /*workers=*/1), &responders);
  std::mutex mu;
  std::set<std::thread::id> senders;
  h.Plug(1000);
  std::vector<int> ids = {1000};
  for (int id = 0; id < 100; ++id) {
    auto w = std::make_unique<FakeWork>();
    w->id = id;
    auto p = std::make_unique<Pending>();
    p->work = std::move(w);
    p->done = [&, id](Pending& p, const absl::Status& s) {
      {
        std::lock_guard<std::mutex> l(mu);
        senders.insert(std::this_thread::get_id());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow write
      h.answers.Record(id, s, p);
    };
    ASSERT_TRUE(h.scheduler->Enqueue(std::move(p)).ok());
    ids.push_back(id);
  }
  h.model.gate.Open();
  ASSERT_TRUE(h.model.WaitForBatches(2));
  h.scheduler->Shutdown();  // answers are still being sent: it must wait for them
  h.answers.ExpectEachOnce(ids);
  EXPECT_EQ(h.model.batches()[1].size(), 100u);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_GE(senders.size(), 3u) << "the worker and both responders send answers";
}

// A sequence's request answered by a responder keeps the sequence's exclusive key until its
// answer is sent: the sequence's next request runs, and is answered, only after it.
TEST(SchedulerTest, RespondersKeepASequenceInOrder) {
  ResponderPool responders(1);
  Harness h(Options(milliseconds(0), 16384, /*workers=*/1), &responders);
  std::mutex mu;
  std::vector<int> order;
  auto enqueue = [&](int id, const std::string& key, int write_ms) {
    auto w = std::make_unique<FakeWork>();
    w->id = id;
    w->exclusive_key = key;
    auto p = std::make_unique<Pending>();
    p->work = std::move(w);
    p->done = [&, id, write_ms](Pending& p, const absl::Status& s) {
      std::this_thread::sleep_for(milliseconds(write_ms));
      {
        std::lock_guard<std::mutex> l(mu);
        order.push_back(id);
      }
      h.answers.Record(id, s, p);
    };
    return h.scheduler->Enqueue(std::move(p));
  };
  h.Plug(1000);
  // Ten sequences in one batch; the last one's answer goes to the responder and is slow.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(enqueue(i, "seq" + std::to_string(i), i == 9 ? 100 : 0).ok());
  ASSERT_TRUE(enqueue(19, "seq9", 0).ok());  // the next request of sequence 9
  h.model.gate.Open();
  ASSERT_TRUE(h.answers.WaitFor(12));
  h.scheduler->Shutdown();
  std::lock_guard<std::mutex> l(mu);
  const auto first = std::find(order.begin(), order.end(), 9), second = std::find(order.begin(), order.end(), 19);
  ASSERT_TRUE(first != order.end() && second != order.end());
  EXPECT_LT(first - order.begin(), second - order.begin()) << "the sequence's second request was answered first";
  const auto batches = h.model.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2], std::vector<int>{19});
}

// A polling worker (idle_spin) takes what arrives while it polls, answers everything once,
// and neither keeps the other workers from running nor holds up shutdown.
TEST(SchedulerTest, IdleSpinTakesRequestsAndStopsForShutdown) {
  SchedulerOptions o = Options(milliseconds(0), 16384, /*workers=*/2);
  o.idle_spin = std::chrono::microseconds(5000);
  Harness h(o);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(h.Enqueue({.id = i}).ok());
    ASSERT_TRUE(h.answers.WaitFor(i + 1));
  }
  // One worker blocked, the other polling: a request arriving now still runs at once.
  ASSERT_TRUE(h.Enqueue({.id = 100, .batch_key = "plug", .block = true}).ok());
  ASSERT_TRUE(h.model.WaitForBatches(51));
  ASSERT_TRUE(h.Enqueue({.id = 101}).ok());
  const bool ran = h.answers.WaitFor(51);
  h.model.gate.Open();
  EXPECT_TRUE(ran) << "a request waited for the blocked worker while the other polled";
  const auto t0 = Clock::now();
  h.scheduler->Shutdown();
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 1000);
  std::vector<int> ids = Range(0, 50);
  ids.push_back(100);
  ids.push_back(101);
  h.answers.ExpectEachOnce(ids);
}

// Triton's split of a batch's compute: the copy times a backend measured, capped so that the
// three parts add up to the whole even when copies on several threads overlapped.
TEST(ModelStatsTest, ComputeSplitsIntoInputInferOutput) {
  auto c = ModelStats::Compute::Split(1000, 200, 300);
  EXPECT_EQ(c.input_ns, 200u);
  EXPECT_EQ(c.infer_ns, 500u);
  EXPECT_EQ(c.output_ns, 300u);
  c = ModelStats::Compute::Split(1000, 900, 300);  // copies counted on two threads at once
  EXPECT_EQ(c.input_ns, 900u);
  EXPECT_EQ(c.output_ns, 100u);
  EXPECT_EQ(c.infer_ns, 0u);
  ModelStats stats;
  stats.RecordSuccess(5000, 1000, ModelStats::Compute::Split(4000, 1000, 500));
  stats.RecordBatch(1, ModelStats::Compute::Split(4000, 1000, 500));
  inference::ModelStatistics st;
  stats.Fill(&st);
  EXPECT_EQ(st.inference_stats().compute_input().ns(), 1000u);
  EXPECT_EQ(st.inference_stats().compute_infer().ns(), 2500u);
  EXPECT_EQ(st.inference_stats().compute_output().ns(), 500u);
  EXPECT_EQ(st.batch_stats(0).compute_output().ns(), 500u);
}

TEST(SchedulerTest, ShutdownOfAnIdleSchedulerReturns) {
  Harness h(Options(milliseconds(10000), 16384, /*workers=*/3));
  h.scheduler->Shutdown();
  EXPECT_EQ(h.Enqueue({.id = 0}).code(), absl::StatusCode::kUnavailable);
  h.answers.ExpectEachOnce({});
}

}  // namespace
}  // namespace flashq::server
