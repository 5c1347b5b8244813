// Runs one load point (a concurrency, or a request rate) against a Transport and
// measures it in windows until the stability rule holds or the time cap is hit.
//
// Closed loop: `concurrency` requests are always outstanding; each completion sends
// the next one. Latency is completion - send.
// Open loop: a sender thread follows an ArrivalSchedule; latency is completion -
// *intended* send time, so client stalls and server backlog both count. For kv
// sessions the schedule is one of new sessions: each session's later requests go
// out as soon as the previous one completes (timed from that moment).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "client/bench/histogram.h"
#include "client/bench/schedule.h"
#include "client/bench/stability.h"
#include "client/bench/workload.h"

namespace flashq::bench {

// Sends one request; `done(code)` runs exactly once, on any thread, with the gRPC
// status code (0 = OK) or one of the client-side codes below.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void Send(const Work& work, std::function<void(int code)> done) = 0;
};

// Failures found on the client side, outside gRPC's codes 0-16: a response that fails
// the output check, and a request that could not be sent (no shared-memory slot could
// hold it, or writing it there failed).
constexpr int kCodeBadOutput = 100;
constexpr int kCodeClientError = 101;

// Cumulative server-side counters (Triton's ModelStatistics), summed over endpoints.
struct ServerCounters {
  bool valid = false;
  uint64_t success_count = 0, success_ns = 0, fail_count = 0;
  uint64_t queue_count = 0, queue_ns = 0;
  uint64_t compute_input_ns = 0, compute_infer_count = 0, compute_infer_ns = 0, compute_output_ns = 0;
  uint64_t inference_count = 0, execution_count = 0;
  ServerCounters Minus(const ServerCounters& earlier) const;
  void Add(const ServerCounters& o);
  double queue_us() const { return queue_count ? double(queue_ns) / queue_count / 1e3 : 0; }
  double compute_us() const {
    return compute_infer_count ? double(compute_input_ns + compute_infer_ns + compute_output_ns) / compute_infer_count / 1e3 : 0;
  }
  double server_us() const { return success_count ? double(success_ns) / success_count / 1e3 : 0; }
  double avg_batch() const { return execution_count ? double(inference_count) / execution_count : 0; }
};

class ServerStatsSource {
 public:
  virtual ~ServerStatsSource() = default;
  virtual ServerCounters Snapshot() = 0;
};

struct LoadPoint {
  enum class Mode { kClosed, kOpen };
  Mode mode = Mode::kClosed;
  int concurrency = 1;
  double rate = 0;  // open loop: requests/s (kv_attention: new sessions/s)
  bool rate_is_sessions = false;
  Arrival arrival = Arrival::kConstant;
  std::string Label() const;
};

struct MeasureOptions {
  double window_s = 2.0;
  double stability_pct = 10.0;
  int stable_windows = 3;
  double stability_percentile = 0;  // 0: the stability rule compares mean latency, else this percentile
  double max_time_s = 20.0;  // per load point, after warm-up
  double warmup_s = 1.0;
  int64_t min_requests_per_window = 5;  // a window stretches (up to 4x) until it holds this many
  int max_outstanding = 4096;           // open loop: the sender waits beyond this (the wait counts)
  uint64_t seed = 1;
};

// What one window (or several merged windows) measured.
struct Measurement {
  Measurement();
  double seconds = 0;
  int64_t ok = 0;
  int64_t units = 0;
  std::map<int, int64_t> errors;  // gRPC code -> count
  Histogram latency;              // successful requests only
  std::vector<Histogram> by_tag;  // Workload::tags()
  Histogram send_lag;             // open loop: actual - intended send time
  ServerCounters server;          // delta over the window(s)
  void Merge(const Measurement& o);
  int64_t error_count() const;
  double rps() const { return seconds > 0 ? double(ok) / seconds : 0; }
  double units_per_s() const { return seconds > 0 ? double(units) / seconds : 0; }
};

struct ProgressInfo {
  bool warmup = false;
  double elapsed_s = 0, max_s = 0;
  int windows = 0;
  double last_rps = 0, last_p50_ms = 0;
  int64_t in_flight = 0, errors = 0;
};

struct PointResult {
  LoadPoint load;
  bool stable = false;
  bool interrupted = false;
  int windows = 0;           // windows measured
  int windows_merged = 0;    // windows in `m`
  double elapsed_s = 0;      // measuring time, warm-up excluded
  int64_t sent = 0;
  int64_t warmup_ok = 0, warmup_errors = 0;  // completions thrown away with the warm-up
  Measurement m;
  std::vector<WindowSummary> window_summaries;
};

PointResult RunPoint(Workload& workload, Transport& transport, const LoadPoint& load, const MeasureOptions& opts,
                     ServerStatsSource* stats, const std::atomic<bool>* interrupt,
                     const std::function<void(const ProgressInfo&)>& progress);

}  // namespace flashq::bench
