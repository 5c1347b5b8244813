#include "server/metrics/triton_metrics.h"

namespace flashq::server {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void Add(prometheus::MetricFamily& f, const inference::ModelStatistics& m, double value) {
  prometheus::ClientMetric c;
  c.label = {{"model", m.name()}, {"version", m.version().empty() ? "1" : m.version()}};
  if (f.type == prometheus::MetricType::Gauge) c.gauge.value = value;
  else c.counter.value = value;
  f.metric.push_back(std::move(c));
}

double Us(const inference::StatisticDuration& d) { return double(d.ns() / 1000); }

}  // namespace

void TritonCompatMetrics::SetSources(StatsSource stats, PendingSource pending) {
  std::lock_guard<std::mutex> l(mu_);
  stats_ = std::move(stats);
  pending_ = std::move(pending);
}

std::vector<prometheus::MetricFamily> TritonCompatMetrics::Collect() const {
  using prometheus::MetricType;
  // Triton's names and help texts.
  std::vector<prometheus::MetricFamily> out = {
      Family("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
             MetricType::Counter),
      Family("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
             MetricType::Counter),
      Family("nv_inference_count", "Number of inferences performed (does not include cached requests)",
             MetricType::Counter),
      Family("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
             MetricType::Counter),
      Family("nv_inference_request_duration_us",
             "Cumulative inference request duration in microseconds (includes cached requests)", MetricType::Counter),
      Family("nv_inference_queue_duration_us",
             "Cumulative inference queuing duration in microseconds (includes cached requests)", MetricType::Counter),
      Family("nv_inference_compute_infer_duration_us",
             "Cumulative compute inference duration in microseconds (does not include cached requests)",
             MetricType::Counter),
      Family("nv_inference_compute_input_duration_us",
             "Cumulative compute input duration in microseconds (does not include cached requests)",
             MetricType::Counter),
      Family("nv_inference_compute_output_duration_us",
             "Cumulative inference compute output duration in microseconds (does not include cached requests)",
             MetricType::Counter),
      Family("nv_inference_pending_request_count",
             "Instantaneous number of pending requests awaiting execution per-model.", MetricType::Gauge),
  };
  std::lock_guard<std::mutex> l(mu_);
  if (!stats_) return out;
  inference::ModelStatisticsResponse stats;
  stats_(&stats);
  for (const inference::ModelStatistics& m : stats.model_stats()) {
    const auto& s = m.inference_stats();
    Add(out[0], m, double(s.success().count()));
    Add(out[1], m, double(s.fail().count()));
    Add(out[2], m, double(m.inference_count()));
    Add(out[3], m, double(m.execution_count()));
    Add(out[4], m, Us(s.success()));
    Add(out[5], m, Us(s.queue()));
    Add(out[6], m, Us(s.compute_infer()));
    Add(out[7], m, Us(s.compute_input()));
    Add(out[8], m, Us(s.compute_output()));
    Add(out[9], m, pending_ ? pending_(m.name()) : 0.0);
  }
  return out;
}

}  // namespace flashq::server
