// --spawn-server: starts build/bin/flashq-server on free local ports, waits for
// its "flashq-server ready" line, and stops it with SIGTERM (then SIGKILL after a
// grace period) when flashq-bench is done. The server's output goes to a log file;
// the child also gets SIGTERM if flashq-bench dies first (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::bench {

struct SpawnOptions {
  std::string binary;  // empty: flashq-server next to this executable
  std::string host = "127.0.0.1";
  std::string backend = "auto";
  std::vector<std::string> extra_args;
  std::string log_path;  // server stdout+stderr
  double timeout_s = 300;
  const std::atomic<bool>* interrupt = nullptr;  // set (Ctrl-C): give up waiting and stop the server
};

class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const SpawnOptions& opts);
  ~ServerProcess();
  std::string endpoint() const;
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }
  double startup_s() const { return startup_s_; }
  // SIGTERM, wait up to `grace_s`, then SIGKILL. Returns the exit description.
  std::string Stop(double grace_s = 15);

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  int grpc_port_ = 0, metrics_port_ = 0;
  std::string host_;
  double startup_s_ = 0;
  std::thread reader_;
  std::atomic<bool> ready_{false};
  bool stopped_ = false;
};

// A TCP port that was free a moment ago (bind to port 0, read it back).
absl::StatusOr<int> FreePort();
// Directory of the running executable (from /proc/self/exe).
std::string ExecutableDir();

}  // namespace flashq::bench
