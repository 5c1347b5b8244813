// Threads that send a batch's answers, so that a batch worker is free for the next batch
// while the responses of the last one are written.
//
// Answering a request builds its response and hands it to gRPC, which writes it to the
// socket on the calling thread; each request of a batch waits behind the ones answered
// before it. Under load on a 32-core host the batch workers spent about 60% of their time
// there. Whether threads of their own pay depends on the cores left to them
// (docs/perf/server.md).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashq::server {

class ResponderPool {
 public:
  explicit ResponderPool(int threads);
  // Runs every job posted, then joins the threads.
  ~ResponderPool();
  ResponderPool(const ResponderPool&) = delete;
  ResponderPool& operator=(const ResponderPool&) = delete;

  void Post(std::function<void()> job);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace flashq::server
