// `attention`: stateless varlen attention. A request carries one or more sequences
// (Q, K, V with optional CU_SEQLENS_Q / CU_SEQLENS_K); the batch concatenates the
// sequences of many requests, never padding, and runs them in one launch.
#pragma once

#include <memory>
#include <set>

#include "server/backends/backend.h"
#include "server/core/model.h"

namespace flashq::server {

class AttentionModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Create(inference::ModelConfig config, Backend& backend);

  using Model::Prepare;
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request,
                                                const RequestBytes& bytes) override;
  void Execute(const std::vector<Work*>& batch) override;

 private:
  AttentionModel(inference::ModelConfig config, std::unique_ptr<AttentionExecutor> executor, int64_t max_tokens,
                 int64_t max_sequences, std::set<int64_t> head_dims);
  std::unique_ptr<AttentionExecutor> executor_;
  const int64_t max_tokens_;
  const int64_t max_sequences_;  // per request; 0: bounded only by max_tokens_
  const std::set<int64_t> head_dims_;
};

}  // namespace flashq::server
