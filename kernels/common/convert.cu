#include "kernels/common/convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

namespace flashq {
namespace {

__device__ __forceinline__ float Load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void Store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// Grid-stride loops: the conversions are memory-bound and tiny next to the kernels they feed.
__global__ void ConvertKernel(const void* src, DType from, void* dst, DType to, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    Store(dst, to, i, Load(src, from, i));
  }
}

__global__ void AddBiasKernel(void* y, DType t, int64_t n, int64_t cols, const float* bias) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    Store(y, t, i, Load(y, t, i) + bias[i % cols]);
  }
}

bool Supported(DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; }

int Blocks(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 4096)); }

Status LaunchStatus(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace

Status RunConvert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream) {
  if (!Supported(from) || !Supported(to)) return InvalidArgument("RunConvert: FP16, BF16 and FP32 only");
  if (n <= 0) return Status::Ok();
  ConvertKernel<<<Blocks(n), 256, 0, stream>>>(src, from, dst, to, n);
  return LaunchStatus("RunConvert");
}

Status RunAddBias(void* y, DType dtype, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream) {
  if (!Supported(dtype)) return InvalidArgument("RunAddBias: FP16, BF16 and FP32 only");
  if (rows <= 0 || cols <= 0) return Status::Ok();
  AddBiasKernel<<<Blocks(rows * cols), 256, 0, stream>>>(y, dtype, rows * cols, cols, bias);
  return LaunchStatus("RunAddBias");
}

}  // namespace flashq
