// Per-model counters in the shape of Triton's ModelStatistics, which
// perf_analyzer and flashq-bench read for the server-side breakdown.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "grpc_service.pb.h"

namespace flashq::server {

class ModelStats {
 public:
  void RecordSuccess(uint64_t total_ns, uint64_t queue_ns, uint64_t compute_ns);
  void RecordFailure(uint64_t total_ns);
  void RecordBatch(uint64_t batch_size, uint64_t compute_ns);
  void Fill(inference::ModelStatistics* out) const;

 private:
  struct Duration { uint64_t count = 0, ns = 0; void Add(uint64_t v) { ++count; ns += v; } };
  mutable std::mutex mu_;
  Duration success_, fail_, queue_, compute_;
  uint64_t inference_count_ = 0, execution_count_ = 0, last_inference_ms_ = 0;
  std::map<uint64_t, Duration> batches_;
};

}  // namespace flashq::server
