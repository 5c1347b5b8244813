// The tuning of our W4A16 / W8A16 kernels: which kernel takes a launch and how it is launched. The caller passes
// it in (LinearArgs::tuning; target_warps at weight creation); the defaults are the shipped choices, which
// docs/perf/experiments.md measured. Benchmarks set fields for A/B runs, tests set them to reach every kernel.
// Nothing here changes what a kernel computes, only which kernel computes it (all give the same bits).
#pragma once

#include <atomic>
#include <cstdint>

#include "kernels/gemm/gemm_tiles.h"

namespace flashq::gemm {

// Launches of the kernels that tests check ran, counted where GemmTuning::counts points here.
struct LaunchCounts {
  std::atomic<long> staged{0};       // the staged small-M kernel (int4 and fp8)
  std::atomic<long> strip_pairs{0};  // the small-M kernel's strip pairs
};

// The tile of one launch of the invariant GEMM (invariant_gemm_kernel.cuh): `tokens` (the wgmma n, 8..256) by
// 64 x `groups` weight rows, `per_sm` blocks resident per SM (the ring is sized for them); or, with `weights` > 0,
// tokens = 64 x groups (wgmma's A) by `weights` rows (its n). Any tile gives the same bits; the choice is speed alone
// (InvariantTileFor). tokens = 0: not set.
struct InvariantTile {
  int tokens = 0, groups = 1, per_sm = 1, weights = 0;
  int WeightRows() const { return weights > 0 ? weights : 64 * groups; }
  bool operator==(const InvariantTile& o) const {
    return tokens == o.tokens && groups == o.groups && per_sm == o.per_sm && weights == o.weights;
  }
};

struct GemmTuning {
  // Split-K plan: warps (strips x warp ranges) to aim for; one wave of the small-M kernel on 132 SMs. Read when
  // weights are created (PlanFor), never per call.
  int target_warps = kTargetWarps;
  // The staged small-M kernel takes int4 launches of at most this many rows (and kStagedMaxRows); 0 turns it off.
  int staged_max_rows = kStagedMaxRows;
  // The same for W8A16 launches (the staged kernel's fp8 form).
  int staged_fp8_max_rows = kStagedMaxRows;
  // Staged launches of at most this many rows dequantize their first stage before griddepcontrol.wait, larger ones
  // after it (qlinear_staged_kernel.cuh says why).
  int staged_dequant_first_rows = 1;
  // The smallest M the sm_90 wgmma kernel takes (values <= kSmallMMaxRows mean kWgmmaMinRows; a workspace sized
  // by W4A16WorkspaceBytes holds packed X only from kWgmmaMinRows rows on).
  int wgmma_min_rows = kWgmmaMinRows;
  // int4 small-M launches of 8-split plans on sm_90 that the staged kernel does not take run as strip pairs
  // (2-block clusters).
  bool strip_pairs = true;
  // 2-split plans of the 32-token kernel reduce through a 2-block cluster on sm_90.
  bool split_k_clusters = true;
  // Programmatic dependent launch on sm_90.
  bool pdl = true;
  // How long a block of a resident wgmma grid waits for the others (in-kernel X packing, spread split sum) before its
  // fallback; 0 runs the fallbacks.
  uint32_t grid_wait_ns = 1000000;
  // The invariant GEMM's tile for every launch (sweeps; one of InvariantTiles()); tokens = 0: InvariantTileFor.
  InvariantTile invariant_tile;
  LaunchCounts* counts = nullptr;
};

}  // namespace flashq::gemm
