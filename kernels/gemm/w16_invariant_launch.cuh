// LaunchW16Invariant: one launch of the 16-bit invariant kernel (w16_invariant_kernel.cuh) with the tile dispatch.h
// picks for M; each instantiation file under inst/ calls it for one activation type.
#pragma once

#include <cuda.h>

#include "kernels/common/tensor_map.h"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/w16_invariant_kernel.cuh"

namespace flashq::gemm::detail {

// A 2D tensor map over a [rows][K] 16-bit row-major matrix: boxes of 64 k x box_rows rows, 128B swizzle, zeros past
// the matrix. False where the driver has no encoder or rejects the layout.
inline bool EncodeKMajorMap(CUtensorMap* map, const void* base, bool bf16, int rows, int K, int box_rows) {
  const TensorMapEncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(K) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, int kT, int kC>
cudaError_t LaunchW16Tile(const void* w, const void* x, void* y, int M, int N, int K, const GemmTuning& t,
                          const DeviceInfo& d, cudaStream_t stream) {
  using C = W16Cfg<kT, kC>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  CUtensorMap wmap, xmap;
  if (!EncodeKMajorMap(&wmap, w, kBf16, N, K, C::kRows) || !EncodeKMajorMap(&xmap, x, kBf16, M, K, kT))
    return cudaErrorNotSupported;
  auto kernel = W16InvariantKernel<T, kT, kC>;
  static bool attr_set[kMaxDevices] = {};  // the shared-memory limit, once per device (a benign race: same value)
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= kMaxDevices || !attr_set[dev]) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
        e != cudaSuccess)
      return e;
    if (dev < kMaxDevices) attr_set[dev] = true;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attrs[1];
  cfg.attrs = attrs;
  cfg.numAttrs = 0;
  cfg.gridDim = dim3((N + C::kRows - 1) / C::kRows, (M + kT - 1) / kT);
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  AddPdl(&cfg, t, d);
  return cudaLaunchKernelEx(&cfg, kernel, wmap, xmap, static_cast<T*>(y), M, N, K);
}

template <typename T>
cudaError_t LaunchW16Invariant(const void* w, const void* x, void* y, int M, int N, int K, const GemmTuning& t,
                               cudaStream_t stream) {
  const DeviceInfo d = CurrentDevice();
  if (d.major != 9) return cudaErrorNotSupported;  // sm_90a only
  const W16Tile tile = W16InvariantTileFor(M, N, d.sms);
  switch (tile.tokens * 4 + tile.groups) {
    case 8 * 4 + 1: return LaunchW16Tile<T, 8, 1>(w, x, y, M, N, K, t, d, stream);
    case 16 * 4 + 1: return LaunchW16Tile<T, 16, 1>(w, x, y, M, N, K, t, d, stream);
    case 32 * 4 + 1: return LaunchW16Tile<T, 32, 1>(w, x, y, M, N, K, t, d, stream);
    case 64 * 4 + 1: return LaunchW16Tile<T, 64, 1>(w, x, y, M, N, K, t, d, stream);
    case 128 * 4 + 1: return LaunchW16Tile<T, 128, 1>(w, x, y, M, N, K, t, d, stream);
    case 128 * 4 + 2: return LaunchW16Tile<T, 128, 2>(w, x, y, M, N, K, t, d, stream);
    case 256 * 4 + 1: return LaunchW16Tile<T, 256, 1>(w, x, y, M, N, K, t, d, stream);
    case 256 * 4 + 2: return LaunchW16Tile<T, 256, 2>(w, x, y, M, N, K, t, d, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashq::gemm::detail
