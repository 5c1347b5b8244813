// The CPU backend: runs the kernels' CPU references (FP32 accumulation). Slow but
// correct; CI, laptops and the first-run demo use it, and it is the reference
// that the CUDA backend is tested against through the server.
#pragma once

#include <memory>

#include "server/backends/backend.h"
#include "server/backends/cpu/thread_pool.h"

namespace flashq::server {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  std::string name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateAttention() override;
  absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateKvAttention(const KvGeometry& geometry) override;
  absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights weights) override;

 private:
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace flashq::server
