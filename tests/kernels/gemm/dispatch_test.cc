// Dispatch of our W4A16 / W8A16 kernels (kernels/gemm/dispatch.h) without a GPU: the split-K plan depends on K and N
// only, and the kernel choice follows the tuning and the device as the launchers expect.
#include "kernels/gemm/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace flashq::gemm {
namespace {

using detail::DeviceInfo;
using detail::LaunchShape;
using detail::QLinearPath;

constexpr DeviceInfo kH200{9, 132};
constexpr DeviceInfo kA100{8, 108};

LaunchShape Shape(int M, int K, int N, bool fp8 = false, bool stage_flush = true) {
  const SplitPlan plan = PlanFor(K, N);
  LaunchShape s;
  s.M = M;
  s.N = N;
  s.K = K;
  s.nk32 = (K + kStepK - 1) / kStepK;
  s.splits = plan.splits;
  s.steps_per_warp = plan.steps_per_warp;
  s.fp8 = fp8;
  s.stage_flush = !fp8 && stage_flush;
  s.xpack = !fp8;
  s.xready = !fp8;
  return s;
}

TEST(GemmDispatch, SplitPlanCoversKInWholeStages) {
  for (int K : {8, 64, 1000, 4096, 5496, 8192, 13312, 14336, 28672})
    for (int N : {8, 200, 1000, 4096, 14336}) {
      SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N));
      const SplitPlan p = PlanFor(K, N);
      const int nk32 = (K + kStepK - 1) / kStepK;
      EXPECT_GE(p.splits, 1);
      EXPECT_LE(p.splits, kMaxSplits);
      EXPECT_EQ(p.steps_per_warp % kSubSteps, 0);  // a warp range is whole pipeline stages
      EXPECT_GE(p.splits * p.steps_per_warp * kWarpsK, nk32);
      EXPECT_LT((p.splits - 1) * p.steps_per_warp * kWarpsK, nk32);  // no empty split
      EXPECT_EQ(p.n_blocks, (N + kBlockN - 1) / kBlockN);
    }
  EXPECT_EQ(PlanFor(64, 8).splits, 1);
}

// The plans the GPU tests and the recorded benchmarks assume (Llama-3-8B shapes).
TEST(GemmDispatch, ShippedPlans) {
  EXPECT_EQ(PlanFor(4096, 4096).splits, 8);
  EXPECT_EQ(PlanFor(4096, 4096).steps_per_warp, 8);
  EXPECT_EQ(PlanFor(8192, 8192).splits, 4);
  EXPECT_EQ(PlanFor(4096, 14336).splits, 2);
  // More target warps never mean fewer splits.
  EXPECT_GE(PlanFor(8192, 8192, 2 * kTargetWarps).splits, PlanFor(8192, 8192).splits);
}

// Batch invariance: whatever kernel takes a launch, every row of every M sees the plan of (K, N), and the 32-token
// kernel's splits per block only group whole splits.
TEST(GemmDispatch, SplitsDependOnKAndNNeverOnM) {
  const GemmTuning t;
  for (auto [K, N] : {std::pair{4096, 4096}, std::pair{8192, 8192}, std::pair{4096, 14336}, std::pair{14336, 4096}}) {
    const SplitPlan plan = PlanFor(K, N);
    std::set<QLinearPath> paths;
    for (int M = 1; M <= kMaxRowsPerLaunch; ++M) {
      const LaunchShape s = Shape(M, K, N);
      ASSERT_EQ(s.splits, plan.splits);
      ASSERT_EQ(s.steps_per_warp, plan.steps_per_warp);
      paths.insert(detail::FirstPath(s, t, kH200));
      const int pairs = detail::PairsPerBlock(s, (M + 31) / 32, kSubSteps, 2, t, kH200);
      EXPECT_GE(pairs, 1);
      EXPECT_EQ(plan.splits % pairs, 0) << "M=" << M;
    }
    EXPECT_GE(paths.size(), 2u);  // M changes the kernel, not the plan
  }
}

TEST(GemmDispatch, KernelChoiceOnSm90) {
  const GemmTuning t;
  // 4096²: an 8-split plan of 2 stages per warp range.
  EXPECT_EQ(detail::FirstPath(Shape(1, 4096, 4096), t, kH200), QLinearPath::kStaged);
  EXPECT_EQ(detail::FirstPath(Shape(kStagedMaxRows, 4096, 4096), t, kH200), QLinearPath::kStaged);
  EXPECT_EQ(detail::FirstPath(Shape(kStagedMaxRows + 1, 4096, 4096), t, kH200), QLinearPath::kDirect);
  EXPECT_EQ(detail::FirstPath(Shape(kSmallMMaxRows, 4096, 4096), t, kH200), QLinearPath::kDirect);
  EXPECT_EQ(detail::FirstPath(Shape(kWgmmaMinRows - 1, 4096, 4096), t, kH200), QLinearPath::kTiled);
  EXPECT_EQ(detail::FirstPath(Shape(kWgmmaMinRows, 4096, 4096), t, kH200), QLinearPath::kWgmma);
  EXPECT_EQ(detail::FirstPath(Shape(kWgmmaTileRows, 4096, 4096), t, kH200), QLinearPath::kWgmma);
  // 8 splits above one token tile would pay a serial split sum.
  EXPECT_EQ(detail::FirstPath(Shape(kWgmmaTileRows + 1, 4096, 4096), t, kH200), QLinearPath::kTiled);
  // 8192²: 4 splits take the wgmma kernel at any M from kWgmmaMinRows on, without the in-kernel packing words too.
  LaunchShape s = Shape(kMaxRowsPerLaunch, 8192, 8192);
  s.xready = false;
  EXPECT_EQ(detail::FirstPath(s, t, kH200), QLinearPath::kWgmma);
  s.xpack = false;  // a workspace without packed X
  EXPECT_EQ(detail::FirstPath(s, t, kH200), QLinearPath::kTiled);
  // Step flush (groups of 32 or 64) and fp8 never take the wgmma kernel; step flush never the staged one.
  EXPECT_EQ(detail::FirstPath(Shape(64, 8192, 8192, false, false), t, kH200), QLinearPath::kTiled);
  EXPECT_EQ(detail::FirstPath(Shape(1, 4096, 4096, false, false), t, kH200), QLinearPath::kDirect);
  EXPECT_EQ(detail::FirstPath(Shape(64, 4096, 4096, true), t, kH200), QLinearPath::kTiled);
  // fp8: the staged form needs 8-split plans of kStagedFp8Steps steps per warp range (4096²).
  EXPECT_EQ(detail::FirstPath(Shape(4, 4096, 4096, true), t, kH200), QLinearPath::kStaged);
  EXPECT_EQ(detail::FirstPath(Shape(4, 8192, 8192, true), t, kH200), QLinearPath::kDirect);
}

TEST(GemmDispatch, OlderGpusTakeTheSm80Kernels) {
  const GemmTuning t;
  for (int M : {1, 8, 16, 17, 33, 64, 128}) {
    const QLinearPath p = detail::FirstPath(Shape(M, 4096, 4096), t, kA100);
    EXPECT_EQ(p, M <= kSmallMMaxRows ? QLinearPath::kDirect : QLinearPath::kTiled) << "M=" << M;
  }
  EXPECT_FALSE(detail::UsePdl(t, kA100));
  EXPECT_FALSE(detail::UseCluster(2, t, kA100));
  EXPECT_FALSE(detail::UsePairs(Shape(4, 4096, 4096), t, kA100));
}

TEST(GemmDispatch, TuningTurnsPathsOff) {
  GemmTuning t;
  EXPECT_TRUE(detail::UsePdl(t, kH200));
  EXPECT_TRUE(detail::UseCluster(2, t, kH200));
  EXPECT_FALSE(detail::UseCluster(4, t, kH200));  // clusters of 4 and 8 lost to the workspace ticket
  EXPECT_TRUE(detail::UsePairs(Shape(4, 4096, 4096), t, kH200));
  EXPECT_FALSE(detail::UsePairs(Shape(4, 8192, 8192), t, kH200));  // 4 splits: one-strip blocks
  EXPECT_FALSE(detail::UsePairs(Shape(4, 4096, 4096, true), t, kH200));
  t.staged_max_rows = 0;
  EXPECT_EQ(detail::FirstPath(Shape(1, 4096, 4096), t, kH200), QLinearPath::kDirect);
  t.staged_fp8_max_rows = 0;
  EXPECT_EQ(detail::FirstPath(Shape(1, 4096, 4096, true), t, kH200), QLinearPath::kDirect);
  t.wgmma_min_rows = 1000000;
  EXPECT_EQ(detail::FirstPath(Shape(64, 8192, 8192), t, kH200), QLinearPath::kTiled);
  t.wgmma_min_rows = 1;  // at most kSmallMMaxRows: the shipped threshold
  EXPECT_EQ(detail::FirstPath(Shape(kWgmmaMinRows - 1, 8192, 8192), t, kH200), QLinearPath::kTiled);
  t.strip_pairs = false;
  t.split_k_clusters = false;
  t.pdl = false;
  EXPECT_FALSE(detail::UsePairs(Shape(4, 4096, 4096), t, kH200));
  EXPECT_FALSE(detail::UseCluster(2, t, kH200));
  EXPECT_FALSE(detail::UsePdl(t, kH200));
}

// 4096² at M = 64 on 132 SMs: 2 splits per block (two pipeline stages each) bring 512 blocks to 256, one wave of two
// blocks per SM; at M = 32 the 256 blocks already fit one wave. Cluster plans keep one split per block.
TEST(GemmDispatch, SplitsPerBlockFillOneWave) {
  const GemmTuning t;
  EXPECT_EQ(detail::PairsPerBlock(Shape(64, 4096, 4096), 2, kSubSteps, 2, t, kH200), 2);
  EXPECT_EQ(detail::PairsPerBlock(Shape(32, 4096, 4096), 1, kSubSteps, 2, t, kH200), 1);
  EXPECT_EQ(detail::PairsPerBlock(Shape(64, 4096, 14336), 2, kSubSteps, 2, t, kH200), 1);  // 2 splits: a cluster
  EXPECT_EQ(detail::DirectTokenTiles(1), 1);
  EXPECT_EQ(detail::DirectTokenTiles(8), 1);
  EXPECT_EQ(detail::DirectTokenTiles(9), 2);
  EXPECT_EQ(detail::DirectTokenTiles(kSmallMMaxRows), 2);
}

// The warm-up rows reach every kernel an sm_90 int4 layer can take.
TEST(GemmDispatch, WarmupRowsReachEveryKernel) {
  EXPECT_EQ(WarmupRows(256), (std::vector<int>{1, kSmallMMaxRows, kWgmmaMinRows - 1, kWgmmaTileRows, 256}));
  for (int m : WarmupRows(8)) EXPECT_LE(m, 8);
  const GemmTuning t;
  std::set<QLinearPath> seen;
  for (int m : WarmupRows(256))
    seen.insert(detail::FirstPath(Shape(std::min(m, kMaxRowsPerLaunch), 4096, 4096), t, kH200));
  EXPECT_EQ(seen, (std::set<QLinearPath>{QLinearPath::kStaged, QLinearPath::kDirect, QLinearPath::kWgmma,
                                         QLinearPath::kTiled}));
}

// The invariant GEMM's tile changes speed, never bits. It must be one the kernel is instantiated for, no wider than
// the batch (rounded up to a power of two), and the one the per-tile sweep measured fastest on its shapes
// (docs/perf/gemm.md). The split of K is a function of the layer alone.
TEST(GemmDispatch, InvariantTiles) {
  const std::vector<InvariantTile> all = InvariantTiles();
  for (int N : {8, 200, 4096, 14336}) {
    for (int splits : {1, 2}) {
      for (int M = 1; M <= 5000; M += (M < 300 ? 1 : 97)) {
        const InvariantTile t = InvariantTileFor(M, N, splits, kH200.sms);
        EXPECT_NE(std::find(all.begin(), all.end(), t), all.end()) << M << " " << N;
        EXPECT_LE(t.tokens, std::max(8, 2 * M - 1)) << "a tile twice as wide as the batch, M = " << M;
      }
    }
  }
  auto tile = [](int M, int N, int splits = 1) {
    const InvariantTile t = InvariantTileFor(M, N, splits, kH200.sms);
    return std::to_string(t.tokens) + "." + std::to_string(t.groups) + "." + std::to_string(t.per_sm) +
           (t.weights > 0 ? ".w" + std::to_string(t.weights) : "");
  };
  EXPECT_EQ(tile(1, 4096), "8.1.1");      // 64 blocks: no smaller tile
  EXPECT_EQ(tile(1, 4096, 2), "8.1.1");   // 128 blocks
  EXPECT_EQ(tile(1, 14336), "8.1.2");     // 224 blocks: one wave of two per SM
  EXPECT_EQ(tile(16, 8192), "16.1.1");
  EXPECT_EQ(tile(64, 4096), "32.1.1");    // 128 blocks rather than 64
  EXPECT_EQ(tile(64, 4096, 2), "64.1.1");
  EXPECT_EQ(tile(64, 14336), "64.2.1");
  EXPECT_EQ(tile(256, 4096), "128.1.1");
  EXPECT_EQ(tile(256, 4096, 2), "128.2.1");
  EXPECT_EQ(tile(512, 8192), "128.2.1");  // 256 tokens only from M = 1024
  EXPECT_EQ(tile(1024, 4096), "256.2.1");
  EXPECT_EQ(tile(1024, 4096, 2), "256.2.1");
  EXPECT_EQ(tile(1024, 8192), "256.2.1");
  // N = 14336: weight tiles of 64-row multiples leave the last wave 85% full; 112 or 224 rows, tokens as A, fill 97%.
  EXPECT_EQ(tile(128, 14336), "128.2.1.w112");  // 128 blocks in one wave, not 112
  EXPECT_EQ(tile(256, 14336), "128.2.1.w224");  // 128 blocks, not 224 in two waves
  EXPECT_EQ(tile(384, 14336), "128.2.1.w112");  // 3 waves of 112 x 128 outputs; 224 rows would take 2 of twice that
  EXPECT_EQ(tile(1024, 14336), "128.2.1.w224");
  EXPECT_EQ(tile(2048, 14336), "256.2.1");  // the same work per SM as 224 rows: the larger tile
  EXPECT_EQ(tile(4096, 14336), "256.2.1");
  EXPECT_EQ(tile(4096, 4096), "256.2.1");  // 9 waves of 128 x 112 tiles: more tiles' overhead than 4 of 128 x 256
  EXPECT_EQ(tile(4096, 4096, 2), "256.2.1");
  EXPECT_EQ(InvariantTileFor(4096, 4096, 1, 0).tokens, 256);  // SM count unknown: the largest tile

  // The split: narrow layers (N <= 66 x 64) of at least 128 panels of 128 bytes, at an even panel near the half.
  EXPECT_EQ(InvariantSplitPanel(14336 * 2, 4096), 112);
  EXPECT_EQ(InvariantSplitPanel(8200 * 2, 200), 66);  // 129 panels (a tail): 66 + 63
  EXPECT_EQ(InvariantSplitPanel(16400, 200), 66);     // E4M3
  EXPECT_EQ(InvariantSplitPanel(8192 * 2, 4224), 64);
  EXPECT_EQ(InvariantSplitPanel(8192 * 2, 4232), 0);  // wide
  EXPECT_EQ(InvariantSplitPanel(14336 * 2, 14336), 0);
  EXPECT_EQ(InvariantSplitPanel(4096 * 2, 4096), 0);  // short
  EXPECT_EQ(InvariantSplitPanel(14336, 4096), 0);     // E4M3 rows of 14336: short
  for (int64_t kb = 128 * 128; kb < 300 * 128; kb += 16) {
    const int p = InvariantSplitPanel(kb, 4096), panels = int((kb + 127) / 128);
    EXPECT_TRUE(p % 2 == 0 && p > 0 && p < panels && p >= panels - p) << kb;
  }

  // The warm-up rows reach every tile up to the server's 256-row chunks, one row count per tile.
  for (int N : {8, 4096, 14336, 28672}) {
    for (int64_t k_bytes : {int64_t(2048), int64_t(28672)}) {
      const int splits = InvariantSplitPanel(k_bytes, N) > 0 ? 2 : 1;
      const std::vector<int> rows = InvariantWarmupRows(256, k_bytes, N, kH200.sms);
      std::set<std::string> warmed;
      for (int m : rows) warmed.insert(tile(m, N, splits));
      EXPECT_EQ(warmed.size(), rows.size()) << N;
      for (int m = 1; m <= 256; ++m) EXPECT_TRUE(warmed.count(tile(m, N, splits))) << m << " " << N;
    }
  }
  EXPECT_EQ(InvariantWarmupRows(256, 2048, 4096, kH200.sms), (std::vector<int>{1, 17, 33, 65, 129}));
}

}  // namespace
}  // namespace flashq::gemm
