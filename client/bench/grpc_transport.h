// The real Transport (async ModelInfer through the client library) and the
// server-side statistics source (ModelStatistics summed over endpoints).
//
// Every response passes CheckOutputs (placement.h); one that fails counts as
// kCodeBadOutput. With a SlotPool (--shared-memory), each request's tensors go into a
// slot's region instead of the message, and the slot is released when its response
// has been checked.
#pragma once

#include <mutex>
#include <string>

#include "client/bench/runner.h"
#include "client/bench/slot_pool.h"
#include "client/lib/client.h"

namespace flashq::bench {

class GrpcTransport : public Transport {
 public:
  // `slots` (may be null: tensors travel in the message) must outlive every call.
  GrpcTransport(client::Client& client, double timeout_s, SlotPool* slots = nullptr)
      : client_(client), timeout_s_(timeout_s), slots_(slots) {}
  void Send(const Work& work, std::function<void(int code)> done) override;
  // One synchronous call, sent and checked as Send's are; the status carries the
  // server's message or the client-side reason.
  grpc::Status Call(const Work& work);
  // The first client-side failure (kCodeBadOutput, kCodeClientError) since the last
  // call, with its reason; empty when there was none.
  std::string TakeFirstClientError();

 private:
  client::CallOptions Options() const;
  void Record(const absl::Status& s);
  // Gives a slot back after its call: released, or retired when the server may still use it.
  void Return(SlotPool::Slot* slot, const grpc::Status& s);

  client::Client& client_;
  double timeout_s_;
  SlotPool* slots_;
  std::mutex mu_;
  std::string first_error_;
};

class GrpcServerStats : public ServerStatsSource {
 public:
  GrpcServerStats(client::Client& client, std::string model) : client_(client), model_(std::move(model)) {}
  ServerCounters Snapshot() override;

 private:
  client::Client& client_;
  std::string model_;
};

}  // namespace flashq::bench
