// Tile constants shared by the host-side packer (plain C++) and the CUDA kernels.
#pragma once

namespace flashq::gemm {

constexpr int kWarpN = 64;                // output columns per warp (8 mma n8 subtiles)
constexpr int kWarpsN = 2;                // warps side by side along N in a block
constexpr int kWarpsK = 4;                // warps splitting the block's K range
constexpr int kBlockN = kWarpN * kWarpsN; // 128 output columns per block
constexpr int kThreads = 32 * kWarpsN * kWarpsK;
constexpr int kStepK = 32;                // K per pipeline step (two m16n8k16 k-steps)
constexpr int kTargetBlocks = 256;
constexpr int kMaxSplits = 8;
constexpr int kMaxRowsPerLaunch = 128;    // invariant path: rows per launch (bounds split-K scratch)

}  // namespace flashq::gemm
