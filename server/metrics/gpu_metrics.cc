#include "server/metrics/gpu_metrics.h"

namespace flashq::server {
namespace {

prometheus::MetricFamily Gauges(const char* name, const char* help, const std::vector<GpuSample>& gpus,
                                double GpuSample::*field) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  for (const GpuSample& g : gpus) {
    prometheus::ClientMetric m;
    m.label = {{"gpu_uuid", g.uuid}};
    m.gauge.value = g.*field;
    f.metric.push_back(std::move(m));
  }
  return f;
}

}  // namespace

std::vector<prometheus::MetricFamily> GpuMetrics::Collect() const {
  std::vector<GpuSample> gpus;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (sampler_) gpus = sampler_->Sample();
  }
  if (gpus.empty()) return {};
  // Triton's names and help texts.
  return {
      Gauges("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", gpus, &GpuSample::utilization),
      Gauges("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", gpus, &GpuSample::memory_total_bytes),
      Gauges("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", gpus, &GpuSample::memory_used_bytes),
      Gauges("nv_gpu_power_usage", "GPU power usage in watts", gpus, &GpuSample::power_watts),
      Gauges("nv_gpu_power_limit", "GPU power management limit in watts", gpus, &GpuSample::power_limit_watts),
  };
}

}  // namespace flashq::server
