#include "client/bench/spawn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flashq::bench {

absl::StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("bind: ", strerror(errno)));
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return int(ntohs(a.sin_port));
}

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(const SpawnOptions& opts) {
  std::string bin = opts.binary.empty() ? ExecutableDir() + "/flashq-server" : opts.binary;
  if (access(bin.c_str(), X_OK) != 0)
    return absl::NotFoundError(absl::StrFormat(
        "--spawn-server: %s not found or not executable (build it: cmake --build build --target flashq-server)", bin));
  std::unique_ptr<ServerProcess> sp(new ServerProcess());
  auto gp = FreePort();
  if (!gp.ok()) return gp.status();
  int mp_v = 0;
  for (int tries = 0; tries < 10; ++tries) {
    auto mp = FreePort();
    if (!mp.ok()) return mp.status();
    if (*mp != *gp) {
      mp_v = *mp;
      break;
    }
  }
  sp->grpc_port_ = *gp;
  sp->metrics_port_ = mp_v;
  sp->host_ = opts.host;

  std::vector<std::string> args = {bin,
                                   absl::StrCat("--grpc-port=", sp->grpc_port_),
                                   absl::StrCat("--metrics-port=", sp->metrics_port_),
                                   "--http-port=0",  // the load runs over gRPC
                                   absl::StrCat("--host=", opts.host),
                                   absl::StrCat("--backend=", opts.backend)};
  for (auto& a : opts.extra_args) args.push_back(a);

  int logfd = -1;
  if (!opts.log_path.empty()) {
    logfd = open(opts.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (logfd < 0) return absl::UnavailableError(absl::StrFormat("cannot write %s: %s", opts.log_path, strerror(errno)));
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));

  const pid_t parent = getpid();
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    dprintf(STDERR_FILENO, "exec %s: %s\n", bin.c_str(), strerror(errno));
    _exit(127);
  }
  close(pipefd[1]);
  sp->pid_ = pid;
  // Reads the server's output to the log until it closes; watches for the ready line.
  ServerProcess* raw = sp.get();
  sp->reader_ = std::thread([raw, rfd = pipefd[0], logfd] {
    std::string pending;
    char buf[4096];
    for (;;) {
      ssize_t n = read(rfd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (logfd >= 0) (void)!write(logfd, buf, size_t(n));
      if (!raw->ready_.load()) {
        pending.append(buf, size_t(n));
        if (pending.find("flashq-server ready") != std::string::npos) raw->ready_ = true;
        if (pending.size() > 65536) pending.erase(0, pending.size() - 64);
      }
    }
    close(rfd);
    if (logfd >= 0) close(logfd);
  });

  const auto deadline = t0 + std::chrono::duration<double>(opts.timeout_s);
  while (!sp->ready_.load()) {
    int status;
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      sp->stopped_ = true;
      sp->reader_.join();
      sp->pid_ = -1;
      return absl::UnavailableError(absl::StrFormat("flashq-server exited during start-up (%s); see %s",
                                                    WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                                                      : absl::StrCat("signal ", WTERMSIG(status)),
                                                    opts.log_path.empty() ? "its output" : opts.log_path));
    }
    if (opts.interrupt && opts.interrupt->load()) {
      sp->Stop(5);
      return absl::CancelledError("interrupted while flashq-server was starting");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      sp->Stop(5);
      return absl::DeadlineExceededError(absl::StrFormat("flashq-server not ready after %.0f s; see %s", opts.timeout_s,
                                                         opts.log_path.empty() ? "its output" : opts.log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  sp->startup_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sp;
}

std::string ServerProcess::endpoint() const {
  const std::string h = host_ == "0.0.0.0" ? "127.0.0.1" : host_;
  return absl::StrCat(h, ":", grpc_port_);
}

std::string ServerProcess::Stop(double grace_s) {
  std::string what = "not running";
  if (!stopped_ && pid_ > 0) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    int status = 0;
    pid_t w = 0;
    while ((w = waitpid(pid_, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (w == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      what = absl::StrFormat("killed with SIGKILL after %.0f s", grace_s);
    } else if (WIFEXITED(status)) {
      what = absl::StrCat("exited with status ", WEXITSTATUS(status));
    } else {
      what = absl::StrCat("ended by signal ", WTERMSIG(status));
    }
    stopped_ = true;
  }
  if (reader_.joinable()) reader_.join();
  return what;
}

ServerProcess::~ServerProcess() { Stop(); }

}  // namespace flashq::bench
