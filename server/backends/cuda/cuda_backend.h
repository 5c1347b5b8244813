// The CUDA backend: the kernels of kernels/attention and kernels/gemm behind the
// same executor interfaces as the CPU backend. One DeviceContext per visible GPU;
// stateless batches go round-robin across GPUs, KV sequences are pinned to a GPU
// by a hash of their sequence_id, and every linear layer has a replica per GPU.
// Every executor runs each of its kernels once on warm-up data when it is created,
// so the first request pays no lazy loading, planning or JIT.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/backends/backend.h"
#include "server/metrics/metrics.h"

namespace flashq::server {

int CudaDeviceCount();
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options, ServerMetrics& metrics);

}  // namespace flashq::server
