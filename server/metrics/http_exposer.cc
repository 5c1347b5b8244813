// A deliberately small HTTP/1.1 server: one thread, one connection at a time,
// "Connection: close" after each response. Scrapes are a few per second at most,
// so nothing more is needed; see http_exposer.h for why we do not use civetweb.
#include "server/metrics/http_exposer.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

constexpr int kRequestTimeoutMs = 5000;   // a client that sends nothing is dropped after this
constexpr size_t kMaxRequestBytes = 16 << 10;

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

std::string Response(int code, const char* reason, const std::string& content_type, const std::string& body,
                     bool head_only) {
  std::string r = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                               "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head_only) r += body;
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  const std::string where = absl::StrCat(host, ":", port);
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("metrics: bad port in ", where));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0)
    return absl::InvalidArgumentError(absl::StrCat("metrics: cannot resolve ", where, ": ", gai_strerror(gai)));

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->registry_ = std::move(registry);
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      server->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (server->listen_fd_ < 0)
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", where, ": ", last_error));

  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    if (addr.ss_family == AF_INET) server->port_ = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    else if (addr.ss_family == AF_INET6) server->port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  ::fcntl(server->listen_fd_, F_SETFL, ::fcntl(server->listen_fd_, F_GETFL) | O_NONBLOCK);
  if (::pipe2(server->wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0)
    return absl::InternalError(absl::StrCat("metrics: pipe: ", std::strerror(errno)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_.store(true);
  if (wake_fd_[1] >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  CloseFd(&listen_fd_);
  CloseFd(&wake_fd_[0]);
  CloseFd(&wake_fd_[1]);
}

void MetricsHttpServer::Loop() {
  while (!stop_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0 || stop_.load()) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;  // EAGAIN (another poller won), ECONNABORTED, EMFILE: try again later
    timeval send_timeout{kRequestTimeoutMs / 1000, 0};  // a client that stops reading is dropped too
    ::setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);

    // Read the request head; a slow or silent client must not stall shutdown.
    std::string req;
    bool ok = false;
    while (!stop_.load() && req.size() < kMaxRequestBytes) {
      pollfd cf[2] = {{client, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
      int r = ::poll(cf, 2, kRequestTimeoutMs);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || cf[1].revents != 0) break;
      char buf[4096];
      ssize_t got = ::recv(client, buf, sizeof buf, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      req.append(buf, size_t(got));
      if (req.find("\r\n\r\n") != std::string::npos || req.find("\n\n") != std::string::npos) {
        ok = true;
        break;
      }
    }
    if (ok) {
      // Request line: METHOD SP TARGET SP VERSION
      const size_t eol = req.find_first_of("\r\n");
      const std::string line = req.substr(0, eol);
      const size_t sp1 = line.find(' ');
      const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
      std::string method = line.substr(0, sp1);
      std::string target = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
      target = target.substr(0, target.find('?'));
      const bool head = method == "HEAD";
      std::string resp;
      if (method != "GET" && !head) {
        resp = Response(405, "Method Not Allowed", "text/plain", "only GET\n", false);
      } else if (target == "/metrics") {
        std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
        resp = Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, head);
      } else if (target == "/healthz") {
        resp = Response(200, "OK", "text/plain", "ok", head);
      } else {
        resp = Response(404, "Not Found", "text/plain", "not found; try /metrics\n", head);
      }
      SendAll(client, resp);
    } else if (req.size() >= kMaxRequestBytes) {
      SendAll(client, Response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false));
    }
    ::shutdown(client, SHUT_WR);
    ::close(client);
  }
}

}  // namespace flashq::server
