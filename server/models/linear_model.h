// A linear layer (one per model folder): Y[M, N] = X[M, K] · Wᵀ with W resident on
// the backend. Requests stack their rows into one GEMM; rows are independent, and
// in batch-invariant mode each row's result does not depend on the others.
#pragma once

#include <memory>
#include <string>

#include "server/backends/backend.h"
#include "server/core/model.h"

namespace flashq::server {

// Reads the folder's model.safetensors in the format named by the config's
// `weight_format` parameter (bf16 | gptq | awq | fp8) into the canonical host form.
absl::StatusOr<LinearWeights> LoadLinearWeights(const std::string& model_dir, const inference::ModelConfig& config);

class LinearModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Create(inference::ModelConfig config, const std::string& dir,
                                                       Backend& backend);

  using Model::Prepare;
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& request,
                                                const SharedMemoryRegistry* shared_memory) override;
  void Execute(const std::vector<Work*>& batch) override;

 private:
  LinearModel(inference::ModelConfig config, std::unique_ptr<LinearExecutor> executor, int K, int N,
              int64_t max_tokens);
  std::unique_ptr<LinearExecutor> executor_;
  const int K_, N_;
  const int64_t max_tokens_;
};

}  // namespace flashq::server
