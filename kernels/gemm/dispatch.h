// Dispatch of our W4A16 / W8A16 kernels as pure host functions of the shape, the tuning and the device: the split-K
// plan (K and N only), which kernel takes a launch, and how it is launched. No CUDA here, so unit tests call them
// without a GPU. The launchers (qlinear_launch.cuh) follow these answers; a kernel that applies may still decline at
// launch time (shared memory, tensor map, residency), and the launcher then takes the next path.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm/gemm_tiles.h"
#include "kernels/gemm/gemm_tuning.h"

namespace flashq::gemm {

// The split-K plan our kernels use for (K, N). It depends on K and N only (never on M), which is what makes the
// kernels batch-invariant: every row sees the same partition of K into warp ranges and the same fixed-order
// reduction over them.
struct SplitPlan {
  int splits = 1, steps_per_warp = 0, n_blocks = 0;
};
SplitPlan PlanFor(int K, int N, int target_warps = kTargetWarps);

// Row counts that together load every kernel a layer can reach (M = 1, the small-M kernel's widest launch, the
// 32-token kernel below the wgmma kernel, one wgmma token tile, and max_rows), each capped at max_rows, in ascending
// order (a small max_rows repeats itself): a warm-up runs each once.
std::vector<int> WarmupRows(int max_rows);

// The invariant GEMM's tiles (tokens, weight-row groups, blocks per SM, weight rows with tokens as A or 0), each
// instantiated for every type pair (invariant_gemm_launch.cuh): X(tokens, groups, per_sm, weights) per tile.
#define FQ_INVARIANT_TILES(X)                                                                                 \
  X(8, 1, 1, 0) X(8, 1, 2, 0) X(16, 1, 1, 0) X(16, 1, 2, 0) X(32, 1, 1, 0) X(32, 1, 2, 0) X(64, 1, 1, 0)      \
      X(64, 1, 2, 0) X(64, 2, 1, 0) X(128, 1, 1, 0) X(128, 2, 1, 0) X(256, 2, 1, 0) X(128, 2, 1, 112)          \
      X(128, 2, 1, 224)
std::vector<InvariantTile> InvariantTiles();
// Where the invariant GEMM splits K for an N-column layer of k_bytes bytes per row: the 128-byte panel at which the
// second of two chains starts, or 0 (one chain). A function of the layer alone, so part of its bits.
int InvariantSplitPanel(int64_t k_bytes, int N);
// The tile for an M x N launch in `splits` parts of K (1 or 2) on a GPU of `sms` SMs (see the definition for the rule
// and the measurements).
InvariantTile InvariantTileFor(int M, int N, int splits, int sms);
// The smallest row count of each tile InvariantTileFor gives a layer (k_bytes bytes per weight row, N columns) for
// M <= max_rows, ascending: a warm-up that runs each once has loaded every kernel the layer can reach.
std::vector<int> InvariantWarmupRows(int max_rows, int64_t k_bytes, int N, int sms);

namespace detail {

struct DeviceInfo {
  int major = 0, sms = 0;  // compute capability major and SM count (0 where unknown)
};

// One launch (at most kMaxRowsPerLaunch rows) as the launchers see it.
struct LaunchShape {
  int M = 0, N = 0, K = 0, nk32 = 0, splits = 1, steps_per_warp = 0;
  bool fp8 = false;          // W8A16 (else int4)
  bool stage_flush = false;  // int4 groups of a multiple of kSubSteps k32 steps
  bool xpack = false;        // the workspace holds packed X for the wgmma kernel
  bool xready = false;       // ... and the words of its in-kernel packing
};

enum class QLinearPath {
  kStaged,  // the sm_90 staged small-M kernel (qlinear_staged_kernel.cuh)
  kDirect,  // the small-M kernel, one strip (or strip pair) per block (qlinear_direct_kernel.cuh)
  kWgmma,   // the sm_90a wgmma kernel (qlinear_wgmma_kernel.cuh)
  kTiled,   // the 32-token split-K kernel (qlinear_tiled_kernel.cuh)
};

bool UsePdl(const GemmTuning& t, const DeviceInfo& d);
// Split-K through a 2-block cluster in the 32-token kernel.
bool UseCluster(int splits, const GemmTuning& t, const DeviceInfo& d);
// The staged kernel applies (shared memory is checked at launch).
bool StagedApplies(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d);
// The small-M kernel runs strip pairs (int4 with stage flush, 8-split plans, sm_90).
bool UsePairs(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d);
// The wgmma kernel applies (the tensor map and, for 8-split plans, grid residency are checked at launch).
bool WgmmaApplies(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d);
// 8-token tiles of a small-M launch (M <= kSmallMMaxRows): 1 or 2.
int DirectTokenTiles(int M);
// Splits (warp range pairs) per block of the 32-token kernel.
int PairsPerBlock(const LaunchShape& s, int mtiles, int stage_steps, int min_blocks, const GemmTuning& t,
                  const DeviceInfo& d);
// The first path tried for a launch.
QLinearPath FirstPath(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d);

}  // namespace detail
}  // namespace flashq::gemm
