// Triton's per-model metric names, for dashboards, alerts and tools written against Triton
// (--metrics-compat=triton): nv_inference_request_success, _failure, nv_inference_count,
// nv_inference_exec_count, nv_inference_request_duration_us, nv_inference_queue_duration_us,
// nv_inference_compute_infer_duration_us (counters) and nv_inference_pending_request_count
// (gauge), each labelled {model, version} as Triton labels them.
//
// The values are read at scrape time from the same per-model counters that answer
// ModelStatistics, so the two never disagree; nothing is counted twice on the request path.
// Differences from Triton: nv_inference_request_failure has no `reason` label (Triton splits
// failures into REJECTED, CANCELED, BACKEND and OTHER; flashq_requests_total{code} has the
// breakdown by gRPC code), and there is no compute_input / compute_output pair.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "grpc_service.pb.h"

namespace flashq::server {

class TritonCompatMetrics : public prometheus::Collectable {
 public:
  // Fills one ModelStatistics per served model (InferenceServer::FillStatistics with no name).
  using StatsSource = std::function<void(inference::ModelStatisticsResponse*)>;
  // Requests of a model waiting in its queue.
  using PendingSource = std::function<double(const std::string& model)>;

  // Until a source is set, and after it is cleared ({}), Collect returns the families with no
  // series. Clearing waits for a scrape in progress, so the sources' objects may go right after.
  void SetSources(StatsSource stats, PendingSource pending);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;
  StatsSource stats_;
  PendingSource pending_;
};

}  // namespace flashq::server
