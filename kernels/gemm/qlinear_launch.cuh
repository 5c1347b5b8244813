// Kernel choice per launch for the int4 / fp8 linear layers (one instantiation file per (T, kFp8,
// kStageFlush) calls LaunchQLinear): qlinear_kernel.cuh (small-M and 32-token split-K kernels) and
// qlinear_wgmma.cuh (sm_90 int4 kernel for M > 16) say how each works.
#pragma once

#include "kernels/gemm/qlinear_kernel.cuh"
#include "kernels/gemm/qlinear_wgmma.cuh"

namespace flashq::gemm::detail {

// The wgmma path serves int4 launches of at least kMinRows rows on sm_90 when the caller provided the
// packed-X workspace. Bench knobs: FLASHQ_GEMM_NOWGMMA=1 sends them to QLinearKernel (mma.sync) instead;
// FLASHQ_GEMM_WGMMA_MIN_M=n (9..kSmallMMaxRows + 1) moves the boundary with the small-M kernel.
inline bool UseWgmma(const QLinearParams& p) {
  static const int min_rows = [] {
    const char* off = std::getenv("FLASHQ_GEMM_NOWGMMA");
    if (off && off[0] == '1') return 1 << 30;
    const char* e = std::getenv("FLASHQ_GEMM_WGMMA_MIN_M");
    const int v = e ? std::atoi(e) : 0;
    return v >= 9 && v <= kSmallMMaxRows + 1 ? v : kSmallMMaxRows + 1;
  }();
  return p.M >= min_rows && p.xpack != nullptr && DeviceMajor() >= 9;
}

// One instantiation file per (T, kFp8, kStageFlush) calls this: M <= 8 and M <= 16 take the
// small-M kernel with one or two 8-token tiles; larger M the wgmma kernel (int4 on sm_90) or the
// 32-token split-K kernel.
template <typename T, bool kFp8, bool kStageFlush>
cudaError_t LaunchQLinear(const QLinearParams& p, cudaStream_t stream) {
  if (p.M <= 8) return LaunchQLinearDirect<T, 1, kFp8, kStageFlush>(p, stream);
  if constexpr (!kFp8) {
    if (UseWgmma(p)) {
      if (p.M <= kSmallMMaxRows) return LaunchQLinearWgmma<T, 16, kStageFlush>(p, stream);
      if (p.M <= kNarrowTileMaxRows) return LaunchQLinearWgmma<T, kNarrowTileMaxRows, kStageFlush>(p, stream);
      return LaunchQLinearWgmma<T, 64, kStageFlush>(p, stream);
    }
  }
  static_assert(kSmallMMaxRows == 16, "the small-M kernel's widest instantiation holds two 8-token tiles");
  if (p.M <= kSmallMMaxRows) return LaunchQLinearDirect<T, 2, kFp8, kStageFlush>(p, stream);
  return LaunchQLinearNT<T, 4, kFp8, kStageFlush>(p, stream);
}

}  // namespace flashq::gemm::detail
