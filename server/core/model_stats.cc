#include "server/core/model_stats.h"

#include <algorithm>
#include <chrono>

namespace flashq::server {
namespace {
void Put(inference::StatisticDuration* d, uint64_t count, uint64_t ns) {
  d->set_count(count);
  d->set_ns(ns);
}
uint64_t NowMs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count());
}
}  // namespace

ModelStats::Compute ModelStats::Compute::Split(uint64_t compute_ns, uint64_t input_ns, uint64_t output_ns) {
  Compute c;
  c.input_ns = std::min(input_ns, compute_ns);
  c.output_ns = std::min(output_ns, compute_ns - c.input_ns);
  c.infer_ns = compute_ns - c.input_ns - c.output_ns;
  return c;
}

void ModelStats::RecordSuccess(uint64_t total_ns, uint64_t queue_ns, const Compute& compute) {
  std::lock_guard<std::mutex> l(mu_);
  success_.Add(total_ns);
  queue_.Add(queue_ns);
  compute_.Add(compute);
  ++inference_count_;
  last_inference_ms_ = NowMs();
}

void ModelStats::RecordFailure(uint64_t total_ns) {
  std::lock_guard<std::mutex> l(mu_);
  fail_.Add(total_ns);
}

void ModelStats::RecordBatch(uint64_t batch_size, const Compute& compute) {
  std::lock_guard<std::mutex> l(mu_);
  ++execution_count_;
  batches_[batch_size].Add(compute);
}

void ModelStats::Fill(inference::ModelStatistics* out) const {
  std::lock_guard<std::mutex> l(mu_);
  out->set_inference_count(inference_count_);
  out->set_execution_count(execution_count_);
  out->set_last_inference(last_inference_ms_);
  auto* s = out->mutable_inference_stats();
  Put(s->mutable_success(), success_.count, success_.ns);
  Put(s->mutable_fail(), fail_.count, fail_.ns);
  Put(s->mutable_queue(), queue_.count, queue_.ns);
  Put(s->mutable_compute_input(), compute_.input.count, compute_.input.ns);
  Put(s->mutable_compute_infer(), compute_.infer.count, compute_.infer.ns);
  Put(s->mutable_compute_output(), compute_.output.count, compute_.output.ns);
  for (const auto& [size, d] : batches_) {
    auto* b = out->add_batch_stats();
    b->set_batch_size(size);
    Put(b->mutable_compute_input(), d.input.count, d.input.ns);
    Put(b->mutable_compute_infer(), d.infer.count, d.infer.ns);
    Put(b->mutable_compute_output(), d.output.count, d.output.ns);
  }
}

}  // namespace flashq::server
