#include "server/metrics/metrics.h"

#include <vector>

namespace flashq::server {
namespace {

// 50 us .. 26 s, doubling: covers a decode step on a GPU and a large prefill on the CPU backend.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 50e-6; v < 30.0; v *= 2) b.push_back(v);
  return b;
}

// Kernel launches are shorter: 5 us .. 21 s.
prometheus::Histogram::BucketBoundaries KernelBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 5e-6; v < 30.0; v *= 2) b.push_back(v);
  return b;
}

prometheus::Histogram::BucketBoundaries PowersOfTwo(double max) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

ServerMetrics::ServerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("flashq_request_duration_seconds")
                   .Help("Request latency by stage: queue (admitted to batch formed), compute (the batch's "
                         "execution), total (admitted to response ready)")
                   .Register(*registry_)),
      batch_requests_(prometheus::BuildHistogram()
                          .Name("flashq_batch_requests")
                          .Help("Requests merged into each executed batch")
                          .Register(*registry_)),
      batch_tokens_(prometheus::BuildHistogram()
                        .Name("flashq_batch_tokens")
                        .Help("Tokens (rows) in each executed batch")
                        .Register(*registry_)),
      requests_(prometheus::BuildCounter()
                    .Name("flashq_requests_total")
                    .Help("Finished requests by model and gRPC status code")
                    .Register(*registry_)),
      inflight_(prometheus::BuildGauge()
                    .Name("flashq_inflight_requests")
                    .Help("Requests admitted and not yet answered")
                    .Register(*registry_)),
      kv_in_use_(prometheus::BuildGauge()
                     .Name("flashq_kv_cache_blocks_in_use")
                     .Help("Paged KV cache blocks held by live sequences")
                     .Register(*registry_)),
      kv_total_(prometheus::BuildGauge()
                    .Name("flashq_kv_cache_blocks_total")
                    .Help("Paged KV cache blocks in the pool")
                    .Register(*registry_)),
      kv_usage_(prometheus::BuildGauge()
                    .Name("flashq_kv_cache_usage_ratio")
                    .Help("Fraction of the paged KV cache's blocks held by sequences, 0-1 (kv_attention models)")
                    .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("flashq_queue_depth")
                       .Help("Requests waiting in the model's queue")
                       .Register(*registry_)),
      kernel_(prometheus::BuildHistogram()
                  .Name("flashq_kernel_seconds")
                  .Help("Time of each kernel (or kernel sequence) per batch, by kernel")
                  .Register(*registry_)) {}

ServerMetrics::Model& ServerMetrics::ForModel(const std::string& model) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  if (it != models_.end()) return it->second;
  static const auto kLatency = LatencyBuckets();
  static const auto kRequests = PowersOfTwo(1024);
  static const auto kTokens = PowersOfTwo(65536);
  Model m;
  m.queue_seconds = &latency_.Add({{"model", model}, {"stage", "queue"}}, kLatency);
  m.compute_seconds = &latency_.Add({{"model", model}, {"stage", "compute"}}, kLatency);
  m.total_seconds = &latency_.Add({{"model", model}, {"stage", "total"}}, kLatency);
  m.batch_requests = &batch_requests_.Add({{"model", model}}, kRequests);
  m.batch_tokens = &batch_tokens_.Add({{"model", model}}, kTokens);
  m.inflight = &inflight_.Add({{"model", model}});
  m.kv_blocks_in_use = &kv_in_use_.Add({{"model", model}});
  m.kv_blocks_total = &kv_total_.Add({{"model", model}});
  m.queue_depth = &queue_depth_.Add({{"model", model}});
  requests_.Add({{"model", model}, {"code", "OK"}});  // present from the start, so rate() sees its first increase
  // std::map never moves its nodes, so the reference stays valid.
  return models_.emplace(model, m).first->second;
}

prometheus::Gauge& ServerMetrics::KvCacheUsageRatio(const std::string& model) {
  Model& m = ForModel(model);
  std::lock_guard<std::mutex> lock(mu_);
  if (!m.kv_usage_ratio) m.kv_usage_ratio = &kv_usage_.Add({{"model", model}});
  return *m.kv_usage_ratio;
}

void ServerMetrics::CountRequest(const std::string& model, const std::string& code) {
  // Family::Add returns the existing series for known labels; it locks internally.
  requests_.Add({{"model", model}, {"code", code}}).Increment();
}

prometheus::Gauge& ServerMetrics::BackendGauge(const std::string& name, const std::string& help,
                                               const std::map<std::string, std::string>& labels) {
  const std::string full = name.rfind("flashq_", 0) == 0 ? name : "flashq_" + name;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backend_families_.find(full);
  if (it == backend_families_.end()) {
    auto& family = prometheus::BuildGauge().Name(full).Help(help).Register(*registry_);
    it = backend_families_.emplace(full, &family).first;
  }
  return it->second->Add(prometheus::Labels(labels.begin(), labels.end()));
}

prometheus::Histogram& ServerMetrics::KernelHistogram(const std::string& kernel, int gpu) {
  static const auto kBuckets = KernelBuckets();
  return kernel_.Add({{"kernel", kernel}, {"gpu", std::to_string(gpu)}}, kBuckets);
}

}  // namespace flashq::server
