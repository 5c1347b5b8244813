// Split-K plan of our W4A16 / W8A16 kernels. It depends on K and N only (never on M),
// which is what makes the kernels batch-invariant: every row sees the same partition of
// K into warp ranges and the same fixed-order reduction over them.
#include <algorithm>
#include <cstdlib>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_tiles.h"

namespace flashq::gemm {

SplitPlan PlanFor(int K, int N) {
  SplitPlan p;
  const int nk32 = (K + kStepK - 1) / kStepK;
  p.n_blocks = (N + kBlockN - 1) / kBlockN;
  // A 32-column strip's K is cut into 2 * splits contiguous warp ranges (the small-M kernel runs
  // them as the warps of one block). Aim for ~kTargetWarps warps in all, at most kMaxSplits
  // splits, and each warp at least 2 stages of kSubSteps k32 steps. kTargetWarps is one wave of
  // the small-M kernel (16 warps per SM): on the H200 a second, partial wave cost 15-20% at M = 1
  // (8192^2: 13.8 us with 4224 target warps, 11.5 us with 2112; docs/perf/experiments.md).
  // Benchmark knob FLASHQ_GEMM_TARGET_WARPS (read when weights are created; never per call).
  static const int target = [] {
    const char* e = std::getenv("FLASHQ_GEMM_TARGET_WARPS");
    const int v = e ? std::atoi(e) : 0;
    return v > 0 ? v : kTargetWarps;
  }();
  const int strips = (N + kWarpN - 1) / kWarpN;
  int s = std::clamp(target / std::max(1, kWarpsK * strips), 1, kMaxSplits);
  s = std::max(1, std::min(s, nk32 / (kWarpsK * 2 * kSubSteps)));
  int spw = (nk32 + s * kWarpsK - 1) / (s * kWarpsK);
  spw = (spw + kSubSteps - 1) / kSubSteps * kSubSteps;
  p.steps_per_warp = std::max(spw, kSubSteps);
  // Drop splits that would be empty.
  p.splits = std::max(1, (nk32 + p.steps_per_warp * kWarpsK - 1) / (p.steps_per_warp * kWarpsK));
  return p;
}

}  // namespace flashq::gemm
