// A fixed pool of threads for the CPU backend's ParallelFor.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashq::server {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  // Runs fn(i) for i in [0, n) on the pool and the calling thread; returns when all are done.
  void ParallelFor(int n, const std::function<void(int)>& fn);
  int size() const { return int(threads_.size()) + 1; }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int next_ = 0, n_ = 0, active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace flashq::server
