// Element-wise dtype conversion and bias on the GPU, so that the server's data path never
// converts on the host. Rounding is to nearest even, as the CPU reference's (dtype.h).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

#if FLASHQ_HAVE_CUDA
#include <cuda_runtime_api.h>

namespace flashq {

// dst[i] = src[i] from `from` to `to`; both FP16, BF16 or FP32. dst must not overlap src.
Status RunConvert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream);

// y[r][c] = round(y[r][c] + bias[c]) for a row-major [rows][cols] y of FP16, BF16 or FP32,
// the sum taken in float.
Status RunAddBias(void* y, DType dtype, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream);

}  // namespace flashq
#endif
