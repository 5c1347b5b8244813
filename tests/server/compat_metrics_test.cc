// Metrics for Triton- and vLLM-shaped tools: Triton's per-model names derived from the
// ModelStatistics counters, the GPU gauges in the exact form perf_analyzer's parser accepts,
// flashq_kv_cache_usage_ratio, and collectables served by the /metrics server.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "server/metrics/gpu_metrics.h"
#include "server/metrics/http_exposer.h"
#include "server/metrics/metrics.h"
#include "server/metrics/triton_metrics.h"

namespace flashq::server {
namespace {

std::string Text(const prometheus::Collectable& c) { return prometheus::TextSerializer().Serialize(c.Collect()); }

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void Stats(inference::ModelStatisticsResponse* out, const std::string& name, uint64_t ok, uint64_t failed,
           uint64_t queue_ns, uint64_t compute_ns, uint64_t executions) {
  auto* m = out->add_model_stats();
  m->set_name(name);
  m->set_version("1");
  m->set_inference_count(ok);
  m->set_execution_count(executions);
  auto* s = m->mutable_inference_stats();
  s->mutable_success()->set_count(ok);
  s->mutable_success()->set_ns(ok * 5'000'000);
  s->mutable_fail()->set_count(failed);
  s->mutable_queue()->set_count(ok);
  s->mutable_queue()->set_ns(queue_ns);
  s->mutable_compute_infer()->set_count(ok);
  s->mutable_compute_infer()->set_ns(compute_ns);
  s->mutable_compute_input()->set_count(ok);
  s->mutable_compute_input()->set_ns(compute_ns / 10);
  s->mutable_compute_output()->set_count(ok);
  s->mutable_compute_output()->set_ns(compute_ns / 20);
}

TEST(TritonCompatMetricsTest, NamesLabelsAndValuesFollowModelStatistics) {
  TritonCompatMetrics triton;
  // Before the models are loaded: Triton's families, no series.
  std::string before = Text(triton);
  EXPECT_TRUE(Has(before, "# TYPE nv_inference_request_success counter")) << before;
  EXPECT_FALSE(Has(before, "model=")) << before;

  triton.SetSources(
      [](inference::ModelStatisticsResponse* out) {
        Stats(out, "attention", 7, 2, 3'500'000, 21'000'999, 4);
        Stats(out, "up_proj_bf16", 0, 0, 0, 0, 0);
      },
      [](const std::string& model) { return model == "attention" ? 3.0 : 0.0; });
  const std::string t = Text(triton);
  const std::map<std::string, std::string> want = {
      {"nv_inference_request_success", "7"},       {"nv_inference_request_failure", "2"},
      {"nv_inference_count", "7"},                 {"nv_inference_exec_count", "4"},
      {"nv_inference_request_duration_us", "35000"}, {"nv_inference_queue_duration_us", "3500"},
      {"nv_inference_compute_infer_duration_us", "21000"}, {"nv_inference_pending_request_count", "3"},
      {"nv_inference_compute_input_duration_us", "2100"}, {"nv_inference_compute_output_duration_us", "1050"},
  };
  for (const auto& [name, value] : want) {
    EXPECT_TRUE(Has(t, name + "{model=\"attention\",version=\"1\"} " + value + "\n")) << name << "\n" << t;
    EXPECT_TRUE(Has(t, name + "{model=\"up_proj_bf16\",version=\"1\"} 0\n")) << name << "\n" << t;
  }
  EXPECT_TRUE(Has(t, "# TYPE nv_inference_pending_request_count gauge")) << t;
  EXPECT_TRUE(Has(t, "# TYPE nv_inference_queue_duration_us counter")) << t;

  triton.SetSources({}, {});  // the server is going away
  EXPECT_FALSE(Has(Text(triton), "model=\"attention\""));
}

class FakeGpus : public GpuSampler {
 public:
  explicit FakeGpus(std::vector<GpuSample> s) : samples_(std::move(s)) {}
  std::vector<GpuSample> Sample() override { return samples_; }
  std::vector<GpuSample> samples_;
};

// perf_analyzer (client_backend/triton, TritonClientBackend::ParseAndStoreMetric) finds each GPU
// gauge with this expression: a line of exactly the name, the one label gpu_uuid and a plain
// decimal number (no exponent).
std::map<std::string, double> ParseLikePerfAnalyzer(const std::string& text, const std::string& name) {
  std::map<std::string, double> out;
  const std::regex re("\n" + name + R"(\{gpu_uuid\=\"([^"]+)\"\} (\d+\.?\d*))");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    out[(*it)[1].str()] = std::stod((*it)[2].str());
  }
  return out;
}

TEST(GpuMetricsTest, PerfAnalyzersParserReadsEveryGauge) {
  GpuSample a{"GPU-8c6b2a1e-0000-4d4e-9f00-000000000001", 0.37, 412.5, 700, 9.5e10, 150754820096.0};
  GpuSample b{"GPU-8c6b2a1e-0000-4d4e-9f00-000000000002", 0, 71.25, 700, 536870912, 150754820096.0};
  GpuMetrics gpus(std::make_unique<FakeGpus>(std::vector<GpuSample>{a, b}));
  const std::string t = "\n" + Text(gpus);
  struct Want {
    const char* name;
    double a, b;
  };
  for (const Want& w : {Want{"nv_gpu_utilization", 0.37, 0}, Want{"nv_gpu_power_usage", 412.5, 71.25},
                        Want{"nv_gpu_power_limit", 700, 700}, Want{"nv_gpu_memory_used_bytes", 9.5e10, 536870912},
                        Want{"nv_gpu_memory_total_bytes", 150754820096.0, 150754820096.0}}) {
    auto got = ParseLikePerfAnalyzer(t, w.name);
    ASSERT_EQ(got.size(), 2u) << w.name << "\n" << t;
    EXPECT_DOUBLE_EQ(got[a.uuid], w.a) << w.name << "\n" << t;
    EXPECT_DOUBLE_EQ(got[b.uuid], w.b) << w.name << "\n" << t;
    EXPECT_TRUE(Has(t, std::string("# TYPE ") + w.name + " gauge")) << t;
  }
}

TEST(GpuMetricsTest, NoGpuMeansNoSeries) {
  GpuMetrics none(std::make_unique<FakeGpus>(std::vector<GpuSample>{}));
  EXPECT_EQ(Text(none), "");
  GpuMetrics null_sampler(nullptr);
  EXPECT_EQ(Text(null_sampler), "");
}

TEST(GpuMetricsTest, NvmlSamplerReportsRealGpusOrWhyNot) {
  auto sampler = CreateNvmlSampler();
  if (!sampler.ok()) {
    // CPU-only builds, and hosts without a driver or GPU, say why.
    const auto c = sampler.status().code();
    EXPECT_TRUE(c == absl::StatusCode::kUnimplemented || c == absl::StatusCode::kUnavailable ||
                c == absl::StatusCode::kNotFound)
        << sampler.status();
    EXPECT_TRUE(Has(std::string(sampler.status().message()), "NVML")) << sampler.status();
    return;
  }
  auto gpus = (*sampler)->Sample();
  ASSERT_FALSE(gpus.empty());
  for (const GpuSample& g : gpus) {
    EXPECT_EQ(g.uuid.rfind("GPU-", 0), 0u) << g.uuid;
    EXPECT_GT(g.memory_total_bytes, 0);
    EXPECT_LE(g.memory_used_bytes, g.memory_total_bytes);
    EXPECT_GE(g.utilization, 0);
    EXPECT_LE(g.utilization, 1);
    EXPECT_GT(g.power_watts, 0);
  }
}

TEST(KvCacheUsageRatioTest, OnlyModelsWithAKvCacheHaveTheSeries) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  metrics.ForModel("attention");
  EXPECT_EQ(metrics.ForModel("attention").kv_usage_ratio, nullptr);
  prometheus::Gauge& g = metrics.KvCacheUsageRatio("kv_attention");
  EXPECT_EQ(metrics.ForModel("kv_attention").kv_usage_ratio, &g);
  EXPECT_EQ(&metrics.KvCacheUsageRatio("kv_attention"), &g) << "same series on the second call";
  g.Set(0.25);
  const std::string t = prometheus::TextSerializer().Serialize(registry->Collect());
  EXPECT_TRUE(Has(t, "flashq_kv_cache_usage_ratio{model=\"kv_attention\"} 0.25")) << t;
  EXPECT_FALSE(Has(t, "flashq_kv_cache_usage_ratio{model=\"attention\"}")) << t;
}

std::string Scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

TEST(MetricsHttpCollectablesTest, ServedAfterTheRegistryAndSkippedOnceGone) {
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);
  metrics.ForModel("attention");
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  auto gpus = std::make_shared<GpuMetrics>(std::make_unique<FakeGpus>(
      std::vector<GpuSample>{GpuSample{"GPU-1", 0.5, 100, 700, 1024, 4096}}));
  (*server)->AddCollectable(gpus);
  std::string r = Scrape((*server)->port());
  EXPECT_TRUE(Has(r, "flashq_queue_depth{model=\"attention\"} 0")) << r;
  EXPECT_TRUE(Has(r, "\nnv_gpu_memory_total_bytes{gpu_uuid=\"GPU-1\"} 4096\n")) << r;
  gpus.reset();
  r = Scrape((*server)->port());
  EXPECT_TRUE(Has(r, "HTTP/1.1 200 OK")) << r;
  EXPECT_FALSE(Has(r, "nv_gpu_")) << r;
}

}  // namespace
}  // namespace flashq::server
