#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/metrics/http_exposer.h"
#include "server/metrics/metrics.h"

namespace flashq::server {
namespace {

// One HTTP exchange over loopback; returns the whole response ("" on failure).
std::string HttpRequest(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path) {
  return HttpRequest(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the server has closed `fd` (EOF or reset) within `ms`.
bool ClosedByServer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

using Clock = std::chrono::steady_clock;

TEST(MetricsTest, ExposerServesRegistry) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  ServerMetrics::Model& m = metrics.ForModel("attention");
  m.total_seconds->Observe(0.003);
  m.queue_seconds->Observe(0.0001);
  m.batch_requests->Observe(4);
  m.batch_tokens->Observe(300);
  m.inflight->Increment();
  m.kv_blocks_total->Set(512);
  metrics.CountRequest("attention", "OK");
  metrics.CountRequest("attention", "INVALID_ARGUMENT");
  metrics.KernelHistogram("prefill_fp16_d128", 0).Observe(2e-4);
  metrics.BackendGauge("flashq_gpu_memory_used_bytes", "GPU memory in use", {{"gpu", "0"}}).Set(1234);
  EXPECT_EQ(&metrics.ForModel("attention"), &m) << "same series on the second call";

  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  for (int i = 0; i < 3; ++i) {  // several sequential scrapes
    const std::string r = Get(port, "/metrics");
    ASSERT_TRUE(Has(r, "HTTP/1.1 200 OK\r\n")) << r.substr(0, 200);
    EXPECT_TRUE(Has(r, "Content-Type: text/plain; version=0.0.4")) << r.substr(0, 200);
    EXPECT_TRUE(Has(r, "# TYPE flashq_request_duration_seconds histogram"));
    EXPECT_TRUE(Has(r, "flashq_request_duration_seconds_bucket{model=\"attention\",stage=\"total\",le=\"0.0032\"} 1"))
        << r;
    EXPECT_TRUE(Has(r, "flashq_request_duration_seconds_count{model=\"attention\",stage=\"queue\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_request_duration_seconds_count{model=\"attention\",stage=\"compute\"} 0"));
    EXPECT_TRUE(Has(r, "flashq_batch_requests_bucket{model=\"attention\",le=\"4\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_batch_tokens_bucket{model=\"attention\",le=\"512\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_requests_total{code=\"INVALID_ARGUMENT\",model=\"attention\"} 1") ||
                Has(r, "flashq_requests_total{model=\"attention\",code=\"INVALID_ARGUMENT\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_inflight_requests{model=\"attention\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_kv_cache_blocks_total{model=\"attention\"} 512"));
    EXPECT_TRUE(Has(r, "flashq_queue_depth{model=\"attention\"} 0"));
    EXPECT_TRUE(Has(r, "flashq_kernel_seconds_count{gpu=\"0\",kernel=\"prefill_fp16_d128\"} 1"));
    EXPECT_TRUE(Has(r, "flashq_gpu_memory_used_bytes{gpu=\"0\"} 1234"));
    const size_t body = r.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos);
    const std::string len = "Content-Length: " + std::to_string(r.size() - body - 4) + "\r\n";
    EXPECT_TRUE(Has(r, len)) << "Content-Length matches the body";
  }

  const std::string health = Get(port, "/healthz");
  EXPECT_TRUE(Has(health, "HTTP/1.1 200 OK")) << health;
  EXPECT_EQ(health.substr(health.size() - 2), "ok");
  EXPECT_TRUE(Has(Get(port, "/nope"), "HTTP/1.1 404")) << "unknown path";
  EXPECT_TRUE(Has(HttpRequest(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405"));

  // A client that connects and sends nothing must not block shutdown.
  int idle = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  usleep(50 * 1000);
  const auto t0 = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ::close(idle);
}

TEST(MetricsTest, ScrapeAnswersWhileConnectionsStallAtTheCap) {
  auto registry = std::make_shared<prometheus::Registry>();
  MetricsHttpOptions options;
  options.max_connections = 4;
  options.head_timeout = std::chrono::milliseconds(2000);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    idle.push_back(Connect(port));
    ASSERT_GE(idle.back(), 0);
  }
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // never finished
  ASSERT_EQ(::send(idle.back(), partial.data(), partial.size(), MSG_NOSIGNAL), ssize_t(partial.size()));
  usleep(100 * 1000);
  const auto t0 = Clock::now();
  const std::string r = Get(port, "/healthz");
  EXPECT_TRUE(Has(r, "HTTP/1.1 200 OK")) << r;
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
  // Over the cap, the oldest connections still reading were evicted; at most the cap stay open.
  int closed = 0;
  for (int fd : idle) closed += ClosedByServer(fd, 10);
  EXPECT_GE(closed, 10 - options.max_connections);
  EXPECT_TRUE(ClosedByServer(idle[0], 0)) << "the oldest goes first";
  for (int fd : idle) ::close(fd);
}

TEST(MetricsTest, WholeRequestDeadlineClosesATricklingClient) {
  auto registry = std::make_shared<prometheus::Registry>();
  MetricsHttpOptions options;
  options.head_timeout = std::chrono::milliseconds(300);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  // One byte every 50 ms: never idle for long, but the head is never complete.
  const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  const auto t0 = Clock::now();
  bool closed = false;
  for (size_t i = 0; i < head.size() && !closed; ++i) {
    if (::send(fd, &head[i], 1, MSG_NOSIGNAL) != 1) break;
    closed = ClosedByServer(fd, 50);
  }
  closed = closed || ClosedByServer(fd, 500);
  const auto took = Clock::now() - t0;
  EXPECT_TRUE(closed);
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::milliseconds(1000));
  ::close(fd);
}

TEST(MetricsTest, HeadAndOversizedRequests) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  metrics.CountRequest("lin", "OK");
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string head = HttpRequest(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(Has(head, "HTTP/1.1 200 OK")) << head;
  EXPECT_FALSE(Has(head, "Content-Length: 0\r\n")) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "headers only";
  const std::string big = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20 << 10, 'a') + "\r\n\r\n";
  EXPECT_TRUE(Has(HttpRequest(port, big), "HTTP/1.1 431")) << "a head over 16 KiB";
  EXPECT_TRUE(Has(Get(port, "/metrics?x=1"), "flashq_requests_total")) << "query strings are ignored";
}

// {le: cumulative count} of the series whose line starts with `prefix` (e.g.
// `flashq_batch_tokens_bucket{model="m",`), from Prometheus text.
std::map<double, double> Buckets(const std::string& text, const std::string& prefix) {
  std::map<double, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t le = line.find("le=\"", prefix.size());
    const size_t end = line.find('"', le + 4);
    const size_t brace = line.find("} ", end);
    if (le == std::string::npos || end == std::string::npos || brace == std::string::npos) continue;
    const std::string bound = line.substr(le + 4, end - le - 4);
    out[bound == "+Inf" ? HUGE_VAL : std::strtod(bound.c_str(), nullptr)] = std::strtod(line.c_str() + brace + 2, nullptr);
  }
  return out;
}

// Known values land in the right buckets, on the documented ladders: latency 50 us doubling
// up to 26.2 s, requests and tokens powers of two; a value equal to a bound counts in it.
TEST(MetricsTest, KnownValuesLandInTheirBuckets) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  ServerMetrics::Model& m = metrics.ForModel("m");
  const std::vector<double> latencies = {50e-6, 0.00007, 0.003, 0.0032, 0.3, 1.5, 100.0};
  for (double v : latencies) m.total_seconds->Observe(v);
  for (double v : {1.0, 3.0, 4.0, 1000.0}) m.batch_requests->Observe(v);
  for (double v : {300.0, 70000.0}) m.batch_tokens->Observe(v);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string r = Get((*server)->port(), "/metrics");

  std::vector<double> ladder;
  for (double v = 50e-6; v < 30.0; v *= 2) ladder.push_back(v);
  ladder.push_back(HUGE_VAL);
  auto total = Buckets(r, "flashq_request_duration_seconds_bucket{model=\"m\",stage=\"total\",");
  ASSERT_EQ(total.size(), ladder.size()) << r;
  for (double le : ladder) {
    // The text format rounds the bounds: match each to the nearest printed one.
    auto it = total.lower_bound(le * (1 - 1e-9));
    ASSERT_NE(it, total.end()) << "no bucket for le=" << le;
    int expect = 0;
    for (double v : latencies) expect += v <= le;
    EXPECT_EQ(it->second, expect) << "total latency bucket le=" << le;
  }
  EXPECT_TRUE(Has(r, "flashq_request_duration_seconds_count{model=\"m\",stage=\"total\"} 7")) << r;
  EXPECT_TRUE(Has(r, "flashq_request_duration_seconds_count{model=\"m\",stage=\"queue\"} 0")) << r;

  auto reqs = Buckets(r, "flashq_batch_requests_bucket{model=\"m\",");
  EXPECT_EQ(reqs, (std::map<double, double>{{1, 1}, {2, 1}, {4, 3}, {8, 3}, {16, 3}, {32, 3}, {64, 3}, {128, 3},
                                            {256, 3}, {512, 3}, {1024, 4}, {HUGE_VAL, 4}}));
  auto tokens = Buckets(r, "flashq_batch_tokens_bucket{model=\"m\",");
  ASSERT_EQ(tokens.size(), 18u);  // 1 .. 65536 and +Inf
  for (const auto& [le, n] : tokens) EXPECT_EQ(n, (le >= 300) + (le >= 70000)) << "tokens bucket le=" << le;
}

TEST(MetricsTest, BindFailureNamesHostAndPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsHttpServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  auto second = MetricsHttpServer::Start("127.0.0.1", port, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(Has(std::string(second.status().message()), "127.0.0.1:" + std::to_string(port)))
      << second.status();
  auto bad_host = MetricsHttpServer::Start("no-such-host.invalid", 0, registry);
  EXPECT_FALSE(bad_host.ok());
  EXPECT_TRUE(Has(std::string(bad_host.status().message()), "no-such-host.invalid:0")) << bad_host.status();
}

}  // namespace
}  // namespace flashq::server
