#include "server/backends/cpu/thread_pool.h"

namespace flashq::server {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || (generation_ != seen && next_ < n_); });
    if (stop_) return;
    seen = generation_;
    ++active_;
    while (next_ < n_) {
      int i = next_++;
      const auto* fn = fn_;
      l.unlock();
      (*fn)(i);
      l.lock();
    }
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(int n, const std::function<void(int)>& fn) {
  if (n <= 1 || threads_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::unique_lock<std::mutex> l(mu_);
  // One ParallelFor at a time: wait for a previous caller's helpers to finish.
  done_cv_.wait(l, [&] { return active_ == 0 && next_ >= n_; });
  fn_ = &fn;
  next_ = 0;
  n_ = n;
  ++generation_;
  ++active_;
  cv_.notify_all();
  while (next_ < n_) {
    int i = next_++;
    l.unlock();
    fn(i);
    l.lock();
  }
  --active_;
  done_cv_.wait(l, [&] { return active_ == 0; });
  done_cv_.notify_all();
}

}  // namespace flashq::server
