// LaunchInvariantGemm: one launch of the invariant GEMM (invariant_gemm_kernel.cuh) with the tile dispatch.h picks for
// M; each instantiation file under inst/ calls it for one (input, output) type pair.
#pragma once

#include <cuda.h>

#include "kernels/common/tensor_map.h"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/gemm_internal.h"
#include "kernels/gemm/invariant_gemm_kernel.cuh"

namespace flashq::gemm::detail {

// A 2D tensor map over a [rows][K] row-major matrix of In: boxes of 128 bytes of K x box_rows rows, 128B swizzle,
// zeros past the matrix. False where the driver has no encoder or rejects the layout.
template <typename In>
bool EncodeKMajorMap(CUtensorMap* map, const void* base, int rows, int K, int box_rows) {
  const CUtensorMapDataType type = std::is_same_v<In, uint8_t>         ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::is_same_v<In, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return EncodeMap2d(map, type, base, uint64_t(K), uint64_t(rows), uint64_t(K) * sizeof(In), 128 / sizeof(In),
                     uint32_t(box_rows), CU_TENSOR_MAP_SWIZZLE_128B);
}

template <typename In, typename Out, int kT, int kC, int kB, int kWn>
cudaError_t LaunchInvariantTile(const InvariantGemmArgs& a, int split_panel, const GemmTuning& t, const DeviceInfo& d,
                                cudaStream_t stream) {
  using C = InvariantCfg<kT, kC, kB, kWn>;
  CUtensorMap wmap, xmap;
  if (!EncodeKMajorMap<In>(&wmap, a.w, a.N, a.K, C::kRows) || !EncodeKMajorMap<In>(&xmap, a.x, a.M, a.K, kT))
    return cudaErrorNotSupported;
  auto kernel = InvariantGemmKernel<In, Out, kT, kC, kB, kWn>;
  // On every launch, as the other launchers do: the attribute belongs to the current device.
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attrs[2];
  cfg.attrs = attrs;
  cfg.numAttrs = 0;
  cfg.gridDim = dim3((a.M + kT - 1) / kT, (a.N + C::kRows - 1) / C::kRows * (split_panel > 0 ? 2 : 1));
  if (split_panel > 0) {  // the two parts of a weight tile's K: one cluster
    attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[cfg.numAttrs].val.clusterDim.x = 1;
    attrs[cfg.numAttrs].val.clusterDim.y = 2;
    attrs[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  AddPdl(&cfg, t, d);
  return cudaLaunchKernelEx(&cfg, kernel, wmap, xmap, static_cast<Out*>(a.y), a.x_scale, a.x_scale_stride, a.w_scale,
                            a.M, a.N, a.K, split_panel);
}

template <typename In, typename Out>
cudaError_t LaunchInvariantGemm(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t stream) {
  const DeviceInfo d = CurrentDevice();
  if (d.major != 9) return cudaErrorNotSupported;  // sm_90a only
  const int split_panel = InvariantSplitPanel(int64_t(a.K) * sizeof(In), a.N);
  const InvariantTile tile =
      t.invariant_tile.tokens > 0 ? t.invariant_tile : InvariantTileFor(a.M, a.N, split_panel > 0 ? 2 : 1, d.sms);
#define FQ_TILE(tt, g, b, wn)            \
  if (tile == InvariantTile{tt, g, b, wn}) \
    return LaunchInvariantTile<In, Out, tt, g, b, wn>(a, split_panel, t, d, stream);
  FQ_INVARIANT_TILES(FQ_TILE)
#undef FQ_TILE
  return cudaErrorInvalidValue;
}

}  // namespace flashq::gemm::detail
