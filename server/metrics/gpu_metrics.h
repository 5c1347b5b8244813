// GPU gauges in Triton's names, which `perf_analyzer --collect-metrics` and Triton dashboards
// read: nv_gpu_utilization (0-1), nv_gpu_power_usage and nv_gpu_power_limit (W),
// nv_gpu_memory_used_bytes and nv_gpu_memory_total_bytes, one series per GPU labelled
// {gpu_uuid="GPU-..."} and nothing else (perf_analyzer's parser expects exactly that label).
//
// Values are sampled when /metrics is scraped, from a GpuSampler: NVML in builds with CUDA
// (CreateNvmlSampler), a fake in tests. Without a sampler there are no nv_gpu_* series at all,
// rather than zeros that would look like an idle GPU.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace flashq::server {

struct GpuSample {
  std::string uuid;                 // "GPU-8c6b..." as NVML reports it
  double utilization = 0;           // fraction of the last sample period a kernel ran, 0-1
  double power_watts = 0, power_limit_watts = 0;
  double memory_used_bytes = 0, memory_total_bytes = 0;
};

class GpuSampler {
 public:
  virtual ~GpuSampler() = default;
  // One entry per GPU; a GPU whose readings fail is left out.
  virtual std::vector<GpuSample> Sample() = 0;
};

class GpuMetrics : public prometheus::Collectable {
 public:
  explicit GpuMetrics(std::unique_ptr<GpuSampler> sampler) : sampler_(std::move(sampler)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;  // one sample at a time
  std::unique_ptr<GpuSampler> sampler_;
};

// NVML through the driver's libnvidia-ml.so.1, opened at run time, so that the server also
// starts on hosts without a driver. Fails (naming the step) when the library or a GPU is missing.
absl::StatusOr<std::unique_ptr<GpuSampler>> CreateNvmlSampler();

}  // namespace flashq::server
