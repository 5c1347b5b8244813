// The runner against a simulated server (one FIFO worker with a fixed service
// time): closed-loop concurrency is respected, open-loop rates are kept, and
// open-loop latency counts from the intended send time, so an overloaded server
// or a stalled sender cannot hide its delay (coordinated omission).
#include "client/bench/runner.h"
#include "client/lib/tensor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

using namespace std::chrono_literals;

class FixedWorkload : public Workload {
 public:
  const std::string& model() const override { return model_; }
  std::string Describe() const override { return "fake"; }
  Work Next() override {
    Work w;
    w.request = std::make_shared<inference::ModelInferRequest>();
    w.units = 3;
    return w;
  }

 private:
  std::string model_ = "fake";
};

// One worker serving requests in arrival order, `service` each. Optionally the
// first Send() blocks the caller for `stall` (a client-side hiccup).
class SimulatedServer : public Transport {
 public:
  explicit SimulatedServer(std::chrono::microseconds service, std::chrono::milliseconds stall = 0ms)
      : service_(service), stall_(stall), worker_([this] { Loop(); }) {}
  ~SimulatedServer() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void Send(const Work&, std::function<void(int)> done) override {
    if (stall_.count() && !stalled_.exchange(true)) std::this_thread::sleep_for(stall_);
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(done));
    in_flight_++;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    cv_.notify_all();
  }
  int max_in_flight() {
    std::lock_guard<std::mutex> l(mu_);
    return max_in_flight_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return done_ || !q_.empty(); });
      if (q_.empty()) return;
      auto done = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      std::this_thread::sleep_for(service_);
      lk.lock();
      in_flight_--;
      lk.unlock();
      done(0);
      lk.lock();
    }
  }
  std::chrono::microseconds service_;
  std::chrono::milliseconds stall_;
  std::atomic<bool> stalled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(int)>> q_;
  int in_flight_ = 0, max_in_flight_ = 0;
  bool done_ = false;
  std::thread worker_;
};

MeasureOptions Fast() {
  MeasureOptions o;
  o.window_s = 0.3;
  o.warmup_s = 0.1;
  o.max_time_s = 1.5;
  o.stability_pct = 50;
  o.min_requests_per_window = 1;
  return o;
}

TEST(Runner, ClosedLoopKeepsConcurrencyAndMeasuresQueueing) {
  FixedWorkload w;
  SimulatedServer s(2000us);
  LoadPoint lp;
  lp.concurrency = 4;
  PointResult r = RunPoint(w, s, lp, Fast(), nullptr, nullptr, nullptr);
  EXPECT_EQ(s.max_in_flight(), 4);
  ASSERT_GT(r.m.ok, 50);
  EXPECT_EQ(r.m.error_count(), 0);
  EXPECT_EQ(r.m.units, 3 * r.m.ok);
  // One worker, 4 outstanding: each request waits for ~3 others, so ~4 service times.
  // (Bounds one way only: a busy machine makes sleeps longer, never shorter.)
  EXPECT_GT(r.m.latency.Percentile(50), 6'000'000);
  EXPECT_LT(r.m.rps(), 1e6 / 2000.0 * 1.05);
  EXPECT_GE(r.windows, 3);
}

TEST(Runner, OpenLoopKeepsTheRateBelowCapacity) {
  FixedWorkload w;
  SimulatedServer s(200us);
  LoadPoint lp;
  lp.mode = LoadPoint::Mode::kOpen;
  lp.rate = 500;
  lp.arrival = Arrival::kConstant;
  PointResult r = RunPoint(w, s, lp, Fast(), nullptr, nullptr, nullptr);
  EXPECT_NEAR(r.m.rps(), 500, 50);
  EXPECT_LT(r.m.latency.Percentile(50), 50'000'000);  // no backlog at 10% load (generous: shared CI machines)
}

TEST(Runner, OpenLoopLatencyCountsServerBacklog) {
  // 2x overload: 400 req/s offered, 200 req/s served. The backlog grows by about
  // 200 requests per second, so queueing delay reaches hundreds of ms. A tool that
  // timed from the actual send (or slowed its sender) would not see it.
  FixedWorkload w;
  SimulatedServer s(5000us);
  LoadPoint lp;
  lp.mode = LoadPoint::Mode::kOpen;
  lp.rate = 400;
  lp.arrival = Arrival::kPoisson;
  MeasureOptions o = Fast();
  o.max_time_s = 1.0;
  o.stability_pct = 1;  // never stable: the backlog keeps growing
  PointResult r = RunPoint(w, s, lp, o, nullptr, nullptr, nullptr);
  EXPECT_FALSE(r.stable);
  EXPECT_GT(r.m.latency.Percentile(99), 200'000'000);
  EXPECT_LT(r.m.rps(), 220);
}

TEST(Runner, OpenLoopLatencyCountsASenderStall) {
  // The server is fast, but the first Send blocks the sender for 300 ms. Requests
  // that were due during the stall go out late; their latency includes the wait.
  FixedWorkload w;
  SimulatedServer s(100us, 300ms);
  LoadPoint lp;
  lp.mode = LoadPoint::Mode::kOpen;
  lp.rate = 200;
  lp.arrival = Arrival::kConstant;
  MeasureOptions o = Fast();
  o.warmup_s = 0;
  o.window_s = 2.0;
  o.max_time_s = 2.0;
  PointResult r = RunPoint(w, s, lp, o, nullptr, nullptr, nullptr);
  ASSERT_GT(r.m.ok, 300);
  EXPECT_GT(r.m.latency.max(), 250'000'000);               // the request due at t=0 waited ~300 ms
  EXPECT_GT(r.m.latency.Percentile(90), 50'000'000);      // ~60 requests were due during the stall
  EXPECT_LT(r.m.latency.Percentile(50), r.m.latency.max() / 3);  // the rest were (about) on time
  EXPECT_GT(r.m.send_lag.max(), 250'000'000);
}

TEST(Runner, SlowServerStillReportsAResult) {
  // Each request takes longer than the time cap: the cap stretches (up to 3x)
  // until something completes rather than report an empty point.
  FixedWorkload w;
  SimulatedServer s(900000us);
  LoadPoint lp;
  lp.concurrency = 1;
  MeasureOptions o = Fast();
  o.warmup_s = 0;
  o.window_s = 0.2;
  o.max_time_s = 0.6;
  PointResult r = RunPoint(w, s, lp, o, nullptr, nullptr, nullptr);
  EXPECT_GE(r.m.ok, 1);
  EXPECT_FALSE(r.stable);
}

// Counts sequence starts and ends on their way to the simulated server.
class SessionCounter : public Transport {
 public:
  explicit SessionCounter(Transport& inner) : inner_(inner) {}
  void Send(const Work& w, std::function<void(int)> done) override {
    const auto& p = w.request->parameters();
    {
      std::lock_guard<std::mutex> l(mu_);
      if (p.at("sequence_start").bool_param()) starts_.insert(client::SequenceId(*w.request));
      if (p.at("sequence_end").bool_param()) ends_.insert(client::SequenceId(*w.request));
    }
    inner_.Send(w, std::move(done));
  }
  std::set<uint64_t> starts_, ends_;

 private:
  Transport& inner_;
  std::mutex mu_;
};

TEST(Runner, OpenLoopKvRateIsSessionsAndEverySessionEnds) {
  KvWorkloadOptions o;
  o.prefill_len = IntDistribution::Fixed(2);
  o.decode_steps = IntDistribution::Fixed(4);  // 5 requests per session
  auto w = MakeKvWorkload(o);
  SimulatedServer server(300us);
  SessionCounter t(server);
  LoadPoint lp;
  lp.mode = LoadPoint::Mode::kOpen;
  lp.rate = 40;  // sessions/s
  lp.arrival = Arrival::kConstant;
  MeasureOptions mo = Fast();
  mo.max_time_s = 1.5;
  PointResult r = RunPoint(*w, t, lp, mo, nullptr, nullptr, nullptr);
  EXPECT_NEAR(r.m.rps(), 40 * 5, 40);
  EXPECT_NEAR(r.m.by_tag[0].count() / r.m.seconds, 40, 8);  // prefills/s = sessions/s
  EXPECT_GT(w->sessions_completed(), 20);
  // Every session that started was ended, by its own last step or by the drain.
  EXPECT_EQ(t.starts_, t.ends_);
}

// A server whose prefills take `prefill` and decode steps `decode`, each from its
// arrival (no queueing): one timer thread completes them when they are due.
class KvTimedServer : public Transport {
 public:
  KvTimedServer(std::chrono::microseconds prefill, std::chrono::microseconds decode)
      : prefill_(prefill), decode_(decode), timer_([this] { Loop(); }) {}
  ~KvTimedServer() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }
  void Send(const Work& w, std::function<void(int)> done) override {
    const bool start = w.request->parameters().at("sequence_start").bool_param();
    std::lock_guard<std::mutex> l(mu_);
    due_.emplace(std::chrono::steady_clock::now() + (start ? prefill_ : decode_), std::move(done));
    cv_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_ || !due_.empty()) {
      if (due_.empty()) {
        cv_.wait(lk);
        continue;
      }
      auto first = due_.begin();
      if (std::chrono::steady_clock::now() < first->first) {
        cv_.wait_until(lk, first->first);
        continue;
      }
      auto done = std::move(first->second);
      due_.erase(first);
      lk.unlock();
      done(0);
      lk.lock();
    }
  }
  std::chrono::microseconds prefill_, decode_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void(int)>> due_;
  bool stop_ = false;
  std::thread timer_;
};

TEST(Runner, KvPrefillAndDecodeLatenciesAreMeasuredApart) {
  KvWorkloadOptions o;
  o.prefill_len = IntDistribution::Fixed(8);
  o.decode_steps = IntDistribution::Fixed(9);
  auto w = MakeKvWorkload(o);
  KvTimedServer server(20000us, 1000us);
  LoadPoint lp;
  lp.concurrency = 2;
  PointResult r = RunPoint(*w, server, lp, Fast(), nullptr, nullptr, nullptr);
  ASSERT_EQ(r.m.by_tag.size(), 2u);
  const Histogram &prefill = r.m.by_tag[0], &decode = r.m.by_tag[1];
  ASSERT_GT(prefill.count(), 5);
  EXPECT_EQ(prefill.count() + decode.count(), r.m.ok);
  // Nine decode steps per prefill (give or take the sessions cut at the windows' edges).
  EXPECT_NEAR(double(decode.count()) / prefill.count(), 9, 2);
  // Each kind's percentiles are its own: sleeps only run long, never short.
  EXPECT_GE(prefill.Percentile(50), 20'000'000);
  EXPECT_GE(decode.Percentile(50), 1'000'000);
  EXPECT_LT(decode.Percentile(50), 10'000'000);
  EXPECT_LT(r.m.latency.Percentile(50), prefill.Percentile(50));  // the mix is mostly decode
}

TEST(Runner, ClosedLoopKvSessionsEndOnStop) {
  KvWorkloadOptions o;
  o.prefill_len = IntDistribution::Fixed(2);
  o.decode_steps = IntDistribution::Fixed(50);
  auto w = MakeKvWorkload(o);
  SimulatedServer server(200us);
  SessionCounter t(server);
  LoadPoint lp;
  lp.concurrency = 3;
  PointResult r = RunPoint(*w, t, lp, Fast(), nullptr, nullptr, nullptr);
  EXPECT_GT(r.m.ok, 100);
  EXPECT_GE(t.starts_.size(), 3u);
  EXPECT_EQ(t.starts_, t.ends_);
}

TEST(Runner, InterruptStopsPromptly) {
  FixedWorkload w;
  SimulatedServer s(1000us);
  LoadPoint lp;
  lp.concurrency = 2;
  std::atomic<bool> stop{false};
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    stop = true;
  });
  MeasureOptions o = Fast();
  o.max_time_s = 30;
  o.stability_pct = 0.001;
  const auto t0 = std::chrono::steady_clock::now();
  PointResult r = RunPoint(w, s, lp, o, nullptr, &stop, nullptr);
  t.join();
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

}  // namespace
}  // namespace flashq::bench
