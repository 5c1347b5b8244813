#include "server/batcher/scheduler.h"

#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {
uint64_t Ns(Clock::duration d) { return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()); }
double Seconds(uint64_t ns) { return double(ns) * 1e-9; }
bool IsBulk(const std::vector<std::unique_ptr<Pending>>& batch) {
  for (const auto& p : batch) {
    if (p->work->bulk) return true;
  }
  return false;
}
}  // namespace

Scheduler::Scheduler(Model& model, SchedulerOptions options, ServerMetrics::Model& metrics, ModelStats& stats,
                     ResponderPool* responders)
    : model_(model), options_(options), metrics_(metrics), stats_(stats), responders_(responders) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::Enqueue(std::unique_ptr<Pending> p) {
  absl::Status rejected;
  if (options_.priority_levels > 0) {
    const bool valid = p->priority >= 1 && p->priority <= options_.priority_levels;
    p->level = valid ? p->priority : options_.default_priority;
  }
  const auto own = options_.level_policies.find(p->level);
  const SchedulerOptions::LevelPolicy* level_policy = own == options_.level_policies.end() ? nullptr : &own->second;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) {
      rejected = absl::UnavailableError(absl::StrCat("model '", model_.name(), "' is shutting down"));
    } else if (int64_t(queue_.size()) >= options_.max_queue_size) {
      rejected = absl::ResourceExhaustedError(absl::StrCat("queue of model '", model_.name(), "' is full (",
                                                           options_.max_queue_size, " requests, max_queue_size)"));
    } else if (level_policy && level_policy->max_queue_size > 0 &&
               level_depth_[p->level] >= level_policy->max_queue_size) {
      rejected = absl::ResourceExhaustedError(absl::StrCat(
          "priority level ", p->level, " of model '", model_.name(), "' is full (", level_policy->max_queue_size,
          " requests, priority_queue_policy max_queue_size)"));
    } else if (rejected = model_.Admit(*p->work); rejected.ok()) {
      const auto base = level_policy ? level_policy->queue_timeout : options_.queue_timeout;
      p->delay_on_timeout = level_policy ? level_policy->delay_on_timeout : options_.delay_on_timeout;
      const bool may_override = level_policy ? level_policy->allow_timeout_override : options_.allow_timeout_override;
      const auto timeout = may_override && p->timeout ? *p->timeout : base;
      if (timeout.count() > 0) p->queue_deadline = p->enqueued + timeout;
      p->order = next_order_++;
      queued_tokens_ += p->work->tokens;
      ++level_depth_[p->level];
      auto pos = queue_.end();
      if (options_.priority_levels > 0) {
        // Behind its level and the higher ones; behind its own sequence's earlier requests,
        // which must run first whatever their level.
        const std::string& ex = p->work->exclusive_key;
        while (pos != queue_.begin()) {
          const Pending& prev = **std::prev(pos);
          if (prev.level <= p->level || (!ex.empty() && prev.work->exclusive_key == ex)) break;
          --pos;
        }
      }
      queue_.insert(pos, std::move(p));
      enqueued_.fetch_add(1, std::memory_order_release);
      metrics_.queue_depth->Set(double(queue_.size()));
    }
  }
  if (!rejected.ok()) {
    model_.Drop(*p->work, rejected);
    return rejected;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ && workers_.empty()) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::unique_lock<std::mutex> l(posted_mu_);
  posted_cv_.wait(l, [&] { return posted_ == 0; });
}

int64_t Scheduler::depth() const {
  std::lock_guard<std::mutex> l(mu_);
  return int64_t(queue_.size());
}

bool Scheduler::Startable(const Work& w) const {
  return !w.bulk || options_.workers < 2 || running_bulk_ < options_.workers / 2;
}

bool Scheduler::HasRunnable() const {
  for (const auto& p : queue_) {
    const std::string& ex = p->work->exclusive_key;
    if ((ex.empty() || !running_keys_.count(ex)) && Startable(*p->work)) return true;
  }
  return false;
}

void Scheduler::FormBatch(Clock::time_point now, std::vector<std::unique_ptr<Pending>>* batch,
                          std::vector<std::pair<std::unique_ptr<Pending>, absl::Status>>* dropped) {
  // Delayed requests (a DELAY queue timeout passed) join a batch only when no other
  // request can start one: the second pass.
  for (const bool take_delayed : {false, true}) {
    if (!batch->empty()) break;
    const std::string* key = nullptr;
    int64_t tokens = 0;
    std::set<std::string> held;  // exclusive keys that must wait (order within a sequence)
    for (auto it = queue_.begin(); it != queue_.end();) {
      Pending& p = **it;
      absl::Status drop;
      // Deadline first: gRPC also marks a call whose deadline passed as cancelled.
      if (p.deadline && now >= *p.deadline) {
        drop = absl::DeadlineExceededError(absl::StrCat("request passed its deadline after ",
                                                        Ns(now - p.enqueued) / 1000, " us in the queue of model '",
                                                        model_.name(), "'"));
      } else if (p.queue_deadline && now >= *p.queue_deadline && p.delay_on_timeout) {
        p.delayed = true;
        p.queue_deadline.reset();
      } else if (p.queue_deadline && now >= *p.queue_deadline) {
        drop = absl::DeadlineExceededError(absl::StrCat(
            "request timed out after ", Ns(now - p.enqueued) / 1000, " us in the queue of model '", model_.name(),
            "' (queue timeout ",
            std::chrono::duration_cast<std::chrono::microseconds>(*p.queue_deadline - p.enqueued).count(),
            " us: default_timeout_microseconds or the request's timeout)"));
      } else if (p.cancelled && p.cancelled()) {
        drop = absl::CancelledError("request was cancelled by the client before compute");
      }
      if (!drop.ok()) {
        queued_tokens_ -= p.work->tokens;
        --level_depth_[p.level];
        dropped->emplace_back(std::move(*it), drop);
        it = queue_.erase(it);
        continue;
      }
      const std::string& ex = p.work->exclusive_key;
      const bool blocked = (!ex.empty() && (running_keys_.count(ex) || held.count(ex))) || !Startable(*p.work) ||
                           (p.delayed && !take_delayed);
      const bool fits = !key || (p.work->batch_key == *key && tokens + p.work->tokens <= options_.max_batch_tokens);
      if (blocked || !fits) {
        if (!ex.empty()) held.insert(ex);
        ++it;
        continue;
      }
      key = &p.work->batch_key;
      tokens += p.work->tokens;
      if (!ex.empty()) held.insert(ex);
      --level_depth_[p.level];
      batch->push_back(std::move(*it));
      it = queue_.erase(it);
    }
    queued_tokens_ -= tokens;
  }
  for (const auto& p : *batch) {
    if (!p->work->exclusive_key.empty()) running_keys_.insert(p->work->exclusive_key);
  }
  running_bulk_ += IsBulk(*batch);
  metrics_.queue_depth->Set(double(queue_.size()));
}

void Scheduler::Spin(std::unique_lock<std::mutex>& l) {
  if (options_.idle_spin.count() <= 0 || spinning_ || stop_ || HasRunnable()) return;
  spinning_ = true;
  const uint64_t seen = enqueued_.load(std::memory_order_acquire);
  l.unlock();
  const auto until = Clock::now() + options_.idle_spin;
  while (enqueued_.load(std::memory_order_acquire) == seen && Clock::now() < until) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  l.lock();
  spinning_ = false;
}

void Scheduler::WorkerLoop() {
  // Named so that top, perf and gdb tell the batch workers from gRPC's threads.
  pthread_setname_np(pthread_self(), "flashq-batch");
  for (;;) {
    std::vector<std::unique_ptr<Pending>> batch;
    std::vector<std::pair<std::unique_ptr<Pending>, absl::Status>> dropped;
    {
      std::unique_lock<std::mutex> l(mu_);
      Spin(l);
      cv_.wait(l, [&] { return stop_ || HasRunnable(); });
      if (stop_ && queue_.empty()) return;
      // Hold the batch open until the oldest request has waited max_queue_delay or
      // the budget is full. On shutdown, run what is queued at once.
      while (!stop_ && queued_tokens_ < options_.max_batch_tokens && !queue_.empty()) {
        const auto close = queue_.front()->enqueued + options_.max_queue_delay;
        if (Clock::now() >= close) break;
        cv_.wait_until(l, close);
      }
      if (queue_.empty() || !HasRunnable()) continue;
      FormBatch(Clock::now(), &batch, &dropped);
    }
    // A dropped request of a sequence that also has an earlier request in this batch is
    // answered after the batch runs: dropping it aborts the sequence, which must not
    // happen before the earlier request has used it.
    std::set<std::string> batch_keys;
    for (const auto& p : batch) batch_keys.insert(p->work->exclusive_key);
    auto answer_drops = [&](bool after_run) {
      for (auto& [p, why] : dropped) {
        if (!p) continue;
        const std::string& ex = p->work->exclusive_key;
        if (!after_run && !ex.empty() && batch_keys.count(ex)) continue;
        model_.Drop(*p->work, why);
        Answer(std::move(p), why);
      }
    };
    answer_drops(false);
    // Run answers (and hands over) the batch's requests: what the bookkeeping below
    // needs is taken first. The batch's exclusive keys are released by the last holder:
    // this worker once the drops are answered, or a responder still sending answers.
    auto keys = std::make_shared<HeldKeys>(*this);
    for (const auto& p : batch) {
      if (!p->work->exclusive_key.empty()) keys->keys.push_back(p->work->exclusive_key);
    }
    const bool ran_bulk = IsBulk(batch);
    if (!batch.empty()) Run(batch, keys);
    answer_drops(true);
    keys.reset();
    {
      std::lock_guard<std::mutex> l(mu_);
      running_bulk_ -= ran_bulk;
    }
    cv_.notify_all();
  }
}

Scheduler::HeldKeys::~HeldKeys() {
  if (keys.empty()) return;
  {
    std::lock_guard<std::mutex> l(s.mu_);
    for (const std::string& k : keys) s.running_keys_.erase(s.running_keys_.find(k));
  }
  s.cv_.notify_all();
}

void Scheduler::Run(std::vector<std::unique_ptr<Pending>>& batch, const std::shared_ptr<HeldKeys>& keys) {
  const auto start = Clock::now();
  std::vector<Work*> works;
  int64_t tokens = 0;
  for (auto& p : batch) {
    p->queue_ns = Ns(start - p->enqueued);
    works.push_back(p->work.get());
    tokens += p->work->tokens;
  }
  model_.Execute(works);
  const uint64_t compute_ns = Ns(Clock::now() - start);
  metrics_.batch_requests->Observe(double(batch.size()));
  metrics_.batch_tokens->Observe(double(tokens));
  const Work& first = *batch[0]->work;  // a batch's works carry its copy times alike
  stats_.RecordBatch(batch.size(), ModelStats::Compute::Split(compute_ns, first.input_ns, first.output_ns));
  for (auto& p : batch) {
    p->compute_ns = compute_ns;
    metrics_.queue_seconds->Observe(Seconds(p->queue_ns));
    metrics_.compute_seconds->Observe(Seconds(compute_ns));
  }
  // The worker answers the first kAnswerChunk requests and hands the rest, in chunks, to the
  // responders, which write them in parallel while it takes the next batch. Each chunk holds
  // the batch's exclusive keys until its answers are sent, so that no sequence's next request
  // runs or is answered before them. With preserve_ordering the answers keep their one
  // thread (Answer).
  constexpr size_t kAnswerChunk = 4;
  if (responders_ && !options_.preserve_ordering) {
    for (size_t i = kAnswerChunk; i < batch.size(); i += kAnswerChunk) {
      auto chunk = std::make_shared<std::vector<std::unique_ptr<Pending>>>();
      for (size_t j = i; j < std::min(batch.size(), i + kAnswerChunk); ++j) chunk->push_back(std::move(batch[j]));
      {
        std::lock_guard<std::mutex> l(posted_mu_);
        ++posted_;
      }
      responders_->Post([this, chunk, held = keys]() mutable {
        for (auto& p : *chunk) p->done(*p, absl::OkStatus());
        held.reset();  // before the count below: Shutdown may return, and the scheduler go, once it is 0
        std::lock_guard<std::mutex> l(posted_mu_);
        if (--posted_ == 0) posted_cv_.notify_all();
      });
    }
  }
  for (auto& p : batch) {
    if (p) Answer(std::move(p), absl::OkStatus());
  }
}

void Scheduler::Answer(std::unique_ptr<Pending> p, const absl::Status& status) {
  if (!options_.preserve_ordering) {
    p->done(*p, status);
    return;
  }
  {
    std::lock_guard<std::mutex> l(order_mu_);
    const uint64_t order = p->order;
    ready_.emplace(order, std::make_pair(std::move(p), status));
    if (answering_) return;  // the thread answering now reaches it
    answering_ = true;
  }
  // One thread at a time answers, in admission order, every request whose predecessors
  // have all been answered; `done` runs outside the lock.
  for (;;) {
    std::vector<std::pair<std::unique_ptr<Pending>, absl::Status>> next;
    {
      std::lock_guard<std::mutex> l(order_mu_);
      for (auto it = ready_.begin(); it != ready_.end() && it->first == next_answer_; ++next_answer_) {
        next.push_back(std::move(it->second));
        it = ready_.erase(it);
      }
      if (next.empty()) {
        answering_ = false;
        return;
      }
    }
    for (auto& [q, st] : next) q->done(*q, st);
  }
}

}  // namespace flashq::server
