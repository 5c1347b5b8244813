#include "client/bench/grpc_transport.h"

namespace flashq::bench {

void GrpcTransport::Send(const Work& work, std::function<void(int code)> done) {
  client::CallOptions opts;
  if (timeout_s_ > 0) opts.timeout = absl::Seconds(timeout_s_);
  client_.AsyncInfer(
      work.request,
      [done = std::move(done)](const grpc::Status& s, inference::ModelInferResponse&) { done(int(s.error_code())); },
      opts);
}

ServerCounters GrpcServerStats::Snapshot() {
  ServerCounters total;
  for (int e = 0; e < client_.num_endpoints(); ++e) {
    inference::ModelStatisticsResponse resp;
    if (!client_.ModelStatistics(e, model_, &resp).ok()) continue;
    for (const auto& ms : resp.model_stats()) {
      if (ms.name() != model_) continue;
      const auto& is = ms.inference_stats();
      ServerCounters c;
      c.valid = true;
      c.success_count = is.success().count();
      c.success_ns = is.success().ns();
      c.fail_count = is.fail().count();
      c.queue_count = is.queue().count();
      c.queue_ns = is.queue().ns();
      c.compute_input_ns = is.compute_input().ns();
      c.compute_infer_count = is.compute_infer().count();
      c.compute_infer_ns = is.compute_infer().ns();
      c.compute_output_ns = is.compute_output().ns();
      c.inference_count = ms.inference_count();
      c.execution_count = ms.execution_count();
      total.Add(c);
    }
  }
  return total;
}

}  // namespace flashq::bench
