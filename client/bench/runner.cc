#include "client/bench/runner.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"

namespace flashq::bench {

using Clock = std::chrono::steady_clock;

static int64_t Ns(Clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); }

ServerCounters ServerCounters::Minus(const ServerCounters& e) const {
  ServerCounters d;
  d.valid = valid && e.valid;
  auto sub = [](uint64_t a, uint64_t b) { return a >= b ? a - b : 0; };
  d.success_count = sub(success_count, e.success_count);
  d.success_ns = sub(success_ns, e.success_ns);
  d.fail_count = sub(fail_count, e.fail_count);
  d.queue_count = sub(queue_count, e.queue_count);
  d.queue_ns = sub(queue_ns, e.queue_ns);
  d.compute_input_ns = sub(compute_input_ns, e.compute_input_ns);
  d.compute_infer_count = sub(compute_infer_count, e.compute_infer_count);
  d.compute_infer_ns = sub(compute_infer_ns, e.compute_infer_ns);
  d.compute_output_ns = sub(compute_output_ns, e.compute_output_ns);
  d.inference_count = sub(inference_count, e.inference_count);
  d.execution_count = sub(execution_count, e.execution_count);
  return d;
}

void ServerCounters::Add(const ServerCounters& o) {
  valid = valid || o.valid;
  success_count += o.success_count;
  success_ns += o.success_ns;
  fail_count += o.fail_count;
  queue_count += o.queue_count;
  queue_ns += o.queue_ns;
  compute_input_ns += o.compute_input_ns;
  compute_infer_count += o.compute_infer_count;
  compute_infer_ns += o.compute_infer_ns;
  compute_output_ns += o.compute_output_ns;
  inference_count += o.inference_count;
  execution_count += o.execution_count;
}

std::string LoadPoint::Label() const {
  if (mode == Mode::kClosed) return absl::StrFormat("c=%d", concurrency);
  return absl::StrFormat("%s %g%s", arrival == Arrival::kPoisson ? "poisson" : "const", rate,
                         rate_is_sessions ? " sess/s" : "/s");
}

Measurement::Measurement() = default;

void Measurement::Merge(const Measurement& o) {
  seconds += o.seconds;
  ok += o.ok;
  units += o.units;
  for (auto& [code, n] : o.errors) errors[code] += n;
  latency.Merge(o.latency);
  if (by_tag.size() < o.by_tag.size()) by_tag.resize(o.by_tag.size());
  for (size_t i = 0; i < o.by_tag.size(); ++i) by_tag[i].Merge(o.by_tag[i]);
  send_lag.Merge(o.send_lag);
  server.Add(o.server);
}

int64_t Measurement::error_count() const {
  int64_t n = 0;
  for (auto& [code, c] : errors) n += c;
  return n;
}

namespace {

// Everything the completion callbacks touch. Shared so that it outlives them.
struct State {
  Workload* workload;
  Transport* transport;
  size_t ntags;
  bool closed;

  std::mutex mu;  // guards `window` and the counters below
  std::condition_variable cv;
  Measurement window;
  int64_t outstanding = 0;
  int64_t sent = 0;
  // Sends handed to the runner thread (see OnDone): a follow-up, or nullopt for Next().
  // Each holds an `outstanding` slot.
  std::deque<std::optional<Work>> deferred;
  int64_t errors_total = 0;
  std::atomic<bool> stopping{false};
};

thread_local int tl_depth = 0;

void Issue(const std::shared_ptr<State>& st, std::optional<Work> work, Clock::time_point intended, bool has_intended);

void OnDone(const std::shared_ptr<State>& st, const Work& w, Clock::time_point t0, int code) {
  const int64_t lat = Ns(Clock::now() - t0);
  // The next request of the same kv session, if any: sent at once, in closed and open loop.
  std::optional<Work> follow = st->workload->Complete(w, code == 0, !st->stopping.load());
  bool reissue = false;
  {
    std::lock_guard<std::mutex> l(st->mu);
    if (code == 0) {
      st->window.ok++;
      st->window.units += w.units;
      st->window.latency.Record(lat);
      if (size_t(w.tag) < st->window.by_tag.size()) st->window.by_tag[w.tag].Record(lat);
    } else {
      st->window.errors[code]++;
      st->errors_total++;
    }
    reissue = follow.has_value() || (st->closed && !st->stopping.load());
    if (reissue && tl_depth > 4) {  // the transport finished inline: avoid unbounded recursion
      st->deferred.push_back(std::move(follow));
      reissue = false;
    } else if (!reissue) {
      st->outstanding--;
      st->cv.notify_all();
    }
  }
  if (reissue) {
    ++tl_depth;
    Issue(st, std::move(follow), {}, false);  // takes over this call's outstanding slot
    --tl_depth;
  }
}

// Sends `work`, or the workload's next request. The caller has counted it in `outstanding`.
void Issue(const std::shared_ptr<State>& st, std::optional<Work> work, Clock::time_point intended, bool has_intended) {
  Work w = work ? std::move(*work) : st->workload->Next();
  const Clock::time_point now = Clock::now();
  const Clock::time_point t0 = has_intended ? intended : now;
  {
    std::lock_guard<std::mutex> l(st->mu);
    st->sent++;
    if (has_intended) st->window.send_lag.Record(Ns(now - intended));
  }
  Work copy = w;
  st->transport->Send(w, [st, copy = std::move(copy), t0](int code) { OnDone(st, copy, t0, code); });
}

void SleepUntil(State& st, Clock::time_point t) {
  std::unique_lock<std::mutex> lk(st.mu);
  st.cv.wait_until(lk, t, [&] { return st.stopping.load(); });
}

}  // namespace

PointResult RunPoint(Workload& workload, Transport& transport, const LoadPoint& load, const MeasureOptions& opts,
                     ServerStatsSource* stats, const std::atomic<bool>* interrupt,
                     const std::function<void(const ProgressInfo&)>& progress) {
  auto st = std::make_shared<State>();
  st->workload = &workload;
  st->transport = &transport;
  st->ntags = workload.tags().size();
  st->closed = load.mode == LoadPoint::Mode::kClosed;
  st->window.by_tag.resize(st->ntags);

  auto interrupted = [&] { return interrupt && interrupt->load(); };
  auto swap_window = [&] {
    Measurement m;
    m.by_tag.resize(st->ntags);
    std::lock_guard<std::mutex> l(st->mu);
    std::swap(m, st->window);
    return m;
  };

  // ---- start the load
  std::thread sender;
  if (st->closed) {
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->outstanding += load.concurrency;
    }
    for (int i = 0; i < load.concurrency; ++i) Issue(st, std::nullopt, {}, false);
  } else {
    sender = std::thread([st, load, &opts] {
      ArrivalSchedule sched(load.arrival, load.rate, opts.seed);
      const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(1);
      while (!st->stopping.load()) {
        const Clock::time_point intended = t0 + std::chrono::nanoseconds(sched.NextOffsetNs());
        SleepUntil(*st, intended);
        {
          std::unique_lock<std::mutex> lk(st->mu);
          st->cv.wait(lk, [&] { return st->outstanding < opts.max_outstanding || st->stopping.load(); });
          if (st->stopping.load()) break;
          st->outstanding++;
        }
        Issue(st, std::nullopt, intended, true);
      }
    });
  }

  auto run_deferred = [&] {
    std::deque<std::optional<Work>> todo;
    {
      std::lock_guard<std::mutex> l(st->mu);
      todo.swap(st->deferred);
    }
    int64_t dropped = 0;
    for (auto& d : todo) {
      // Follow-ups go out even when stopping (their sessions then close in Drain);
      // new work does not.
      if (!d && st->stopping.load()) ++dropped;
      else Issue(st, std::move(d), {}, false);
    }
    if (dropped) {
      std::lock_guard<std::mutex> l(st->mu);
      st->outstanding -= dropped;  // slots given back; nothing will be sent for them
      st->cv.notify_all();
    }
  };
  auto report = [&](bool warmup, double elapsed, double max_s, const PointResult& r) {
    if (!progress) return;
    ProgressInfo p;
    p.warmup = warmup;
    p.elapsed_s = elapsed;
    p.max_s = max_s;
    p.windows = r.windows;
    if (!r.window_summaries.empty()) p.last_rps = r.window_summaries.back().throughput;
    {
      std::lock_guard<std::mutex> l(st->mu);
      p.in_flight = st->outstanding;
      p.errors = st->errors_total;
      if (st->window.latency.count()) p.last_p50_ms = st->window.latency.Percentile(50) / 1e6;
    }
    progress(p);
  };
  const auto tick = std::chrono::milliseconds(100);

  PointResult r;
  r.load = load;

  // ---- warm-up: measured and thrown away
  const Clock::time_point w0 = Clock::now();
  while (!interrupted() && Clock::now() - w0 < std::chrono::duration<double>(opts.warmup_s)) {
    std::this_thread::sleep_for(tick);
    run_deferred();
    report(true, std::chrono::duration<double>(Clock::now() - w0).count(), opts.warmup_s, r);
  }
  {
    Measurement w = swap_window();
    r.warmup_ok = w.ok;
    r.warmup_errors = w.error_count();
  }
  ServerCounters prev = stats ? stats->Snapshot() : ServerCounters{};

  // ---- measurement windows
  std::vector<Measurement> windows;
  const Clock::time_point m0 = Clock::now();
  Clock::time_point ws = m0;
  while (!interrupted()) {
    std::this_thread::sleep_for(tick);
    run_deferred();
    const Clock::time_point now = Clock::now();
    const double in_window = std::chrono::duration<double>(now - ws).count();
    const double elapsed = std::chrono::duration<double>(now - m0).count();
    int64_t in_this = 0;
    {
      std::lock_guard<std::mutex> l(st->mu);
      in_this = st->window.ok + st->window.error_count();
    }
    report(false, elapsed, opts.max_time_s, r);
    const bool long_enough = in_window >= opts.window_s &&
                             (in_this >= opts.min_requests_per_window || in_window >= 4 * opts.window_s);
    // A point that has not completed a single request yet gets up to 3x the cap:
    // a slow model at high concurrency should still report something.
    bool done_before = false;
    for (const auto& w : windows) done_before |= w.ok + w.error_count() > 0;
    const bool out_of_time = elapsed >= opts.max_time_s * (done_before || in_this > 0 ? 1 : 3);
    if (!long_enough && !out_of_time) continue;
    // A sliver of a window at the cap adds noise: drop it, unless it holds the only completions.
    if (in_window < 0.25 * opts.window_s && done_before) break;
    Measurement m = swap_window();
    m.seconds = in_window;
    if (stats) {
      ServerCounters cur = stats->Snapshot();
      m.server = cur.Minus(prev);
      prev = cur;
    }
    ws = now;
    r.window_summaries.push_back({m.rps(), opts.stability_percentile > 0
                                               ? double(m.latency.Percentile(opts.stability_percentile))
                                               : m.latency.mean()});
    windows.push_back(std::move(m));
    r.windows = int(windows.size());
    if (IsStable(r.window_summaries, opts.stable_windows, opts.stability_pct)) {
      r.stable = true;
      break;
    }
    if (out_of_time) break;
  }
  r.elapsed_s = std::chrono::duration<double>(Clock::now() - m0).count();
  r.interrupted = interrupted();

  // ---- stop: let outstanding calls finish (their deadlines bound the wait)
  {
    std::lock_guard<std::mutex> l(st->mu);
    st->stopping = true;
    st->cv.notify_all();
  }
  if (sender.joinable()) sender.join();
  for (;;) {  // follow-ups may still be handed over while the last calls finish
    run_deferred();
    std::unique_lock<std::mutex> lk(st->mu);
    if (st->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return st->outstanding <= 0 && st->deferred.empty(); })) {
      r.sent = st->sent;
      break;
    }
  }
  // Close sessions that are still open on the server; unmeasured.
  std::vector<Work> drain = workload.Drain();
  if (!drain.empty()) {
    auto left = std::make_shared<std::atomic<int64_t>>(int64_t(drain.size()));
    auto mu = std::make_shared<std::mutex>();
    auto cv = std::make_shared<std::condition_variable>();
    for (const Work& w : drain)
      transport.Send(w, [left, mu, cv](int) {
        std::lock_guard<std::mutex> l(*mu);
        if (--*left == 0) cv->notify_all();
      });
    std::unique_lock<std::mutex> lk(*mu);
    cv->wait(lk, [&] { return left->load() == 0; });
  }

  const int n = std::min<int>(int(windows.size()), std::max(1, opts.stable_windows));
  r.m.by_tag.resize(st->ntags);
  for (size_t i = windows.size() - n; i < windows.size(); ++i) r.m.Merge(windows[i]);
  r.windows_merged = n;
  return r;
}

}  // namespace flashq::bench
