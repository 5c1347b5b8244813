// A deliberately small HTTP/1.1 server: one thread, one poll() loop over non-blocking sockets,
// one request per connection and "Connection: close" after it. See http_exposer.h for why it is
// not a library and what the deadlines and the connection cap are for.
#include "server/metrics/http_exposer.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

using Clock = std::chrono::steady_clock;

// After EMFILE/ENFILE with nothing to evict, stop accepting for this long instead of spinning
// on a listening socket that stays readable.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// After its answer, a connection is drained of unread input for at most this long.
constexpr auto kDrainTime = std::chrono::milliseconds(500);

std::string Response(int code, const char* reason, const std::string& content_type, const std::string& body,
                     bool head_only) {
  std::string r = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                               "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head_only) r += body;
  return r;
}

bool HeadComplete(const std::string& in) {
  return in.find("\r\n\r\n") != std::string::npos || in.find("\n\n") != std::string::npos;
}

struct Connection {
  enum State { kReading, kWriting, kDraining };
  int fd = -1;
  State state = kReading;
  Clock::time_point deadline;  // of the current state
  std::string in, out;
  size_t sent = 0;
};

void Close(Connection& c) {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

// Reads what is there into c.in, up to `limit`. False: close the connection (EOF, error).
bool ReadSome(Connection& c, size_t limit) {
  char buf[4096];
  while (c.in.size() < limit) {
    ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, limit - c.in.size()), 0);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      if (HeadComplete(c.in)) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

// Writes what the socket takes. False: close the connection (error).
bool WriteSome(Connection& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

// Discards what the client still sends, 64 KB a turn at most. False: close the connection
// (EOF, error).
bool Drain(Connection& c) {
  char buf[4096];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    const MetricsHttpOptions& options) {
  const std::string where = absl::StrCat(host, ":", port);
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("metrics: bad port in ", where));
  if (options.max_connections < 1 || options.head_timeout.count() <= 0 || options.write_timeout.count() <= 0 ||
      options.max_request_bytes < 16) {
    return absl::InvalidArgumentError("metrics: connection cap, timeouts and request size must be positive");
  }
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
  server->options_ = options;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
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
  for (int* fd : {&listen_fd_, &wake_fd_[0], &wake_fd_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

std::string MetricsHttpServer::Answer(const std::string& in) const {
  if (!HeadComplete(in)) {
    return Response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false);
  }
  // Request line: METHOD SP TARGET SP VERSION
  const std::string line = in.substr(0, in.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  const std::string method = line.substr(0, sp1);
  std::string target = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) return Response(405, "Method Not Allowed", "text/plain", "only GET\n", false);
  if (target == "/metrics") {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    {
      std::lock_guard<std::mutex> l(collectables_mu_);
      for (const auto& weak : collectables_) {
        if (auto c = weak.lock()) {
          for (auto& f : c->Collect()) families.push_back(std::move(f));
        }
      }
    }
    std::string body = prometheus::TextSerializer().Serialize(families);
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, head);
  }
  if (target == "/healthz") return Response(200, "OK", "text/plain", "ok", head);
  return Response(404, "Not Found", "text/plain", "not found; try /metrics\n", head);
}

void MetricsHttpServer::AddCollectable(std::weak_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> l(collectables_mu_);
  collectables_.push_back(std::move(collectable));
}

void MetricsHttpServer::Loop() {
  std::vector<Connection> conns;  // in accept order: the front is the oldest
  std::vector<pollfd> fds;
  Clock::time_point accept_paused_until{};
  const size_t cap = size_t(options_.max_connections);
  const size_t accepts_per_turn = std::max<size_t>(1, cap / 2);  // a fresh probe is read before it can be evicted

  // Sends what it can; once all is sent, half-closes and drains: closing a socket with unread
  // input (an oversized head, pipelined bytes) resets it, and the client may lose the answer.
  auto write = [&](Connection& c) {
    if (!WriteSome(c)) return Close(c);
    if (c.sent < c.out.size()) return;
    ::shutdown(c.fd, SHUT_WR);
    c.state = Connection::kDraining;
    c.deadline = std::min(c.deadline, Clock::now() + kDrainTime);
    c.out.clear();
  };
  auto respond = [&](Connection& c) {
    c.out = Answer(c.in);
    c.in.clear();
    c.state = Connection::kWriting;
    c.deadline = Clock::now() + options_.write_timeout;
    write(c);
  };
  // Makes room for one more connection. A scrape or probe sends its head at once, so the oldest
  // connection still reading goes first, then one that has its answer, then the oldest writer.
  auto evict_one = [&]() -> bool {
    for (Connection::State state : {Connection::kReading, Connection::kDraining, Connection::kWriting}) {
      auto it = std::find_if(conns.begin(), conns.end(),
                             [state](const Connection& c) { return c.fd >= 0 && c.state == state; });
      if (it == conns.end()) continue;
      Close(*it);
      conns.erase(it);
      return true;
    }
    return false;
  };
  auto erase_closed = [&] {
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Connection& c) { return c.fd < 0; }), conns.end());
  };

  while (!stop_.load()) {
    auto now = Clock::now();
    for (Connection& c : conns) {
      if (now >= c.deadline) Close(c);
    }
    erase_closed();

    const bool accepting = now >= accept_paused_until;
    Clock::time_point wake = Clock::time_point::max();
    for (const Connection& c : conns) wake = std::min(wake, c.deadline);
    if (!accepting) wake = std::min(wake, accept_paused_until);
    int timeout_ms = -1;
    if (wake != Clock::time_point::max()) {
      timeout_ms = int(std::chrono::ceil<std::chrono::milliseconds>(wake - now).count());
      timeout_ms = std::max(timeout_ms, 0);
    }

    fds.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // poll ignores a negative fd
    for (const Connection& c : conns) {
      fds.push_back({c.fd, short(c.state == Connection::kWriting ? POLLOUT : POLLIN), 0});
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0 || stop_.load()) break;

    // Open connections first, then new ones: a probe accepted last turn is answered before
    // an accept can evict it.
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      if (fds[i + 2].revents == 0) continue;
      switch (c.state) {
        case Connection::kReading:
          if (!ReadSome(c, options_.max_request_bytes)) {
            Close(c);
          } else if (HeadComplete(c.in) || c.in.size() >= options_.max_request_bytes) {
            respond(c);
          }
          break;
        case Connection::kWriting:
          write(c);
          break;
        case Connection::kDraining:
          if (!Drain(c)) Close(c);
          break;
      }
    }
    erase_closed();

    if ((fds[1].revents & POLLIN) == 0) continue;
    for (size_t k = 0; k < accepts_per_turn; ++k) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && evict_one()) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until = Clock::now() + kAcceptBackoff;
        }
        break;  // EAGAIN: nothing more waiting
      }
      if (conns.size() >= cap) evict_one();
      Connection c;
      c.fd = fd;
      c.deadline = Clock::now() + options_.head_timeout;
      conns.push_back(std::move(c));
    }
  }
  for (Connection& c : conns) Close(c);
}

}  // namespace flashq::server
