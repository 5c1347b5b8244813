// Per-model bounded queue and dynamic batcher.
//
// Work-conserving: an idle worker takes a request at once, so requests wait only while
// every worker is busy. A worker that frees up takes, in arrival order, the queued
// requests that share the oldest's batch key and fit `max_batch_tokens`.
// `max_queue_delay` (Triton's meaning, default 0) may hold the oldest request up to
// that long to grow its batch, unless the budget fills first. Cancelled and expired
// requests are answered and dropped here, before they reach a backend. Requests
// with the same exclusive key (one KV sequence) never share a batch and never run
// at once, so a sequence's requests run in arrival order. A full queue rejects at
// once with RESOURCE_EXHAUSTED. Model::Admit runs as a request joins the queue, under
// the queue's lock, so what it reserves follows queue order. With two or more workers,
// batches of bulk work (Work::bulk, long prefills) occupy at most half of them, so that
// short work never waits behind them for a worker, nor its answers behind theirs. A request still queued
// after its queue timeout (Triton's default_timeout_microseconds, or the request's own
// `timeout` where allow_timeout_override) is answered DEADLINE_EXCEEDED, never run; with
// delay_on_timeout (Triton's DELAY) it stays queued but runs only when nothing else can.
// With priority levels (Triton's priority_levels) a request queues behind every request
// of its level or a higher one (1 is the highest), but never ahead of an earlier request
// with its exclusive key. With preserve_ordering, requests are answered in the order
// they were admitted, whatever order their batches finish in.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/batcher/responder.h"
#include "server/core/model.h"
#include "server/core/model_stats.h"
#include "server/metrics/metrics.h"

namespace flashq::server {

using Clock = std::chrono::steady_clock;

struct SchedulerOptions {
  int64_t max_queue_size = 1024;
  std::chrono::microseconds max_queue_delay{0};
  int64_t max_batch_tokens = 16384;
  int workers = 1;
  // After a batch, one idle worker of the model polls the queue this long before it
  // sleeps, so that a request arriving meanwhile starts without a thread wake-up.
  std::chrono::microseconds idle_spin{0};
  // Queue timeout (Triton's queue policy): 0 is none. With allow_timeout_override a
  // request's own timeout (Pending::timeout) replaces it.
  std::chrono::microseconds queue_timeout{0};
  bool allow_timeout_override = false;
  bool delay_on_timeout = false;  // DELAY: a timed-out request waits behind all others instead
  // Priority levels 1 (first) .. priority_levels; 0: one level. A request whose priority
  // is 0 or above priority_levels takes default_priority (in 1..priority_levels).
  uint64_t priority_levels = 0;
  uint64_t default_priority = 0;
  bool preserve_ordering = false;  // answer in admission order (Triton's preserve_ordering)
  // A priority level's own queue policy (Triton's priority_queue_policy): at most
  // max_queue_size requests queued at that level (0: no limit of its own; max_queue_size
  // above still bounds the whole queue), and its timeout in place of the defaults above.
  struct LevelPolicy {
    int64_t max_queue_size = 0;
    std::chrono::microseconds queue_timeout{0};
    bool allow_timeout_override = false;
    bool delay_on_timeout = false;
  };
  std::map<uint64_t, LevelPolicy> level_policies;
};

struct Pending {
  std::unique_ptr<Work> work;
  Clock::time_point enqueued = Clock::now();
  std::optional<Clock::time_point> deadline;
  std::function<bool()> cancelled;                      // polled before compute; may be empty
  std::optional<std::chrono::microseconds> timeout;     // the request's `timeout` parameter, if any
  std::optional<Clock::time_point> queue_deadline;      // set by Enqueue from the queue timeout
  uint64_t priority = 0;                                // the request's `priority` parameter; 0: default
  uint64_t level = 0;                                   // set by Enqueue: the priority level it queues at
  uint64_t order = 0;                                   // set by Enqueue: admission order
  bool delay_on_timeout = false;                        // set by Enqueue: the queue policy's DELAY
  bool delayed = false;                                 // its DELAY timeout passed: it runs last
  // Called exactly once. OK: work->status and outputs hold the result.
  std::function<void(Pending&, const absl::Status&)> done;
  uint64_t queue_ns = 0, compute_ns = 0;                // filled by the scheduler
};

class Scheduler {
 public:
  // responders: where a batch's answers beyond the first few are sent from (null: the worker
  // answers all of them); it must outlive the scheduler.
  Scheduler(Model& model, SchedulerOptions options, ServerMetrics::Model& metrics, ModelStats& stats,
            ResponderPool* responders = nullptr);
  ~Scheduler();

  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE after Shutdown, or the error of
  // Model::Admit, which runs under the queue's lock. On error the caller keeps ownership
  // of nothing: the work has been dropped (Model::Drop) and `done` has NOT been called.
  absl::Status Enqueue(std::unique_ptr<Pending> p);
  // Stops accepting, runs everything already queued, joins the workers, and returns once
  // every request has been answered.
  void Shutdown();
  int64_t depth() const;

 private:
  void WorkerLoop();
  // Under mu_ (held through `l`): polls for idle_spin when no other worker does.
  void Spin(std::unique_lock<std::mutex>& l);
  // Under mu_: moves the next batch out of the queue, and requests to drop into `dropped`.
  void FormBatch(Clock::time_point now, std::vector<std::unique_ptr<Pending>>* batch,
                 std::vector<std::pair<std::unique_ptr<Pending>, absl::Status>>* dropped);
  bool HasRunnable() const;
  // Under mu_: whether a batch starting with `w` may start now (the bulk limit).
  bool Startable(const Work& w) const;
  // A batch's exclusive keys, released from running_keys_ when the last holder lets go.
  struct HeldKeys {
    explicit HeldKeys(Scheduler& scheduler) : s(scheduler) {}
    ~HeldKeys();
    Scheduler& s;
    std::vector<std::string> keys;
  };
  // Executes the batch and answers every request in it (through Answer, or the responders,
  // which hold `keys` until their answers are sent).
  void Run(std::vector<std::unique_ptr<Pending>>& batch, const std::shared_ptr<HeldKeys>& keys);
  // Calls p->done, at once or, with preserve_ordering, once every request admitted
  // before it has been answered.
  void Answer(std::unique_ptr<Pending> p, const absl::Status& status);

  Model& model_;
  const SchedulerOptions options_;
  ServerMetrics::Model& metrics_;
  ModelStats& stats_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  int64_t queued_tokens_ = 0;
  std::multiset<std::string> running_keys_;   // exclusive keys of batches being executed
  int running_bulk_ = 0;                      // batches of bulk work being executed
  bool stop_ = false;
  bool spinning_ = false;                     // a worker is polling (idle_spin)
  std::atomic<uint64_t> enqueued_{0};         // requests ever queued: what the poller watches
  uint64_t next_order_ = 0;                   // under mu_: the next admitted request's order
  std::map<uint64_t, int64_t> level_depth_;   // under mu_: requests queued per priority level

  std::mutex order_mu_;                       // preserve_ordering: answers waiting for their turn
  std::map<uint64_t, std::pair<std::unique_ptr<Pending>, absl::Status>> ready_;
  uint64_t next_answer_ = 0;
  bool answering_ = false;                    // a thread is answering from ready_

  ResponderPool* const responders_;
  std::mutex posted_mu_;                      // answers handed to responders_ and not yet sent
  std::condition_variable posted_cv_;
  int64_t posted_ = 0;

  std::vector<std::thread> workers_;
};

}  // namespace flashq::server
