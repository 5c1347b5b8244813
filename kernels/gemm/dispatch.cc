// Dispatch of our W4A16 / W8A16 kernels (see dispatch.h): pure host functions, built with and without CUDA.
#include "kernels/gemm/dispatch.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace flashq::gemm {

SplitPlan PlanFor(int K, int N, int target_warps) {
  SplitPlan p;
  const int nk32 = (K + kStepK - 1) / kStepK;
  p.n_blocks = (N + kBlockN - 1) / kBlockN;
  // A 32-column strip's K is cut into 2 * splits contiguous warp ranges (the small-M kernel runs
  // them as the warps of one block). Aim for ~target warps in all, at most kMaxSplits
  // splits, and each warp at least 2 stages of kSubSteps k32 steps. kTargetWarps is one wave of
  // the small-M kernel (16 warps per SM): on the H200 a second, partial wave cost 15-20% at M = 1
  // (8192^2: 13.8 us with 4224 target warps, 11.5 us with 2112; docs/perf/experiments.md).
  const int target = target_warps > 0 ? target_warps : kTargetWarps;
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

std::vector<InvariantTile> InvariantTiles() {
#define FQ_TILE(t, g, b, wn) InvariantTile{t, g, b, wn},
  return {FQ_INVARIANT_TILES(FQ_TILE)};
#undef FQ_TILE
}

// Narrow layers (at most 66 weight tiles of 64 rows: half an H200's SMs at M = 1) with rows of at least 16 KB split K
// in two at an even panel, so that small M gives every SM a block; shorter rows gain less at small M than the
// cluster exchange costs at large M (docs/perf/gemm.md). Even: stages of two panels never straddle the split.
int InvariantSplitPanel(int64_t k_bytes, int N) {
  const int64_t panels = (k_bytes + 127) / 128;
  if (N > 66 * 64 || panels < 128) return 0;
  return int((panels + 3) / 4 * 2);  // half, rounded up to an even panel
}

// From the per-tile sweep of gemm_bench --tiles on an H200 (docs/perf/gemm.md; within 3% of the sweep's best tile on
// its four shapes at M = 1..4096): the tile of the highest per-SM throughput, in the order below, that still gives
// 80% of the SMs a block. Tokens stop at the batch (rounded up to a power of two); 256 tokens only from M = 1024
// and where they fill the last wave no worse than 128 do. A grid of one to two blocks per SM runs as one wave of
// two per SM where the tile has that form. Where that gives 128 or 256 tokens, a tile of 128 tokens as wgmma's A by
// 112 or 224 weight rows takes over if it leaves the busiest SM less work: waves x (tile area + kTileOverhead), the
// larger tile on a tie. Weight tiles of 7 x 16 rows fill the last wave of layers such as N = 14336, which 64-row
// multiples leave 85% full at every M (the sweep: 4096 x 14336 W8A8 M = 256 from 28.2 to 25.5 µs, M = 1024 from 96.9
// to 89.5). The overhead stands for a tile's ring fill and epilogue, about a quarter of a 128 x 128 tile's main loop
// at K = 4096 (ncu: 21.8k cycles per tile against 16.4k of tensor work); without it, 128 x 112 tiles replaced
// 128 x 256 ones at 4096² M = 4096 for a 1.5% smaller area and ran 1.24x slower.
constexpr int64_t kTileOverhead = 4096;
InvariantTile InvariantTileFor(int M, int N, int splits, int sms) {
  sms = std::max(sms, 1);
  int fit = 8;  // the batch's width, rounded up to a power of two
  while (fit < std::min(M, 256)) fit *= 2;
  auto blocks = [&](int tokens, int rows) {
    return int64_t((M + tokens - 1) / tokens) * ((N + rows - 1) / rows) * splits;
  };
  auto last_wave_fill = [&](int64_t b) { return double(b) / (double((b + sms - 1) / sms) * sms); };
  constexpr std::pair<int, int> kOrder[] = {{256, 2}, {128, 2}, {128, 1}, {64, 2}, {64, 1}, {32, 1}, {16, 1}, {8, 1}};
  InvariantTile t;
  for (auto [tokens, groups] : kOrder) {
    if (tokens > fit) continue;
    if (tokens == 256 && (M < 1024 || last_wave_fill(blocks(256, 128)) < last_wave_fill(blocks(128, 128)))) continue;
    t = InvariantTile{tokens, groups, 1};
    if (blocks(tokens, 64 * groups) * 10 >= int64_t(sms) * 8) break;
  }
  const int64_t b = blocks(t.tokens, t.WeightRows());
  if (t.groups == 1 && t.tokens <= 64 && b > sms && b <= 2 * int64_t(sms)) t.per_sm = 2;
  if (t.tokens < 128) return t;
  auto work = [&](const InvariantTile& c) {  // the busiest SM's outputs, plus each tile's overhead
    return (blocks(c.tokens, c.WeightRows()) + sms - 1) / sms * (c.tokens * c.WeightRows() + kTileOverhead);
  };
  for (int rows : {112, 224}) {
    const InvariantTile c{128, 2, 1, rows};
    const int64_t wc = work(c), wt = work(t);
    if (wc < wt || (wc == wt && c.tokens * c.WeightRows() > t.tokens * t.WeightRows())) t = c;
  }
  return t;
}

std::vector<int> InvariantWarmupRows(int max_rows, int64_t k_bytes, int N, int sms) {
  const int splits = InvariantSplitPanel(k_bytes, N) > 0 ? 2 : 1;
  std::vector<int> rows;
  std::vector<InvariantTile> seen;
  for (int m = 1; m <= max_rows; ++m) {
    const InvariantTile t = InvariantTileFor(m, N, splits, sms);
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    rows.push_back(m);
  }
  return rows;
}

std::vector<int> WarmupRows(int max_rows) {
  return {1, std::min(kSmallMMaxRows, max_rows), std::min(kWgmmaMinRows - 1, max_rows),
          std::min(kWgmmaTileRows, max_rows), max_rows};
}

namespace detail {

// Programmatic dependent launch of every kernel here (sm_90). H200 --bars: it saves 0.8-1.5 µs per call at M <= 16,
// 0.7-1.6 µs at M = 32 and 64.
bool UsePdl(const GemmTuning& t, const DeviceInfo& d) { return t.pdl && d.major >= 9; }

// Only 2-split plans reduce through a cluster: on the H200 clusters of 2 beat the workspace + ticket reduction at
// M = 1, 16 and 64, clusters of 4 and 8 lost to it (docs/perf/experiments.md; again at M = 32 and 64 with PDL).
bool UseCluster(int splits, const GemmTuning& t, const DeviceInfo& d) {
  return t.split_k_clusters && splits == 2 && d.major >= 9;
}

// int4 with stage flush: M <= staged_max_rows, plans of kMaxSplits splits with at most kStagedMaxStages stages per
// warp range, K % 8 == 0 (16-byte rows of X). fp8: M <= staged_fp8_max_rows, 8-split plans of kStagedFp8Steps steps
// per warp range, all inside the weights. Both: at most kStagedMaxRows rows (one 8-token tile), sm_90.
bool StagedApplies(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d) {
  if (s.M > kStagedMaxRows || s.splits != kMaxSplits || d.major < 9) return false;
  if (s.fp8)
    return s.M <= t.staged_fp8_max_rows && s.steps_per_warp == kStagedFp8Steps &&
           s.nk32 == kWarpsK * kMaxSplits * kStagedFp8Steps;
  return s.stage_flush && s.M <= t.staged_max_rows && s.steps_per_warp <= kSubSteps * kStagedMaxStages && s.K % 8 == 0;
}

bool UsePairs(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d) {
  return !s.fp8 && s.stage_flush && t.strip_pairs && s.splits == kMaxSplits && d.major >= 9;
}

// int4 stage-flush launches of more than 32 rows on sm_90 with plans of at most kWgmmaMaxSplits splits, or of 8 splits
// at one token tile (the launcher also needs the grid resident for them), when the workspace holds packed X. At
// M <= 32 half the 64-token tile is empty, and 8-split plans above one token tile (4096², 14336 x 4096) would pay a
// serial split sum: the 32-token kernel is faster there (H200).
bool WgmmaApplies(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d) {
  if (s.fp8 || !s.stage_flush) return false;
  const int min_rows = t.wgmma_min_rows > kSmallMMaxRows ? t.wgmma_min_rows : kWgmmaMinRows;
  const bool sums = s.splits <= kWgmmaMaxSplits || (s.xready && s.M <= kWgmmaTileRows);
  return s.M >= min_rows && s.xpack && sums && d.major >= 9;
}

int DirectTokenTiles(int M) {
  static_assert(kSmallMMaxRows == 16, "the small-M kernel's widest instantiation holds two 8-token tiles");
  return M <= 8 ? 1 : 2;
}

// A block runs P consecutive splits one after another in one pipeline, writing each split's partial as before, so
// the sums and their order do not change. P doubles while the grid holds more than one wave (min_blocks per SM) and
// a block would still stream at most 8 pipeline stages: short warp ranges then stop paying a block's fill and drain
// per split. H200: 4096² (8 splits of 2 stages) M = 64 -12%, M = 128 -10%; the shapes with 7-8 stages per split
// gained nothing at P = 2 (docs/perf/experiments.md). Blocks that add their splits' sums themselves, in an order
// that allows it, were slower. Cluster plans keep P = 1.
int PairsPerBlock(const LaunchShape& s, int mtiles, int stage_steps, int min_blocks, const GemmTuning& t,
                  const DeviceInfo& d) {
  constexpr int kMaxStagesPerBlock = 8;
  if (UseCluster(s.splits, t, d)) return 1;
  const int nst = s.steps_per_warp / stage_steps;
  const int tiles = mtiles * ((s.N + kBlockN - 1) / kBlockN);
  const int wave = min_blocks * d.sms;
  int pairs = 1;
  while (s.splits % (2 * pairs) == 0 && tiles * (s.splits / pairs) > wave && 2 * pairs * nst <= kMaxStagesPerBlock)
    pairs *= 2;
  return pairs;
}

QLinearPath FirstPath(const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d) {
  if (StagedApplies(s, t, d)) return QLinearPath::kStaged;
  if (s.M <= kSmallMMaxRows) return QLinearPath::kDirect;
  if (WgmmaApplies(s, t, d)) return QLinearPath::kWgmma;
  return QLinearPath::kTiled;
}

}  // namespace detail
}  // namespace flashq::gemm
