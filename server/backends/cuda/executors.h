// The CUDA backend's executors, one per file: varlen attention, attention over the paged KV
// cache, and linear layers. Each is built with the backend's device contexts and runs each
// of its kernels once on warm-up data before it is returned.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/backend.h"
#include "server/backends/cuda/device_context.h"
#include "server/metrics/metrics.h"

namespace flashq::server {

using Contexts = std::vector<std::unique_ptr<DeviceContext>>;

absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateCudaAttention(Contexts& ctx, ServerMetrics& metrics);
absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateCudaKvAttention(Contexts& ctx, ServerMetrics& metrics,
                                                                           const KvGeometry& geometry);
absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateCudaLinear(Contexts& ctx, ServerMetrics& metrics,
                                                                 LinearWeights weights, bool batch_invariant);

}  // namespace flashq::server
