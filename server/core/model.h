// A served model. Each kind (attention, kv_attention, linear) decodes and checks
// its requests, merges a batch into one ragged launch and splits the results; the
// arithmetic is delegated to an executor made by the backend (cpu or cuda).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "model_config.pb.h"
#include "server/core/request_decoder.h"
#include "server/core/shared_memory.h"
#include "server/core/work.h"

namespace flashq::server {

class Model {
 public:
  explicit Model(inference::ModelConfig config) : config_(std::move(config)) {}
  virtual ~Model() = default;

  const std::string& name() const { return config_.name(); }
  const inference::ModelConfig& config() const { return config_; }

  // Decodes and validates one request (on the gRPC thread). Errors name the tensor,
  // the parameter or the limit, and the expected value. Tensor bytes are read in place,
  // from the message, the transport's buffers or shared memory (see RequestBytes).
  virtual absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request,
                                                        const RequestBytes& bytes) = 0;
  // A request whose tensors all travel in the message.
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request) {
    return Prepare(request, RequestBytes{});
  }
  // Called by the scheduler, with its queue locked, as a prepared work joins the queue.
  // State that must follow queue order (a KV sequence's cache positions) is reserved
  // here, so that works queue in the order of their reservations. An error rejects the
  // work; nothing is reserved then.
  virtual absl::Status Admit(Work& work) { return absl::OkStatus(); }
  // Runs a batch of works that share a batch_key; sets each work's status and outputs.
  virtual void Execute(const std::vector<Work*>& batch) = 0;
  // A prepared work that will never run (cancelled, timed out, queue full, shutdown).
  virtual void Drop(Work& work, const absl::Status& why) {}
  // Called about once a second (idle session reaping and similar housekeeping).
  virtual void Tick(std::chrono::steady_clock::time_point now) {}
  // KV-cache blocks in use and in total, for models that hold a KV cache.
  struct BlockUsage {
    int64_t in_use = 0, total = 0;
  };
  virtual std::optional<BlockUsage> KvBlocks() const { return std::nullopt; }

 private:
  inference::ModelConfig config_;
};

}  // namespace flashq::server
