// Serves GET /metrics (Prometheus text format) from a registry on its own thread.
//
// Why not prometheus-cpp's Exposer: it runs on civetweb, whose worker threads get
// ~100 KB stacks; libcublasLt.so.13 carries a 94 KB static TLS block that every
// thread's stack must also hold, so in a process that links cuBLASLt civetweb's
// pthread_create fails with EINVAL. This exposer uses std::thread (default 8 MB
// stacks), so /metrics works in the GPU server too.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include <prometheus/registry.h>

namespace flashq::server {

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one; see port()). Also answers GET /healthz.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                   std::shared_ptr<prometheus::Registry> registry);
  ~MetricsHttpServer();  // stops the thread and closes the socket
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void Loop();
  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace flashq::server
