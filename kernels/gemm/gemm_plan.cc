// Split-K plan of our W4A16 / W8A16 kernels. It depends on K and N only (never on M),
// which is what makes the kernels batch-invariant: every row sees the same partition of
// K into warp ranges and the same fixed-order reduction over them.
#include <algorithm>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_tiles.h"

namespace flashq::gemm {

SplitPlan PlanFor(int K, int N) {
  SplitPlan p;
  const int nk32 = (K + 31) / 32;
  p.n_blocks = (N + kBlockN - 1) / kBlockN;
  // Aim for ~kTargetBlocks blocks (about two per SM on H100/H200); at most kMaxSplits
  // splits, and each warp keeps at least 2 k32 steps.
  int s = std::clamp(kTargetBlocks / std::max(1, p.n_blocks), 1, kMaxSplits);
  s = std::max(1, std::min(s, nk32 / (kWarpsK * 2)));
  p.steps_per_warp = (nk32 + s * kWarpsK - 1) / (s * kWarpsK);
  // Drop splits that would be empty.
  p.splits = (nk32 + p.steps_per_warp * kWarpsK - 1) / (p.steps_per_warp * kWarpsK);
  return p;
}

}  // namespace flashq::gemm
