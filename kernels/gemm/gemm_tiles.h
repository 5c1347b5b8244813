// Tile constants shared by the host-side packer (plain C++) and the CUDA kernels.
#pragma once

namespace flashq::gemm {

constexpr int kWarpN = 32;                // output columns per warp = one packed strip (4 mma n8 subtiles)
constexpr int kWarpsN = 4;                // warps side by side along N in a block
constexpr int kWarpsK = 2;                // warps splitting the block's K range (two contiguous halves)
constexpr int kBlockN = kWarpN * kWarpsN; // 128 output columns per block
constexpr int kThreads = 32 * kWarpsN * kWarpsK;
constexpr int kStepK = 32;                // K per warp step (two m16n8k16 k-steps)
constexpr int kSubSteps = 4;              // k32 steps per int4 pipeline stage; a warp's K range is a multiple
constexpr int kTargetWarps = 2112;        // plan warps (strips x warp ranges): one wave of 16 per SM on 132 SMs
constexpr int kMaxSplits = 8;             // so a strip's 2 * splits warp ranges fit one 512-thread block
constexpr int kMaxRowsPerLaunch = 128;    // invariant path: rows per launch (bounds split-K scratch)
// The small-M kernel takes launches of up to kSmallMMaxRows rows (one instantiation for M <= 8, one for M <= 16), a
// 32-token kernel larger ones (int4 on sm_90 from kWgmmaMinRows rows: the wgmma kernel, for 8-split plans only up to
// kWgmmaTileRows).
constexpr int kSmallMMaxRows = 16;
constexpr int kWgmmaMinRows = 33;
// The staged small-M kernel (sm_90, 8-split plans) takes launches of at most kStagedMaxRows rows: one 8-token tile.
// With two it ran 0.5-0.7 µs slower than the direct small-M kernel at 4096² M = 12-16 (H200,
// docs/perf/experiments.md).
constexpr int kStagedMaxRows = 8;
constexpr int kStagedMaxStages = 4;  // int4: stages of kSubSteps k32 steps per warp range
constexpr int kStagedFp8Steps = 8;   // fp8: k32 steps per warp range
// The most splits a wgmma grid that is not resident at once takes (2 through a cluster, 3-4 through the serial
// workspace ticket); a resident grid (one token tile) takes any plan, its blocks each summing a slice. Larger plans of
// larger M stay on the 32-token kernel: clusters of 8 full-SM blocks do not fit one wave, and one block's 8-way tail
// costs more than the loop gains.
constexpr int kWgmmaMaxSplits = 4;
constexpr int kWgmmaTileRows = 64;        // sm_90 wgmma kernel (M > 32): token tile, and X packed per tile and stage
constexpr int kWgmmaXStageBytes = kWgmmaTileRows * kSubSteps * kStepK * 2;
// Stages of packed X per 64-row tile for a plan: every warp range's kSubSteps-step stages, in order.
constexpr int PackedXStages(int splits, int steps_per_warp) { return kWarpsK * splits * (steps_per_warp / kSubSteps); }
// int4 scale block per (group, strip): 32 fp16 scales, then 32 uint8 zeros at kSzZeros.
constexpr int kSzBlockBytes = 96;
constexpr int kSzZeros = 64;

}  // namespace flashq::gemm
