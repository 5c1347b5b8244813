// Serves GET/HEAD /metrics (Prometheus text format) from a registry, and /healthz, on its own thread.
//
// Why hand-written rather than a library:
// - prometheus-cpp's Exposer runs on civetweb, whose worker threads get ~100 KB stacks;
//   libcublasLt.so.13 carries a 94 KB static TLS block that every thread's stack must also hold,
//   so in a process that links cuBLASLt civetweb's pthread_create fails with EINVAL. This server
//   runs on one std::thread (default 8 MB stack), so /metrics works in the GPU server too.
// - Kubernetes probes and the HPA's scrapes must get through while other clients misbehave. That
//   takes a deadline on the whole request rather than on each read, a cap on open connections,
//   and eviction of the oldest connection still sending its request when the cap is reached.
//   libmicrohttpd's connection timeout counts inactivity, so a slowloris client that trickles a
//   byte now and then keeps its slot for as long as it likes.
//
// One poll() loop over non-blocking sockets serves every connection at once: one request each,
// answered with "Connection: close". A request head must arrive within `head_timeout` of accept
// and its response be written within `write_timeout`, or the connection is closed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include <prometheus/collectable.h>
#include <prometheus/registry.h>

namespace flashq::server {

struct MetricsHttpOptions {
  int max_connections = 128;  // at the cap, a new connection evicts the oldest one still reading
  std::chrono::milliseconds head_timeout{2000};
  std::chrono::milliseconds write_timeout{5000};
  size_t max_request_bytes = 16 << 10;  // a longer head gets 431
};

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one; see port()). Answers GET/HEAD /metrics and /healthz,
  // 404 for other paths, 405 for other methods.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                   std::shared_ptr<prometheus::Registry> registry,
                                                                   const MetricsHttpOptions& options = {});
  ~MetricsHttpServer();  // stops the thread and closes every socket
  int port() const { return port_; }
  // Metrics computed at scrape time (derived from other state, or sampled from hardware), served
  // after the registry's. Held weakly: one that is gone is skipped.
  void AddCollectable(std::weak_ptr<prometheus::Collectable> collectable);

 private:
  MetricsHttpServer() = default;
  void Loop();
  std::string Answer(const std::string& head) const;
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex collectables_mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
  MetricsHttpOptions options_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace flashq::server
