// LaunchQLinear: one launch of our W4A16 / W8A16 kernels, on the path dispatch.h chooses. The staged kernel (M <= 8,
// 8-split plans on sm_90, int4 with stage flush or fp8) where it applies, else the small-M kernel with one or two
// 8-token tiles up to kSmallMMaxRows rows, larger M the wgmma kernel (int4 with stage flush on sm_90, where it applies)
// or the 32-token split-K kernel. A path that declines at launch (cudaErrorNotSupported, nothing launched) hands over
// to the next. Each instantiation file under inst/ calls this for one (T, kFp8, kStageFlush).
#pragma once

#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/qlinear_direct_kernel.cuh"
#include "kernels/gemm/qlinear_staged_kernel.cuh"
#include "kernels/gemm/qlinear_tiled_kernel.cuh"
#include "kernels/gemm/qlinear_wgmma_kernel.cuh"

namespace flashq::gemm::detail {

template <typename T, bool kFp8, bool kStageFlush>
cudaError_t LaunchQLinear(const QLinearParams& p, const GemmTuning& t, cudaStream_t stream) {
  const DeviceInfo d = CurrentDevice();
  const LaunchShape s{p.M, p.N, p.K, p.nk32, p.splits, p.steps_per_warp,
                      kFp8, kStageFlush, p.xpack != nullptr, p.xready != nullptr};
  const QLinearPath path = FirstPath(s, t, d);
  if constexpr (kFp8 || kStageFlush) {
    if (path == QLinearPath::kStaged) {
      const cudaError_t e = LaunchQLinearStaged<T, kFp8>(p, t, d, stream);
      if (e != cudaErrorNotSupported) return e;
    }
  }
  if (p.M <= kSmallMMaxRows) {
    if (DirectTokenTiles(p.M) == 1) return LaunchQLinearDirect<T, 1, kFp8, kStageFlush>(p, s, t, d, stream);
    return LaunchQLinearDirect<T, 2, kFp8, kStageFlush>(p, s, t, d, stream);
  }
  if constexpr (!kFp8 && kStageFlush) {
    if (path == QLinearPath::kWgmma) {
      const cudaError_t e = LaunchQLinearWgmma<T>(p, t, d, stream);
      if (e != cudaErrorNotSupported) return e;
    }
  }
  using C = Cfg<kFp8, 4, kStageFlush, true>;
  QLinearParams q = p;
  q.pairs = PairsPerBlock(s, (p.M + C::kXRows - 1) / C::kXRows, C::kSub, C::kMinBlocks, t, d);
  if (q.pairs > 1) return LaunchQLinearNT<T, 4, kFp8, kStageFlush, true>(q, t, d, stream);
  return LaunchQLinearNT<T, 4, kFp8, kStageFlush, false>(q, t, d, stream);
}

}  // namespace flashq::gemm::detail
