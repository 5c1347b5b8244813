// flashq-coldstart: cold-start figures of a server process.
//   - process start -> "flashq-server ready" (and the same minus the time the server
//     reports for loading and uploading weights);
//   - with --warm-connection, one 512-token kv_attention prefill goes first (reported as
//     connection_warmup_ms, not as a probe): it carries 6 MB up and 4 MB down, so the
//     probes run on a connection whose TCP buffers and gRPC read sizes have grown, as any
//     client's connection has after its first large tensor;
//   - latency of the very first request of each model against the steady-state p50
//     of the next requests of the same shape (sequential, one client), and the part
//     of each the server accounts for (ModelStatistics' success duration), so that a
//     slow first request can be told apart from a slow first transfer.
// Writes one JSON object to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>

#include "common/heap.h"
#include "client/bench/spawn.h"
#include "client/lib/client.h"
#include "client/lib/tensor.h"

namespace {

using flashq::DType;
using Clock = std::chrono::steady_clock;
using Shape = std::vector<int64_t>;

std::vector<float> Randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct Probe {
  std::string model;
  std::string name;
  std::function<inference::ModelInferRequest(int i)> make;
};

}  // namespace

int main(int argc, char** argv) {
  flashq::ConfigureHeapForTensors();  // our own first-touch costs stay out of the measured latencies
  flashq::bench::SpawnOptions so;
  so.backend = "auto";
  int steady = 100;
  bool warm_connection = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--server-binary=", 0) == 0) so.binary = a.substr(16);
    else if (a.rfind("--backend=", 0) == 0) so.backend = a.substr(10);
    else if (a.rfind("--server-arg=", 0) == 0) so.extra_args.push_back(a.substr(13));
    else if (a.rfind("--steady=", 0) == 0) steady = std::stoi(a.substr(9));
    else if (a.rfind("--log=", 0) == 0) so.log_path = a.substr(6);
    else if (a == "--warm-connection") warm_connection = true;
    else {
      std::cerr << "usage: flashq-coldstart [--server-binary=PATH] [--backend=auto|cpu|cuda] [--server-arg=ARG]... "
                   "[--steady=N] [--log=PATH] [--warm-connection]\n";
      return 2;
    }
  }
  if (so.log_path.empty()) so.log_path = "/tmp/flashq-coldstart-server.log";
  auto server = flashq::bench::ServerProcess::Start(so);
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  const double ready_s = (*server)->startup_s();
  double upload_s = 0, reported_s = 0;
  {
    std::ifstream log(so.log_path);
    std::stringstream ss;
    ss << log.rdbuf();
    std::smatch m;
    std::string text = ss.str();
    if (std::regex_search(text, m, std::regex(R"(ready in ([0-9.eE+-]+) s \(weights loaded and uploaded in ([0-9.eE+-]+) s\))"))) {
      reported_s = std::stod(m[1]);
      upload_s = std::stod(m[2]);
    }
  }
  auto client = flashq::client::Client::Create({.endpoints = {(*server)->endpoint()}});
  if (!client.ok()) return 1;
  // Open the connection first (as a client's readiness check does), so that the first
  // request's time is the server's, not the TCP and HTTP/2 set-up's.
  bool ready = false;
  (void)(*client)->ServerReady(0, &ready);
  std::mt19937 rng(5);
  const auto x = Randn(4096, rng);
  const auto q = Randn(size_t(512) * 32 * 128, rng), kv = Randn(size_t(512) * 8 * 128, rng);
  std::vector<Probe> probes = {
      {"up_proj_int4", "up_proj_int4 (M=1)",
       [&](int) {
         inference::ModelInferRequest r;
         r.set_model_name("up_proj_int4");
         (void)flashq::client::AddFloatInput(r, "X", DType::kF16, Shape{1, 4096}, x);
         return r;
       }},
      {"attention", "attention (1 x 512 tokens, 32/8 heads, hd 128, causal)",
       [&](int) {
         inference::ModelInferRequest r;
         r.set_model_name("attention");
         (void)flashq::client::AddFloatInput(r, "Q", DType::kF16, Shape{512, 32, 128}, q);
         (void)flashq::client::AddFloatInput(r, "K", DType::kF16, Shape{512, 8, 128}, kv);
         (void)flashq::client::AddFloatInput(r, "V", DType::kF16, Shape{512, 8, 128}, kv);
         (*r.mutable_parameters())["causal"].set_bool_param(true);
         return r;
       }},
      {"kv_attention", "kv_attention (decode step after a 512-token prefill)",
       [&](int i) {
         // Request 0 of each session is the prefill; the probe times the decode steps.
         inference::ModelInferRequest r;
         r.set_model_name("kv_attention");
         const int n = i % 2 == 0 ? 512 : 1;
         (void)flashq::client::AddFloatInput(r, "Q", DType::kF16, Shape{n, 32, 128}, std::span(q).first(size_t(n) * 32 * 128));
         (void)flashq::client::AddFloatInput(r, "K", DType::kF16, Shape{n, 8, 128}, std::span(kv).first(size_t(n) * 8 * 128));
         (void)flashq::client::AddFloatInput(r, "V", DType::kF16, Shape{n, 8, 128}, std::span(kv).first(size_t(n) * 8 * 128));
         flashq::client::SetSequence(r, 1000 + i / 2, i % 2 == 0, i % 2 == 1);
         return r;
       }},
  };
  double warmup_ms = 0;
  if (warm_connection) {
    inference::ModelInferRequest r;
    r.set_model_name("kv_attention");
    (void)flashq::client::AddFloatInput(r, "Q", DType::kF16, Shape{512, 32, 128}, q);
    (void)flashq::client::AddFloatInput(r, "K", DType::kF16, Shape{512, 8, 128}, kv);
    (void)flashq::client::AddFloatInput(r, "V", DType::kF16, Shape{512, 8, 128}, kv);
    flashq::client::SetSequence(r, 999, true, true);
    inference::ModelInferResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = (*client)->Infer(r, &resp);
    warmup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.ok()) std::cerr << "connection warm-up: " << s.error_message() << "\n";
  }
  std::cout << "{\"backend\": \"" << so.backend << "\", \"warm_connection\": " << (warm_connection ? "true" : "false")
            << ", \"connection_warmup_ms\": " << warmup_ms << ", \"ready_s\": " << ready_s << ", \"server_reported_ready_s\": "
            << reported_s << ", \"weight_upload_s\": " << upload_s << ", \"ready_without_upload_s\": "
            << ready_s - upload_s << ", \"probes\": [";
  int rc = 0;
  for (size_t pi = 0; pi < probes.size(); ++pi) {
    const Probe& p = probes[pi];
    const bool kv_probe = p.model == "kv_attention";
    std::vector<double> lat, server_lat;
    double first = -1, first_server = -1;
    auto server_ns = [&] {
      inference::ModelStatisticsResponse st;
      if (!(*client)->ModelStatistics(0, p.model, &st).ok() || st.model_stats_size() == 0) return -1.0;
      return double(st.model_stats(0).inference_stats().success().ns());
    };
    for (int i = 0; i < (kv_probe ? 2 * (steady + 1) : steady + 1); ++i) {
      auto req = p.make(i);
      inference::ModelInferResponse resp;
      const double ns0 = server_ns();
      const auto t0 = Clock::now();
      grpc::Status s = (*client)->Infer(req, &resp);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!s.ok()) {
        std::cerr << p.name << ": " << s.error_message() << "\n";
        rc = 1;
        break;
      }
      if (kv_probe && i % 2 == 0) continue;  // prefill
      const double server_ms = (server_ns() - ns0) * 1e-6;
      if (first < 0) {
        first = ms;
        first_server = server_ms;
      } else {
        lat.push_back(ms);
        server_lat.push_back(server_ms);
      }
    }
    std::sort(lat.begin(), lat.end());
    std::sort(server_lat.begin(), server_lat.end());
    const double p50 = lat.empty() ? 0 : lat[lat.size() / 2];
    const double server_p50 = server_lat.empty() ? 0 : server_lat[server_lat.size() / 2];
    std::cout << (pi ? ", " : "") << "{\"probe\": \"" << p.name << "\", \"first_ms\": " << first
              << ", \"steady_p50_ms\": " << p50 << ", \"ratio\": " << (p50 > 0 ? first / p50 : 0)
              << ", \"first_server_ms\": " << first_server << ", \"steady_server_p50_ms\": " << server_p50
              << ", \"steady_n\": " << lat.size() << "}";
  }
  const std::string exit = (*server)->Stop();
  std::cout << "], \"server_exit\": \"" << exit << "\"}" << std::endl;
  return rc;
}
