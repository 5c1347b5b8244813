#include "client/bench/grpc_transport.h"

#include <future>
#include <utility>

#include "client/bench/placement.h"

namespace flashq::bench {
namespace {
Placement Where(const Work& work) { return {work.output_bytes, work.resident_bytes}; }
}  // namespace

client::CallOptions GrpcTransport::Options() const {
  client::CallOptions opts;
  if (timeout_s_ > 0) opts.timeout = absl::Seconds(timeout_s_);
  return opts;
}

void GrpcTransport::Record(const absl::Status& s) {
  std::lock_guard<std::mutex> l(mu_);
  if (first_error_.empty()) first_error_ = std::string(s.message());
}

std::string GrpcTransport::TakeFirstClientError() {
  std::lock_guard<std::mutex> l(mu_);
  return std::exchange(first_error_, std::string());
}

void GrpcTransport::Return(SlotPool::Slot* slot, const grpc::Status& s) {
  switch (s.error_code()) {
    // The call ended on the client's side (its deadline, a cancel, a broken connection):
    // the server may still read the inputs and write the outputs of this slot.
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNKNOWN:
      slots_->Retire(slot);
      return;
    default:
      slots_->Release(slot);
  }
}

void GrpcTransport::Send(const Work& work, std::function<void(int code)> done) {
  if (!slots_) {
    client_.AsyncInfer(
        work.request,
        [this, req = work.request, done = std::move(done)](const grpc::Status& s, inference::ModelInferResponse& resp) {
          int code = int(s.error_code());
          if (s.ok()) {
            if (absl::Status c = CheckOutputs(*req, resp, nullptr); !c.ok()) {
              Record(c);
              code = kCodeBadOutput;
            }
          }
          done(code);
        },
        Options());
    return;
  }
  // Runs at once, or when a slot comes free (possibly on a gRPC or the pool's thread).
  slots_->Acquire(PlacedBytes(*work.request, Where(work)), [this, work, done](SlotPool::Slot* slot,
                                                                                    const absl::Status& why) {
    if (!slot) {
      Record(why);
      done(kCodeClientError);
      return;
    }
    auto placed = PlaceInRegion(*work.request, Where(work), *slot->region);
    if (!placed.ok()) {
      slots_->Release(slot);
      Record(placed.status());
      done(kCodeClientError);
      return;
    }
    auto req = std::make_shared<const inference::ModelInferRequest>(std::move(*placed));
    client_.AsyncInfer(
        req,
        [this, req, slot, done](const grpc::Status& s, inference::ModelInferResponse& resp) {
          int code = int(s.error_code());
          if (s.ok()) {
            if (absl::Status c = CheckOutputs(*req, resp, slot->region.get()); !c.ok()) {
              Record(c);
              code = kCodeBadOutput;
            }
          }
          Return(slot, s);  // before done(): a kv session's next step may take the slot
          done(code);
        },
        Options());
  });
}

grpc::Status GrpcTransport::Call(const Work& work) {
  auto to_grpc = [](const absl::Status& s) { return grpc::Status(grpc::StatusCode(int(s.code())), std::string(s.message())); };
  inference::ModelInferResponse resp;
  if (!slots_) {
    grpc::Status s = client_.Infer(*work.request, &resp, Options());
    if (!s.ok()) return s;
    return to_grpc(CheckOutputs(*work.request, resp, nullptr));
  }
  std::promise<std::pair<SlotPool::Slot*, absl::Status>> got;
  slots_->Acquire(PlacedBytes(*work.request, Where(work)),
                  [&got](SlotPool::Slot* slot, const absl::Status& why) { got.set_value({slot, why}); });
  auto [slot, why] = got.get_future().get();
  if (!slot) return to_grpc(why);
  grpc::Status s;
  auto placed = PlaceInRegion(*work.request, Where(work), *slot->region);
  if (!placed.ok()) {
    s = to_grpc(placed.status());
  } else {
    s = client_.Infer(*placed, &resp, Options());
    if (s.ok()) s = to_grpc(CheckOutputs(*placed, resp, slot->region.get()));
  }
  Return(slot, s);
  return s;
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
