// A linear layer (one per model folder): Y[M, N] = X[M, K] · Wᵀ with W resident on
// the backend. Requests stack their rows into one GEMM; rows are independent, and
// in batch-invariant mode each row's result does not depend on the others.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/backends/backend.h"
#include "server/core/model.h"
#include "server/repository/checkpoint.h"

namespace flashq::server {

class LinearModel : public Model {
 public:
  // Weights come through `checkpoints` (see server/repository/linear_loader.h); what loading detected or
  // overrode is appended to `notes`.
  static absl::StatusOr<std::unique_ptr<Model>> Create(inference::ModelConfig config, const std::string& dir,
                                                       Backend& backend, CheckpointCache& checkpoints,
                                                       std::vector<std::string>* notes);

  using Model::Prepare;
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request,
                                                const RequestBytes& bytes) override;
  void Execute(const std::vector<Work*>& batch) override;

 private:
  LinearModel(inference::ModelConfig config, std::unique_ptr<LinearExecutor> executor, int K, int N,
              int64_t max_tokens);
  std::unique_ptr<LinearExecutor> executor_;
  const int K_, N_;
  const int64_t max_tokens_;
};

}  // namespace flashq::server
