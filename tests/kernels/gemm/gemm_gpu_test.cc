// GPU tests (label `gpu`): every path against "dequantize W, then a float64 GEMM" on
// random data, with the output poisoned before each run; determinism; batch invariance
// (row i bitwise identical for M = 1 .. 128, 300, 4096); loader errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_ref.h"
#include "kernels/gemm/quant_formats.h"
#include "tests/kernels/gemm/gemm_test_util.h"

namespace flashq::gemm {
namespace {

using testing::GemmF64;
using testing::RandomGIdx;
using testing::RandomVec;

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define OK(x)                                  \
  do {                                         \
    Status s_ = (x);                           \
    ASSERT_TRUE(s_.ok()) << #x << ": " << s_.message(); \
  } while (0)

struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 256)) != cudaSuccess) p = nullptr;
    if (p) cudaMemset(p, 0, std::max<size_t>(bytes, 256));
  }
  ~Dev() { cudaFree(p); }
};

uint16_t ToAct(float v, ActType a) { return a == ActType::kF16 ? FloatToF16(v) : FloatToBf16(v); }
float FromAct(uint16_t v, ActType a) { return a == ActType::kF16 ? F16ToFloat(v) : Bf16ToFloat(v); }
const char* Name(ActType a) { return a == ActType::kF16 ? "f16" : "bf16"; }

// Activations rounded to the 16-bit type (what the GPU sees), as float and as bits.
struct Acts {
  std::vector<float> f;
  std::vector<uint16_t> bits;
};
Acts MakeActs(int M, int K, ActType a, uint32_t seed) {
  Acts r;
  r.f = RandomVec(size_t(M) * K, seed);
  r.bits.resize(r.f.size());
  for (size_t i = 0; i < r.f.size(); ++i) {
    r.bits[i] = ToAct(r.f[i], a);
    r.f[i] = FromAct(r.bits[i], a);
  }
  return r;
}
// Rows r0 .. r0 + n - 1 of x (K channels each).
Acts SliceRows(const Acts& x, int r0, int n, int K) {
  Acts r;
  r.f.assign(x.f.begin() + size_t(r0) * K, x.f.begin() + size_t(r0 + n) * K);
  r.bits.assign(x.bits.begin() + size_t(r0) * K, x.bits.begin() + size_t(r0 + n) * K);
  return r;
}

// Runs fn(y_dev) with y poisoned with NaN first; returns y as float.
template <typename Fn>
std::vector<float> RunPoisoned(int M, int N, ActType a, Fn fn) {
  Dev y(size_t(M) * N * 2);
  cudaMemset(y.p, 0xff, size_t(M) * N * 2);  // 0xffff is NaN in both fp16 and bf16
  fn(y.p);
  std::vector<uint16_t> h(size_t(M) * N);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), y.p, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = FromAct(h[i], a);
  return out;
}

// Norm-wise and element-wise checks against a float64 reference.
void ExpectClose(const std::vector<float>& y, const std::vector<double>& ref, ActType a, double extra_rel, const std::string& what,
                 double atol_rel = 1e-3) {
  ASSERT_EQ(y.size(), ref.size());
  double num = 0, den = 0, amax = 0;
  for (double r : ref) amax = std::max(amax, std::fabs(r));
  const double rtol = (a == ActType::kF16 ? 1.0 / 1024 : 1.0 / 128) + extra_rel;
  size_t bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_FALSE(std::isnan(y[i])) << what << ": element " << i << " not written (NaN)";
    const double e = std::fabs(double(y[i]) - ref[i]);
    num += e * e;
    den += ref[i] * ref[i];
    if (e > atol_rel * amax + rtol * std::fabs(ref[i])) ++bad;
  }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  EXPECT_LT(rel, (a == ActType::kF16 ? 1e-3 : 5e-3) + extra_rel) << what;
  EXPECT_EQ(bad, 0u) << what << ": elements outside atol + rtol*|ref| (rel norm " << rel << ")";
}

std::vector<double> RefInt4(const Acts& x, int M, const Int4Weights& w) { return GemmF64(x.f, M, w.K, DequantizeInt4(w), w.N); }

struct Ctx {
  std::unique_ptr<BlasLt> blas;
  Ctx() { EXPECT_TRUE(BlasLt::Create(32 << 20, &blas).ok()); }
};

// shared: a workspace kept across calls (else a fresh zero-filled one).
std::vector<float> RunW4(const W4A16Weights& w, const Acts& x, int M, ActType a, bool inv, BlasLt* blas, Dev* shared = nullptr,
                         const GemmTuning& tuning = {}) {
  Dev xd(x.bits.size() * 2), fresh(shared ? 0 : W4A16WorkspaceBytes(w, M, inv));
  Dev& ws = shared ? *shared : fresh;
  EXPECT_EQ(cudaMemcpy(xd.p, x.bits.data(), x.bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return RunPoisoned(M, w.N(), a, [&](void* y) {
    LinearArgs args{xd.p, y, M, a, inv, ws.p, ws.n};
    args.tuning = tuning;
    Status s = RunW4A16(w, args, blas, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
  });
}

// W8A16 in batch-invariant mode on the M rows of activation bits starting at `bits`.
std::vector<float> RunW8(const Fp8DeviceWeights& w, const uint16_t* bits, int M, ActType a, const GemmTuning& tuning = {}) {
  const size_t xbytes = size_t(M) * w.K() * 2;
  Dev xd(xbytes), ws(W8A16WorkspaceBytes(w, M));
  EXPECT_EQ(cudaMemcpy(xd.p, bits, xbytes, cudaMemcpyHostToDevice), cudaSuccess);
  return RunPoisoned(M, w.N(), a, [&](void* y) {
    LinearArgs args{xd.p, y, M, a, true, ws.p, ws.n};
    args.tuning = tuning;
    Status s = RunW8A16(w, args, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
  });
}

struct W4Case {
  int K, N, g;
  bool sym;
  int format;  // 0 RTN, 1 GPTQ v2 act-order, 2 GPTQ v1, 3 AWQ
};

class GemmGpuW4 : public ::testing::TestWithParam<std::tuple<W4Case, ActType>> {};

TEST_P(GemmGpuW4, MatchesDequantizedF64AndIsInvariant) {
  auto [c, act] = GetParam();
  Ctx ctx;
  const int g = c.g > 0 ? c.g : c.K;
  auto wf = RandomVec(size_t(c.N) * c.K, 100 + c.K + c.N);
  Int4Weights w;
  std::vector<int32_t> gi;
  if (c.format == 1) gi = RandomGIdx(c.K, g, 7);
  Int4Weights q = QuantizeInt4(wf.data(), c.N, c.K, g, c.sym, gi.empty() ? nullptr : gi.data());
  if (c.format == 0) w = q;
  if (c.format == 1) OK(UnpackGptq(PackGptq(q, false), &w));
  if (c.format == 2) OK(UnpackGptq(PackGptq(q, true), &w));
  if (c.format == 3) OK(UnpackAwq(PackAwq(q), &w));
  std::unique_ptr<W4A16Weights> dw;
  OK(W4A16Weights::Create(w, &dw));
  const int Mmax = 300;
  Acts x = MakeActs(Mmax, c.K, act, 200 + c.K);
  std::vector<float> big = RunW4(*dw, x, Mmax, act, true, nullptr);
  // 1-16: small-M kernel (one and two 8-token tiles); 17-128 per launch: QLinearKernel's 32-token tiles;
  // 300: three launches of 128, 128 and 44 rows.
  for (int M : {1, 3, 8, 12, 17, 32, 40, 64, 128}) {
    Acts xs;
    xs.f.assign(x.f.begin(), x.f.begin() + size_t(M) * c.K);
    xs.bits.assign(x.bits.begin(), x.bits.begin() + size_t(M) * c.K);
    auto y = RunW4(*dw, xs, M, act, true, nullptr);
    ExpectClose(y, RefInt4(xs, M, w), act, 0, std::string("w4a16 ") + Name(act) + " M=" + std::to_string(M));
    // Batch invariance: the same rows inside the M=300 run are bitwise identical.
    ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float))) << "batch invariance M=" << M << " vs " << Mmax;
    auto y2 = RunW4(*dw, xs, M, act, true, nullptr);
    ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << "determinism";
  }
  ExpectClose(big, RefInt4(x, Mmax, w), act, 0, "w4a16 M=300");
  // Non-invariant mode at large M: dequantize + cuBLASLt.
  auto nv = RunW4(*dw, x, Mmax, act, false, ctx.blas.get());
  // W is rounded to the 16-bit type on this path: allow that rounding in the absolute term.
  ExpectClose(nv, RefInt4(x, Mmax, w), act, 0, "w4a16 non-invariant M=300", act == ActType::kF16 ? 1e-3 : 5e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmGpuW4,
    ::testing::Combine(::testing::Values(W4Case{256, 200, 64, false, 0},    // N not a multiple of the tile
                                         W4Case{200, 136, 128, true, 0},    // K not a multiple of the group (or of 32)
                                         W4Case{512, 136, 0, false, 0},     // channelwise
                                         W4Case{512, 256, 64, false, 1},    // GPTQ act-order
                                         W4Case{1024, 384, 32, true, 2},    // GPTQ v1, split-K
                                         W4Case{1024, 520, 128, false, 3},  // AWQ
                                         W4Case{4096, 512, 128, true, 0},   // deep K, split-K
                                         W4Case{13312, 72, 128, false, 0}),  // 16 warp ranges of 28 k32 steps: the last partial, one empty
                       ::testing::Values(ActType::kBF16, ActType::kF16)));

// M rows in one call against the f64 reference, and the given rows bitwise equal to single-row calls
// (the small-M kernel) in batch-invariant mode.
void CheckRowsInvariant(int K, int N, int g, int M, std::initializer_list<int> rows) {
  auto wf = RandomVec(size_t(N) * K, 1);
  Int4Weights w = QuantizeInt4(wf.data(), N, K, g, false);
  std::unique_ptr<W4A16Weights> dw;
  OK(W4A16Weights::Create(w, &dw));
  Acts x = MakeActs(M, K, ActType::kBF16, 2);
  auto big = RunW4(*dw, x, M, ActType::kBF16, true, nullptr);
  ExpectClose(big, RefInt4(x, M, w), ActType::kBF16, 0, "w4a16 M=" + std::to_string(M));
  for (int row : rows) {
    auto one = RunW4(*dw, SliceRows(x, row, 1, K), 1, ActType::kBF16, true, nullptr);
    ASSERT_EQ(0, std::memcmp(one.data(), big.data() + size_t(row) * N, N * sizeof(float))) << "row " << row;
  }
}

TEST(GemmGpu, W4A16InvariantAt4096Rows) { CheckRowsInvariant(256, 192, 128, 4096, {0, 1234, 4095}); }

// 4096² has 8 splits of 2 stages: M = 32 takes one split per QLinearKernel block; at M = 64 and 128 the grid
// exceeds a wave on any GPU of fewer than 256 SMs, so blocks run 2 or 4 splits one after another
// (PairsPerBlock). For whole-stage groups (128) and groups of one k32 step (64, the per-step flush).
TEST(GemmGpu, W4A16InvariantWithSeveralSplitsPerBlock) {
  for (int g : {128, 64})
    for (int M : {32, 64, 128}) {
      SCOPED_TRACE("group " + std::to_string(g) + " M=" + std::to_string(M));
      CheckRowsInvariant(4096, 4096, g, M, {0, 17, M - 1});
    }
}

// The small-M kernel's steady passes (int4 groups of 128: one token tile on plans of fewer than 8 splits, two on every
// plan). 2040 x 14344 plans 2 splits of 16 k32 steps per warp range, 14320 x 3976 8 splits (strip pairs, an odd number
// of strips) of 28; K ends inside a step and N inside a strip, so the last warp range's last passes are checked ones.
// Rows of M = 12 (two token tiles) and, on the first, M = 40 against the f64 reference and bitwise equal to single-row
// calls.
TEST(GemmGpu, W4A16SteadyPassesKeepTheBits) {
  for (int M : {12, 40}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    CheckRowsInvariant(2040, 14344, 128, M, {0, 5, M - 1});
  }
  SCOPED_TRACE("14320 x 3976, M=12");
  CheckRowsInvariant(14320, 3976, 128, 12, {0, 5, 11});
}

// The small-M kernel on a plan of 8 splits (one 512-thread block per strip) against QLinearKernel: 4096² at M = 1, 4
// (one token tile) and 12 (two), int4 (groups of 128: stage flush; 64: step flush) and W8A16, against the f64
// reference and bitwise equal to the first rows of M = 32.
TEST(GemmGpu, EightSplitSmallMMatchesQLinearKernel) {
  const int K = 4096, N = 4096;
  Acts x = MakeActs(32, K, ActType::kBF16, 8);
  for (int g : {128, 64}) {
    Int4Weights w = QuantizeInt4(RandomVec(size_t(N) * K, 7).data(), N, K, g, false);
    std::unique_ptr<W4A16Weights> dw;
    OK(W4A16Weights::Create(w, &dw));
    const auto deq = DequantizeInt4(w);
    auto big = RunW4(*dw, x, 32, ActType::kBF16, true, nullptr);
    for (int M : {1, 4, 12}) {
      SCOPED_TRACE("w4a16 g" + std::to_string(g) + " M=" + std::to_string(M));
      Acts r = SliceRows(x, 0, M, K);
      auto y = RunW4(*dw, r, M, ActType::kBF16, true, nullptr);
      ExpectClose(y, GemmF64(r.f, M, K, deq, N), ActType::kBF16, 0, "w4a16 4096^2");
      ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float)));
    }
  }
  Fp8Weights w = QuantizeFp8(RandomVec(size_t(N) * K, 9).data(), N, K, true);
  std::unique_ptr<Fp8DeviceWeights> dw;
  OK(Fp8DeviceWeights::Create(w, &dw));
  const auto deq = DequantizeFp8(w);
  auto big = RunW8(*dw, x.bits.data(), 32, ActType::kBF16);
  for (int M : {1, 4, 12}) {
    SCOPED_TRACE("w8a16 M=" + std::to_string(M));
    auto y = RunW8(*dw, x.bits.data(), M, ActType::kBF16);
    ExpectClose(y, GemmF64(SliceRows(x, 0, M, K).f, M, K, deq, N), ActType::kBF16, 0, "w8a16 4096^2");
    ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float)));
  }
}

// The staged small-M kernel (8-split plans, M <= kStagedMaxRows, sm_90) against QLinearDirectKernel, bitwise, and
// against the f64 reference: 4096² (2 stages per warp range), 5496 x 1000 (K a multiple of neither the step nor the
// group: 172 k32 steps over 16 warp ranges of 12, so the last ranges hold part of a stage or nothing; N not a multiple
// of the strip) and 8192 x 2048 (4 stages per range). M = 1 dequantizes before the grid wait, M = 3-8 after it. Where X
// does not fit beside the weights, or M is past kStagedMaxRows, the direct kernel runs.
TEST(GemmGpu, W4A16StagedKernelKeepsTheBits) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  // fits: the most rows whose X fits beside the weights in the H200's 227 KB of shared memory per block.
  for (auto [K, N, fits] : {std::tuple{4096, 4096, 16}, std::tuple{5496, 1000, 10}, std::tuple{8192, 2048, 6}}) {
    Int4Weights w = QuantizeInt4(RandomVec(size_t(N) * K, 11).data(), N, K, 128, false);
    std::unique_ptr<W4A16Weights> dw;
    OK(W4A16Weights::Create(w, &dw));
    ASSERT_EQ(PlanFor(K, N).splits, 8);
    const auto deq = DequantizeInt4(w);
    for (ActType act : {ActType::kBF16, ActType::kF16}) {
      for (int M : {1, 3, 4, 8, 9, 16}) {
        SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N) + (act == ActType::kF16 ? " f16" : " bf16") +
                     " M=" + std::to_string(M));
        Acts x = MakeActs(M, K, act, 5 + M);
        LaunchCounts counts;
        GemmTuning on;
        on.counts = &counts;
        auto staged = RunW4(*dw, x, M, act, true, nullptr, nullptr, on);
        EXPECT_EQ(counts.staged.load(), major >= 9 && M <= std::min(fits, kStagedMaxRows) ? 1 : 0);
        GemmTuning off;
        off.staged_max_rows = 0;
        auto direct = RunW4(*dw, x, M, act, true, nullptr, nullptr, off);
        ExpectClose(staged, GemmF64(x.f, M, K, deq, N), act, 0, "staged");
        ASSERT_EQ(0, std::memcmp(staged.data(), direct.data(), staged.size() * sizeof(float)));
      }
    }
  }
}

// Strip pairs (QLinearDirectKernel kPair: int4 with stage flush, 8-split plans, 2-block clusters on sm_90) against the
// one-strip blocks, bitwise, and against the f64 reference, with the staged kernel off so that the pairs take M = 1-8
// (one token tile) as well as 9-16 (two): 4096 x 512 (2 stages per warp range: 2 weight steps before the grid wait),
// 5496 x 1000 (K a multiple of neither the step nor the group, so the last warp ranges hold part of a stage or nothing;
// N ends inside the last strip), 8192 x 2048, and 13312 x 200 (16 warp ranges of 28 k32 steps, the last partial;
// 7 strips, so the last pair's second strip lies past N), bf16 and fp16.
TEST(GemmGpu, W4A16StripPairsKeepTheBits) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  GemmTuning staged_off;  // the pairs then take M <= 8 too
  staged_off.staged_max_rows = 0;
  for (auto [K, N] : {std::pair{4096, 512}, std::pair{5496, 1000}, std::pair{8192, 2048}, std::pair{13312, 200}}) {
    Int4Weights w = QuantizeInt4(RandomVec(size_t(N) * K, 13).data(), N, K, 128, false);
    std::unique_ptr<W4A16Weights> dw;
    OK(W4A16Weights::Create(w, &dw));
    ASSERT_EQ(PlanFor(K, N).splits, 8);
    const auto deq = DequantizeInt4(w);
    for (ActType act : {ActType::kBF16, ActType::kF16}) {
      for (int M : {1, 5, 8, 9, 12, 16}) {
        SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N) + (act == ActType::kF16 ? " f16" : " bf16") +
                     " M=" + std::to_string(M));
        Acts x = MakeActs(M, K, act, 21 + M);
        LaunchCounts counts;
        GemmTuning pairs = staged_off;
        pairs.counts = &counts;
        auto paired = RunW4(*dw, x, M, act, true, nullptr, nullptr, pairs);
        EXPECT_EQ(counts.strip_pairs.load(), major >= 9 ? 1 : 0);
        GemmTuning one_strip = staged_off;
        one_strip.strip_pairs = false;
        auto single = RunW4(*dw, x, M, act, true, nullptr, nullptr, one_strip);
        ExpectClose(paired, GemmF64(x.f, M, K, deq, N), act, 0, "strip pairs");
        ASSERT_EQ(0, std::memcmp(paired.data(), single.data(), paired.size() * sizeof(float)));
      }
    }
  }
}

// The staged kernel's fp8 form (W8A16, 8-split plans of 8 steps per warp range, M <= kStagedMaxRows, sm_90) against
// QLinearDirectKernel, bitwise, and against the f64 reference: 4096² and 4072 x 1000 (K not a multiple of the step:
// X past K reads zeros; N not a multiple of the strip), per-channel and per-tensor scales. M = 9 and 16 take the
// direct kernel.
TEST(GemmGpu, W8A16StagedKernelKeepsTheBits) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  for (auto [K, N, per_channel] : {std::tuple{4096, 4096, true}, std::tuple{4072, 1000, false}}) {
    Fp8Weights w = QuantizeFp8(RandomVec(size_t(N) * K, 13).data(), N, K, per_channel);
    std::unique_ptr<Fp8DeviceWeights> dw;
    OK(Fp8DeviceWeights::Create(w, &dw));
    ASSERT_EQ(PlanFor(K, N).splits, 8);
    ASSERT_EQ(PlanFor(K, N).steps_per_warp, 8);
    const auto deq = DequantizeFp8(w);
    for (ActType act : {ActType::kBF16, ActType::kF16}) {
      for (int M : {1, 3, 8, 9, 16}) {
        SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N) + (act == ActType::kF16 ? " f16" : " bf16") +
                     " M=" + std::to_string(M));
        Acts x = MakeActs(M, K, act, 7 + M);
        LaunchCounts counts;
        GemmTuning on;
        on.counts = &counts;
        auto staged = RunW8(*dw, x.bits.data(), M, act, on);
        EXPECT_EQ(counts.staged.load(), major >= 9 && M <= kStagedMaxRows ? 1 : 0);
        GemmTuning off;
        off.staged_fp8_max_rows = 0;
        auto direct = RunW8(*dw, x.bits.data(), M, act, off);
        ExpectClose(staged, GemmF64(x.f, M, K, deq, N), act, 0, "staged fp8");
        ASSERT_EQ(0, std::memcmp(staged.data(), direct.data(), staged.size() * sizeof(float)));
      }
    }
  }
}

// The wgmma kernel's fallbacks for a grid that the occupancy API calls resident but is not (in-kernel X packing:
// a block packs all of X itself; spread split sum: a block gives up and the last to arrive sums the whole tile).
// With no wait they run on most blocks of every call, and must give the bits of the normal path. On an H200 these
// plans have 8 (4096²), 4 (8192²) and 2 (4096 x 14336) splits.
TEST(GemmGpu, W4A16ResidentGridFallbacksKeepTheBits) {
  for (auto [K, N] : {std::pair{4096, 4096}, std::pair{8192, 8192}, std::pair{4096, 14336}}) {
    auto wf = RandomVec(size_t(N) * K, 3);
    std::unique_ptr<W4A16Weights> dw;
    OK(W4A16Weights::Create(QuantizeInt4(wf.data(), N, K, 128, false), &dw));
    for (int M : {40, 64}) {
      SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N) + " M=" + std::to_string(M));
      Acts x = MakeActs(M, K, ActType::kBF16, 4);
      auto normal = RunW4(*dw, x, M, ActType::kBF16, true, nullptr);
      GemmTuning no_wait;
      no_wait.grid_wait_ns = 0;
      auto fallback = RunW4(*dw, x, M, ActType::kBF16, true, nullptr, nullptr, no_wait);
      ASSERT_EQ(0, std::memcmp(normal.data(), fallback.data(), normal.size() * sizeof(float)));
    }
  }
}

// One workspace through calls of different M, as a server's layer has: what a call leaves in it (split partials,
// packed X) must not reach the next call, whatever its M. Each call's rows against a fresh workspace's, bitwise. On
// an H200 these plans have 8 (4096²: spread split sum), 4 (8192²) and 2 (4096 x 14336) splits.
TEST(GemmGpu, W4A16WorkspaceReuseAcrossM) {
  for (auto [K, N] : {std::pair{4096, 4096}, std::pair{8192, 8192}, std::pair{4096, 14336}}) {
    std::unique_ptr<W4A16Weights> dw;
    OK(W4A16Weights::Create(QuantizeInt4(RandomVec(size_t(N) * K, 5).data(), N, K, 128, false), &dw));
    Acts x = MakeActs(128, K, ActType::kBF16, 6);
    Dev ws(W4A16WorkspaceBytes(*dw, 128, true));
    for (int M : {64, 40, 128, 33, 64, 1, 40, 16, 64}) {
      SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N) + " M=" + std::to_string(M));
      Acts r = SliceRows(x, 128 - M, M, K);  // other rows each time
      auto reused = RunW4(*dw, r, M, ActType::kBF16, true, nullptr, &ws);
      auto fresh = RunW4(*dw, r, M, ActType::kBF16, true, nullptr);
      ASSERT_EQ(0, std::memcmp(reused.data(), fresh.data(), fresh.size() * sizeof(float)));
    }
  }
}

TEST(GemmGpu, W4A16ShapeErrorsNameTheConstraint) {
  std::unique_ptr<W4A16Weights> dw;
  Int4Weights a = QuantizeInt4(RandomVec(64 * 100, 1).data(), 64, 100, 32, true);  // K % 8 != 0
  Status s = W4A16Weights::Create(a, &dw);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 8"), std::string::npos) << s.message();
  Int4Weights b = QuantizeInt4(RandomVec(64 * 96, 1).data(), 64, 96, 48, true);  // group 48
  s = W4A16Weights::Create(b, &dw);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
}

class GemmGpuFp8 : public ::testing::TestWithParam<std::tuple<bool, ActType>> {};

TEST_P(GemmGpuFp8, W8A16MatchesAndIsInvariant) {
  auto [per_channel, act] = GetParam();
  const int K = 1000, N = 328;  // K not a multiple of 32, N not a multiple of the tile
  auto wf = RandomVec(size_t(N) * K, 31);
  Fp8Weights w = QuantizeFp8(wf.data(), N, K, per_channel);
  std::unique_ptr<Fp8DeviceWeights> dw;
  OK(Fp8DeviceWeights::Create(w, &dw));
  const int Mmax = 150;
  Acts x = MakeActs(Mmax, K, act, 32);
  auto deq = DequantizeFp8(w);
  auto run = [&](int M) { return RunW8(*dw, x.bits.data(), M, act); };
  auto big = run(Mmax);
  Acts all = x;
  ExpectClose(big, GemmF64(all.f, Mmax, K, deq, N), act, 0, "w8a16 M=150");
  for (int M : {1, 3, 8, 12, 17}) {
    auto y = run(M);
    std::vector<float> xf(x.f.begin(), x.f.begin() + size_t(M) * K);
    ExpectClose(y, GemmF64(xf, M, K, deq, N), act, 0, "w8a16 M=" + std::to_string(M));
    ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float))) << "batch invariance M=" << M;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GemmGpuFp8,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(ActType::kBF16, ActType::kF16)));

// W8A16 at 4096²: 8 splits of 4 stages, so QLinearKernel blocks run 2 splits each at M = 128 (on fewer than 512
// SMs) and one at M = 32; rows bitwise equal to single-row calls (the small-M kernel).
TEST(GemmGpu, W8A16InvariantWithSeveralSplitsPerBlock) {
  const int K = 4096, N = 4096;
  Fp8Weights w = QuantizeFp8(RandomVec(size_t(N) * K, 5).data(), N, K, true);
  std::unique_ptr<Fp8DeviceWeights> dw;
  OK(Fp8DeviceWeights::Create(w, &dw));
  const auto deq = DequantizeFp8(w);
  Acts x = MakeActs(128, K, ActType::kBF16, 6);
  auto run = [&](const uint16_t* bits, int M) { return RunW8(*dw, bits, M, ActType::kBF16); };
  for (int M : {32, 128}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    auto big = run(x.bits.data(), M);
    std::vector<float> xf(x.f.begin(), x.f.begin() + size_t(M) * K);
    ExpectClose(big, GemmF64(xf, M, K, deq, N), ActType::kBF16, 0, "w8a16 4096^2 M=" + std::to_string(M));
    for (int row : {0, 17, M - 1}) {
      auto one = run(x.bits.data() + size_t(row) * K, 1);
      ASSERT_EQ(0, std::memcmp(one.data(), big.data() + size_t(row) * N, N * sizeof(float))) << "row " << row;
    }
  }
}

// The first M rows of x (K channels of bf16) quantized to E4M3 on the device, as the server does: into xq [M][K] and
// its scales xs.
void QuantizeOnDevice(const Acts& x, int M, int K, bool per_row, const Dev& xq, const Dev& xs) {
  Dev xd(size_t(M) * K * 2);
  CK(cudaMemcpy(xd.p, x.bits.data(), size_t(M) * K * 2, cudaMemcpyHostToDevice));
  OK(RunQuantizeActFp8(xd.p, ActType::kBF16, M, K, per_row, static_cast<uint8_t*>(xq.p), static_cast<float*>(xs.p),
                       nullptr));
}

// W8A8 arguments over activations already quantized into xq (E4M3) and xs (scales).
W8A8Args QuantizedArgs(const Dev& xq, const Dev& xs, void* y, int M, bool per_row, bool invariant,
                       ActType out = ActType::kBF16) {
  W8A8Args a;
  a.x_fp8 = static_cast<const uint8_t*>(xq.p);
  a.x_scale = static_cast<const float*>(xs.p);
  a.per_row_act = per_row;
  a.y = y;
  a.M = M;
  a.out = out;
  a.batch_invariant = invariant;
  return a;
}

class GemmGpuW8A8 : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// W8A8 through RunW8A8 (per-channel or per-tensor weights, per-row or per-tensor activations), BF16 output. Both modes
// match the reference; with per-row activation scales the invariant mode is also bitwise batch-invariant.
TEST_P(GemmGpuW8A8, QuantizeAndGemmMatchReference) {
  const auto [per_channel, per_row] = GetParam();
  Ctx ctx;
  const int K = 512, N = 272;
  auto wf = RandomVec(size_t(N) * K, 41);
  Fp8Weights w = QuantizeFp8(wf.data(), N, K, per_channel);
  std::unique_ptr<Fp8DeviceWeights> dw;
  OK(Fp8DeviceWeights::Create(w, &dw));
  const int Mmax = 64;
  Acts x = MakeActs(Mmax, K, ActType::kBF16, 42);
  const std::string name = std::string("w8a8 w/") + (per_channel ? "channel" : "tensor") + " x/" + (per_row ? "row" : "tensor");
  std::vector<float> big;  // invariant mode at Mmax
  // Fast mode: 4 takes the choice timed at 3, and 20 and 31 the one timed at 17 (buckets of M).
  for (int M : {Mmax, 1, 3, 4, 17, 20, 31}) {
    Dev xq(size_t(M) * K), xs(size_t(M) * 4);
    ASSERT_NO_FATAL_FAILURE(QuantizeOnDevice(x, M, K, per_row, xq, xs));
    // Same bits as the host quantizer.
    std::vector<uint8_t> hq(size_t(M) * K), rq(size_t(M) * K);
    std::vector<float> hs(M), rs(M);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hq.data(), xq.p, hq.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs.data(), xs.p, M * 4, cudaMemcpyDeviceToHost));
    QuantizeActFp8(x.f.data(), M, K, per_row, rq.data(), rs.data());
    ASSERT_EQ(hq, rq) << "activation fp8 bits";
    ASSERT_EQ(hs, rs) << "activation scales";
    std::vector<float> ref(size_t(M) * N);
    LinearRefFp8W8A8<double>(x.f.data(), M, w, per_row, ref.data());
    std::vector<double> refd(ref.begin(), ref.end());
    for (bool inv : {true, false}) {
      auto y = RunPoisoned(M, N, ActType::kBF16, [&](void* yp) {
        Status s = RunW8A8(ctx.blas.get(), *dw, QuantizedArgs(xq, xs, yp, M, per_row, inv), nullptr);
        EXPECT_TRUE(s.ok()) << s.message();
      });
      const std::string what = name + (inv ? " invariant" : " fast") + " M=" + std::to_string(M);
      ExpectClose(y, refd, ActType::kBF16, 0, what);
      if (!inv || !per_row) continue;
      if (M == Mmax) big = y;
      else ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float))) << "batch invariance " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Scales, GemmGpuW8A8, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// W8A8 on our invariant GEMM: row-wise and tensor-wise activation scales with per-channel and per-tensor weights,
// against the float64 reference, and every M from 1 to 300 bitwise equal to the first M rows of the M = 300 call on
// the same quantized batch (row-wise, the first M rows' quantization is that of the whole batch).
TEST(GemmGpu, W8A8InvariantMatchesAndIsInvariant) {
  const int K = 512, N = 272, M = 300;
  for (auto [per_channel, per_row] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
    auto wf = RandomVec(size_t(N) * K, 71);
    Fp8Weights w = QuantizeFp8(wf.data(), N, K, per_channel);
    std::unique_ptr<Fp8DeviceWeights> dw;
    OK(Fp8DeviceWeights::Create(w, &dw));
    for (ActType out : {ActType::kBF16, ActType::kF16}) {
      const Acts x = MakeActs(M, K, ActType::kBF16, 72);
      Dev xq(size_t(M) * K), xs(size_t(M) * 4);
      ASSERT_NO_FATAL_FAILURE(QuantizeOnDevice(x, M, K, per_row, xq, xs));
      auto run = [&](int m) {
        return RunPoisoned(m, N, out, [&](void* yp) {
          Status s = RunW8A8Invariant(*dw, QuantizedArgs(xq, xs, yp, m, per_row, true, out), nullptr);
          EXPECT_TRUE(s.ok()) << s.message();
        });
      };
      const std::vector<float> big = run(M);
      std::vector<float> ref(size_t(M) * N);
      LinearRefFp8W8A8<double>(x.f.data(), M, w, per_row, ref.data());
      const std::string what = std::string("w8a8 ours w/") + (per_channel ? "channel" : "tensor") + " x/" +
                               (per_row ? "row" : "tensor") + " out " + Name(out);
      ExpectClose(big, std::vector<double>(ref.begin(), ref.end()), out, 0, what);
      for (int m = 1; m < M; ++m) {
        const std::vector<float> y = run(m);
        ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float))) << what << ": M=" << m;
      }
    }
  }
}

// FP8 weights made for one path (Fp8Paths) hold only that path's copy: fewer device bytes than kBoth, the same bits on
// their own path (and on a clone), and a clear InvalidArgument from the other path's run_* call.
TEST(GemmGpu, Fp8WeightsForOnePathHoldOneCopy) {
  Ctx ctx;
  const int K = 512, N = 272, M = 12;
  Fp8Weights w = QuantizeFp8(RandomVec(size_t(N) * K, 43).data(), N, K, true);
  std::unique_ptr<Fp8DeviceWeights> both, w16, w8;
  OK(Fp8DeviceWeights::Create(w, &both));
  OK(Fp8DeviceWeights::Create(w, &w16, Fp8Paths::kW8A16));
  OK(Fp8DeviceWeights::Create(w, &w8, Fp8Paths::kW8A8));
  EXPECT_LT(w16->device_bytes(), both->device_bytes());
  EXPECT_LT(w8->device_bytes(), both->device_bytes());
  EXPECT_LE(w16->device_bytes() + w8->device_bytes(), both->device_bytes());
  EXPECT_EQ(w16->paths(), Fp8Paths::kW8A16);

  Acts x = MakeActs(M, K, ActType::kBF16, 44);
  std::unique_ptr<Fp8DeviceWeights> w16c;
  OK(w16->Clone(&w16c));
  const auto ref16 = RunW8(*both, x.bits.data(), M, ActType::kBF16);
  for (const Fp8DeviceWeights* d : {w16.get(), w16c.get()}) {
    const auto y = RunW8(*d, x.bits.data(), M, ActType::kBF16);
    ASSERT_EQ(0, std::memcmp(y.data(), ref16.data(), y.size() * sizeof(float))) << "W8A16 on kW8A16 weights";
  }

  Dev xd(size_t(M) * K * 2), xq(size_t(M) * K), xs(size_t(M) * 4), y(size_t(M) * N * 2);
  CK(cudaMemcpy(xd.p, x.bits.data(), size_t(M) * K * 2, cudaMemcpyHostToDevice));
  OK(RunQuantizeActFp8(xd.p, ActType::kBF16, M, K, true, static_cast<uint8_t*>(xq.p), static_cast<float*>(xs.p), nullptr));
  W8A8Args a;
  a.x_fp8 = static_cast<uint8_t*>(xq.p);
  a.x_scale = static_cast<float*>(xs.p);
  a.M = M;
  auto run8 = [&](const Fp8DeviceWeights& d) {
    return RunPoisoned(M, N, ActType::kBF16, [&](void* yp) {
      W8A8Args b = a;
      b.y = yp;
      Status s = RunW8A8(ctx.blas.get(), d, b, nullptr);
      EXPECT_TRUE(s.ok()) << s.message();
    });
  };
  const auto ref8 = run8(*both), y8 = run8(*w8);
  ASSERT_EQ(0, std::memcmp(y8.data(), ref8.data(), y8.size() * sizeof(float))) << "W8A8 on kW8A8 weights";

  a.y = y.p;
  const Status s8 = RunW8A8(ctx.blas.get(), *w16, a, nullptr);
  EXPECT_EQ(s8.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s8.message().find("created for W8A16 only"), std::string::npos) << s8.message();
  Dev ws(W8A16WorkspaceBytes(*w8, M));
  const Status s16 = RunW8A16(*w8, LinearArgs{xd.p, y.p, M, ActType::kBF16, true, ws.p, ws.n}, nullptr);
  EXPECT_EQ(s16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s16.message().find("created for W8A8 only"), std::string::npos) << s16.message();
}

// Random N x K weights rounded to the 16-bit type: the rounded values (for the reference) and a device copy.
struct Act16Weights {
  std::vector<float> f;
  std::unique_ptr<Dev> dev;
};
Act16Weights MakeAct16Weights(int N, int K, ActType act, uint32_t seed) {
  Act16Weights w{RandomVec(size_t(N) * K, seed), nullptr};
  std::vector<uint16_t> bits(w.f.size());
  for (size_t i = 0; i < w.f.size(); ++i) {
    bits[i] = ToAct(w.f[i], act);
    w.f[i] = FromAct(bits[i], act);
  }
  w.dev = std::make_unique<Dev>(bits.size() * 2);
  EXPECT_EQ(cudaMemcpy(w.dev->p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return w;
}

TEST(GemmGpu, Bf16CublasLtMatchesAndPinnedAlgoIsInvariant) {
  Ctx ctx;
  const int K = 512, N = 384, M = 4096;
  for (ActType act : {ActType::kBF16, ActType::kF16}) {
    const Act16Weights w = MakeAct16Weights(N, K, act, 51);
    Acts x = MakeActs(M, K, act, 52);
    Dev xd(x.bits.size() * 2);
    CK(cudaMemcpy(xd.p, x.bits.data(), x.bits.size() * 2, cudaMemcpyHostToDevice));
    std::vector<float> big;
    for (int m : {M, 1, 17, 24}) {
      std::vector<float> xf(x.f.begin(), x.f.begin() + size_t(std::min(m, 64)) * K);
      auto ref = GemmF64(xf, std::min(m, 64), K, w.f, N);
      // Fast mode: algorithm timed by the first call (after a warm-up that only plans, at M = 17); M = 24 takes the
      // choice of its bucket (17-32).
      if (m == 17) OK(WarmBf16(ctx.blas.get(), m, N, K, act, false));
      for (bool inv : {true, false}) {
        auto y = RunPoisoned(m, N, act, [&](void* yp) {
          LinearArgs a{xd.p, yp, m, act, inv, nullptr, 0};
          Status s = RunBf16(ctx.blas.get(), w.dev->p, N, K, a, nullptr);
          EXPECT_TRUE(s.ok()) << s.message();
        });
        std::vector<float> yh(y.begin(), y.begin() + ref.size());
        ExpectClose(yh, ref, act, 0, std::string("cublasLt ") + Name(act) + (inv ? "" : " fast") + " M=" + std::to_string(m));
        if (!inv) continue;
        if (m == M) big = y;
        else ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float))) << "pinned algorithm invariance M=" << m;
      }
    }
  }
}


// 16-bit weights in the batch-invariant mode on our kernel: against float64, every output written (NaN poison), and
// every M from 1 to 300 bitwise equal to the first M rows of the M = 300 call (M picks the tile, so this crosses every
// tile shape the dispatch uses at these sizes). Shapes with K and N tails of the 64-wide boxes; the last splits K.
std::vector<float> RunW16(const Act16Weights& w, int N, int K, const uint16_t* bits, int M, ActType a,
                          InvariantTile tile = {}) {
  Dev xd(size_t(M) * K * 2);
  EXPECT_EQ(cudaMemcpy(xd.p, bits, size_t(M) * K * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return RunPoisoned(M, N, a, [&](void* y) {
    LinearArgs args{xd.p, y, M, a, true, nullptr, 0};
    args.tuning.invariant_tile = tile;
    Status s = RunW16Invariant(w.dev->p, N, K, args, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
  });
}

TEST(GemmGpu, W16InvariantMatchesF64AndIsInvariant) {
  for (ActType act : {ActType::kBF16, ActType::kF16}) {
    for (auto [K, N] : {std::pair{512, 384}, std::pair{72, 200}, std::pair{1000, 136}, std::pair{8200, 136}}) {
      const Act16Weights w = MakeAct16Weights(N, K, act, 61);
      const int M = 300;
      const Acts x = MakeActs(M, K, act, 62);
      const std::vector<float> big = RunW16(w, N, K, x.bits.data(), M, act);
      ExpectClose(big, GemmF64(x.f, M, K, w.f, N), act, 0,
                  std::string("w16 ") + Name(act) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
      for (int m = 1; m < M; ++m) {
        const std::vector<float> y = RunW16(w, N, K, x.bits.data(), m, act);
        ASSERT_EQ(0, std::memcmp(y.data(), big.data(), y.size() * sizeof(float)))
            << Name(act) << " K=" << K << " N=" << N << ": rows of M=" << m << " differ from the same rows at M=" << M;
      }
    }
  }
}

// Large M (the 256-token, two-warpgroup tile): rows of a 4096-row call against single-row and 17-row calls of the
// same rows, from anywhere in the batch.
TEST(GemmGpu, W16InvariantAt4096Rows) {
  const int K = 256, N = 2048, M = 4096;
  const ActType act = ActType::kBF16;
  ASSERT_EQ(InvariantTileFor(M, N, 1, 132).tokens, 256);
  ASSERT_EQ(InvariantSplitPanel(K * 2, N), 0);
  const Act16Weights w = MakeAct16Weights(N, K, act, 63);
  const Acts x = MakeActs(M, K, act, 64);
  const std::vector<float> big = RunW16(w, N, K, x.bits.data(), M, act);
  const Acts head = SliceRows(x, 0, 64, K);
  const std::vector<float> head_big(big.begin(), big.begin() + size_t(64) * N);
  ExpectClose(head_big, GemmF64(head.f, 64, K, w.f, N), act, 0, "w16 bf16 M=4096, first 64 rows");
  for (int r0 : {0, 1234, 4095 - 16}) {
    for (int m : {1, 17}) {
      const std::vector<float> y = RunW16(w, N, K, x.bits.data() + size_t(r0) * K, m, act);
      ASSERT_EQ(0, std::memcmp(y.data(), big.data() + size_t(r0) * N, y.size() * sizeof(float)))
          << "rows " << r0 << ".." << r0 + m - 1 << " alone differ from the same rows at M=4096";
    }
  }
}

// Every instantiated tile, forced (GemmTuning::invariant_tile), gives the dispatch's bits: 16-bit and W8A8, M with
// token tails, N with a weight-row tail, K with a tail of the 128-byte panel; K split in two chains (a narrow layer
// of long rows, its rows longer than every ring, so that slots are refilled) and K in one, each against float64.
TEST(GemmGpu, InvariantTilesAllGiveTheSameBits) {
  const int N = 200;
  // (16-bit K, W8A8 K): W8A8 needs K % 16 == 0
  for (auto [K, K8] : {std::pair{8200, 16400}, std::pair{1000, 992}}) {
    const bool split = K > 2048;
    ASSERT_EQ(InvariantSplitPanel(int64_t(K) * 2, N) > 0, split);
    ASSERT_EQ(InvariantSplitPanel(K8, N) > 0, split);
    const Act16Weights w = MakeAct16Weights(N, K, ActType::kBF16, 66);
    const auto w8f = RandomVec(size_t(N) * K8, 67);
    const Fp8Weights w8 = QuantizeFp8(w8f.data(), N, K8, true);
    std::unique_ptr<Fp8DeviceWeights> dw8;
    OK(Fp8DeviceWeights::Create(w8, &dw8));
    for (int M : {1, 37, 300}) {
      const Acts x = MakeActs(M, K, ActType::kBF16, 68);
      const Acts x8 = MakeActs(M, K8, ActType::kBF16, 69);
      Dev xq(size_t(M) * K8), xs(size_t(M) * 4);
      ASSERT_NO_FATAL_FAILURE(QuantizeOnDevice(x8, M, K8, true, xq, xs));
      auto w8a8 = [&](InvariantTile tile) {
        return RunPoisoned(M, N, ActType::kBF16, [&](void* yp) {
          W8A8Args a = QuantizedArgs(xq, xs, yp, M, true, true);
          a.tuning.invariant_tile = tile;
          Status s = RunW8A8Invariant(*dw8, a, nullptr);
          EXPECT_TRUE(s.ok()) << s.message();
        });
      };
      const std::vector<float> ref16 = RunW16(w, N, K, x.bits.data(), M, ActType::kBF16);
      const std::vector<float> ref8 = w8a8({});
      const std::string shape = "K=" + std::to_string(K) + " M=" + std::to_string(M);
      if (M == 37) {
        ExpectClose(ref16, GemmF64(x.f, M, K, w.f, N), ActType::kBF16, 0, "w16 " + shape);
        std::vector<float> r8(size_t(M) * N);
        LinearRefFp8W8A8<double>(x8.f.data(), M, w8, true, r8.data());
        // Hopper's E4M3 wgmma keeps a shortened mantissa between its k32 chunks (fast accumulation, as in vLLM's
        // CUTLASS W8A8 kernels); at K = 16400 its error has an RMS of about 2e-3 of the outputs' (docs/perf/gemm.md).
        ExpectClose(ref8, std::vector<double>(r8.begin(), r8.end()), ActType::kBF16, 0, "w8a8 " + shape,
                    split ? 3e-3 : 1e-3);
      }
      for (const InvariantTile& t : InvariantTiles()) {
        const std::string what = "tile " + std::to_string(t.tokens) + "." + std::to_string(t.groups) + "." +
                                  std::to_string(t.per_sm) + ".w" + std::to_string(t.weights) + " " + shape;
        const std::vector<float> y16 = RunW16(w, N, K, x.bits.data(), M, ActType::kBF16, t);
        EXPECT_EQ(0, std::memcmp(y16.data(), ref16.data(), y16.size() * sizeof(float))) << "w16 " << what;
        const std::vector<float> y8 = w8a8(t);
        EXPECT_EQ(0, std::memcmp(y8.data(), ref8.data(), y8.size() * sizeof(float))) << "w8a8 " << what;
      }
    }
  }
}

TEST(GemmGpu, W16InvariantShapeErrorsNameTheConstraint) {
  const Act16Weights w = MakeAct16Weights(64, 64, ActType::kBF16, 65);
  Dev x(64 * 64 * 2), y(64 * 64 * 2);
  LinearArgs a{x.p, y.p, 4, ActType::kBF16, true, nullptr, 0};
  const Status s = RunW16Invariant(w.dev->p, 64, 60, a, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiples of 8"), std::string::npos) << s.message();
}

// Calls on several streams at once (the server's streams share one BlasLt): each stream has its own
// cuBLASLt workspace, so split-K algorithms that use it stay correct and bitwise equal to a lone call.
// Non-invariant mode, small M and long K: the shapes where cuBLASLt picks split-K with a workspace.
TEST(GemmGpu, Bf16CublasLtConcurrentStreamsMatchALoneCall) {
  Ctx ctx;
  constexpr int kStreams = 4, kRuns = 20;
  const ActType act = ActType::kBF16;
  for (auto [M, N, K] : {std::tuple{16, 256, 16384}, std::tuple{4, 512, 8192}, std::tuple{64, 128, 14336}, std::tuple{8, 64, 65536}}) {
    const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
    const Act16Weights w = MakeAct16Weights(N, K, act, 61);
    std::vector<Acts> xs;
    std::vector<std::unique_ptr<Dev>> xd, yd;
    cudaStream_t st[kStreams];
    for (int s = 0; s < kStreams; ++s) {
      xs.push_back(MakeActs(M, K, act, 70 + s));
      xd.push_back(std::make_unique<Dev>(xs[s].bits.size() * 2));
      yd.push_back(std::make_unique<Dev>(size_t(kRuns + 1) * M * N * 2));  // y of the lone call, then of each round
      CK(cudaMemcpy(xd[s]->p, xs[s].bits.data(), xs[s].bits.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
      OK(ctx.blas->ReserveStream(st[s]));
    }
    auto y_of = [&](int s, int r) { return static_cast<uint16_t*>(yd[s]->p) + size_t(r) * M * N; };
    auto run = [&](int s, int r) {
      return RunBf16(ctx.blas.get(), w.dev->p, N, K, LinearArgs{xd[s]->p, y_of(s, r), M, act, false, nullptr, 0}, st[s]);
    };
    auto fetch = [&](int s, int r) {
      std::vector<uint16_t> h(size_t(M) * N);
      EXPECT_EQ(cudaMemcpy(h.data(), y_of(s, r), h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      return h;
    };
    // Lone calls, one stream at a time (the first also times the candidates and fixes the algorithm).
    std::vector<std::vector<uint16_t>> lone;
    for (int s = 0; s < kStreams; ++s) {
      OK(run(s, 0));
      CK(cudaStreamSynchronize(st[s]));
      lone.push_back(fetch(s, 0));
      std::vector<float> y(lone[s].size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = FromAct(lone[s][i], act);
      ExpectClose(y, GemmF64(xs[s].f, M, K, w.f, N), act, 0, "lone call " + what);
    }
    // The same calls interleaved on all streams, kRuns rounds, with nothing waited for in between.
    for (int r = 1; r <= kRuns; ++r)
      for (int s = 0; s < kStreams; ++s) OK(run(s, r));
    CK(cudaDeviceSynchronize());
    for (int s = 0; s < kStreams; ++s) {
      for (int r = 1; r <= kRuns; ++r) EXPECT_EQ(fetch(s, r), lone[s]) << "stream " << s << " round " << r << ", " << what;
      CK(cudaStreamDestroy(st[s]));
    }
  }
}

}  // namespace
}  // namespace flashq::gemm
