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
  // A batch's compute time, split as Triton splits it: input copies, the rest, output copies.
  struct Compute {
    uint64_t input_ns = 0, infer_ns = 0, output_ns = 0;
    // From the whole compute time and the copy times a backend measured; the copies are
    // capped at the whole (a backend may count copies that overlapped on several threads).
    static Compute Split(uint64_t compute_ns, uint64_t input_ns, uint64_t output_ns);
  };
  void RecordSuccess(uint64_t total_ns, uint64_t queue_ns, const Compute& compute);
  void RecordFailure(uint64_t total_ns);
  void RecordBatch(uint64_t batch_size, const Compute& compute);
  void Fill(inference::ModelStatistics* out) const;

 private:
  struct Duration { uint64_t count = 0, ns = 0; void Add(uint64_t v) { ++count; ns += v; } };
  struct Stages {
    Duration input, infer, output;
    void Add(const Compute& c) { input.Add(c.input_ns), infer.Add(c.infer_ns), output.Add(c.output_ns); }
  };
  mutable std::mutex mu_;
  Duration success_, fail_, queue_;
  Stages compute_;
  uint64_t inference_count_ = 0, execution_count_ = 0, last_inference_ms_ = 0;
  std::map<uint64_t, Stages> batches_;
};

}  // namespace flashq::server
