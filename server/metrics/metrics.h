// Prometheus metrics (prometheus-cpp core). Histograms, not summaries, so that
// they aggregate across replicas. The registry is passed in, never global.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace flashq::server {

class ServerMetrics {
 public:
  explicit ServerMetrics(std::shared_ptr<prometheus::Registry> registry);

  struct Model {
    prometheus::Histogram* queue_seconds;     // admitted -> batch formed
    prometheus::Histogram* compute_seconds;   // batch execution (per request: its batch's time)
    prometheus::Histogram* total_seconds;     // admitted -> response ready
    prometheus::Histogram* batch_requests;    // requests per executed batch
    prometheus::Histogram* batch_tokens;      // tokens (rows) per executed batch
    prometheus::Gauge* inflight;              // admitted and not yet answered
    prometheus::Gauge* kv_blocks_in_use;      // kv_attention only (0 otherwise)
    prometheus::Gauge* kv_blocks_total;
    prometheus::Gauge* queue_depth;
    // flashq_kv_cache_usage_ratio: blocks in use / blocks in the pool, 0-1; set only for models
    // with a KV cache (KvCacheUsageRatio), null for the others.
    prometheus::Gauge* kv_usage_ratio = nullptr;
  };
  // Creates the model's series on first use; the returned reference stays valid.
  Model& ForModel(const std::string& model);
  // Creates the model's flashq_kv_cache_usage_ratio series (a model with a KV cache) and
  // records it in ForModel(model).kv_usage_ratio. Call before requests reach the model.
  prometheus::Gauge& KvCacheUsageRatio(const std::string& model);
  // flashq_requests_total{model, code}; code is the gRPC code name, e.g. "OK", "INVALID_ARGUMENT".
  void CountRequest(const std::string& model, const std::string& code);
  // Backend-level gauges (GPU memory etc.): name must start with flashq_.
  prometheus::Gauge& BackendGauge(const std::string& name, const std::string& help,
                                  const std::map<std::string, std::string>& labels);
  prometheus::Histogram& KernelHistogram(const std::string& kernel, int gpu);  // flashq_kernel_seconds{kernel, gpu}

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& batch_requests_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Gauge>& inflight_;
  prometheus::Family<prometheus::Gauge>& kv_in_use_;
  prometheus::Family<prometheus::Gauge>& kv_total_;
  prometheus::Family<prometheus::Gauge>& kv_usage_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Histogram>& kernel_;
  std::mutex mu_;
  std::map<std::string, Model> models_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> backend_families_;
};

}  // namespace flashq::server
