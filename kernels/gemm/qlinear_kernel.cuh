// Dequantize-in-register linear kernel for small and medium M: W4A16 (group-wise int4)
// and W8A16 (FP8 E4M3, per-channel / per-tensor scale), 16-bit activations, fp32 accumulation.
//
// Both kernels compute Yᵀ = W · Xᵀ on mma.sync m16n8k16 with the roles swapped: the A operand is
// 16 output columns of W, dequantized straight into the A fragment registers, the B operand is
// 8 tokens of X, so M <= 8 costs one n8 tile (not a mostly empty m16 tile) and no register
// shuffles are needed. A warp owns a 32-column strip and one contiguous "warp range" of k32 steps;
// the plan (PlanFor: K and N only) cuts each strip's K into 2 * splits warp ranges.
// int4: q becomes the exact integer q - z in 16 bits (one lop3 with a magic exponent, one
// fma), the mma accumulates a stage (groups of 4k steps) or a k32 step (other group sizes,
// the *_step.cu files) into a fresh fp32 fragment, and the group scale is applied in fp32.
// fp8: the E4M3 bits, placed at load time, are moved into a 16-bit float with shifts and masks (no
// cvt): for fp16 the value is w * 2^-8 (the 2^8 folds into the fp32 channel scale), for bf16
// w * 2^-120, then one exact bf16x2 multiply by 2^120 (subnormal E4M3 values stay exact).
// This per-warp arithmetic is StepMma/Flush in both kernels, and both sum the warp ranges as
// ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...) in fp32. No arithmetic mixes tokens, so
// row i is bitwise identical for any M.
//
// QLinearDirectKernel (M <= 16; below): one block per strip holding all of its warp ranges, no
// split-K across blocks and no shared memory or barrier in the main loop; each warp keeps 8 (4)
// k32 steps of its weights, X and scales in flight in registers and refills a 4-step stage at a
// time; int4 on 8-split plans runs strip pairs instead (2-block clusters that share X through L1,
// kPair). QLinearKernel (M > 16, 32-token tiles): a block
// is 4 strips x 2 warp ranges with one block-wide cp.async pipeline (kStages deep, one barrier
// per stage, one copy of the X tile for the 4 N-warps); blocks split K further (grid.y = splits)
// and the last block of a tile (atomic ticket) sums the fp32 partials in order, or on sm_90 a
// 2-split plan runs as a 2-block cluster that sums over distributed shared memory. Both kernels
// use programmatic dependent launch on sm_90 (weights prefetched before griddepcontrol.wait).
// On sm_90, int4 launches of M > 32 with plans of at most 4 splits take the wgmma kernel of
// qlinear_wgmma.cuh instead of QLinearKernel: the same arithmetic on wgmma, 64-token tiles.
//
// Layouts (built by weights.cu). k is permuted inside each k32 step so that thread
// t = lane%4 owns channels 8t..8t+7 of both operands: X is read as one 16 B chunk per token
// and W as one 32-bit word (8 nibbles) or 8 bytes (fp8) per n8 column group.
//   int4 qw  uint32 [strips][nk32][lane][s]: n = 32*strip + 8s + lane/4, nibble of k = 8t+j
//            at bit 4*(j/2) + 16*(j%2), so (w >> 4p) & 0x000f000f yields the pair (2p, 2p+1).
//   int4 sz  96 B blocks [G][strips]: fp16 scales [g][s], then uint8 zeros [g][s]
//            (n = 8s + g: the A fragment's rows).
//   fp8  qw  uint32 [strips][nk32][c][lane][4]: word w = 2s + ks at chunk w/4 holds channels 8t+4ks + 0..3
//            with their bits placed for the two registers (Fp8Word).
//   fp8  fscales fp32 [strips][g][s].
// Limits: K % 8 == 0; group_size % 32 == 0 or channelwise; M per launch <= 128.
// Measured: bench/results/gemm-nvidia-h200.md (design and bounds in docs/perf/gemm.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/loads.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/gemm/gemm_internal.h"

namespace flashq::gemm::detail {

constexpr int kSzChunks = kSzBlockBytes / 16;  // 16-byte chunks per int4 scale block

template <typename T> struct Act;
template <> struct Act<__half> {
  static constexpr uint32_t kMagic = 0x6400u;  // fp16 1024.0: 0x6400 | q == 1024 + q
  static constexpr uint32_t kOne2 = 0x3c003c00u;
};
template <> struct Act<__nv_bfloat16> {
  static constexpr uint32_t kMagic = 0x4300u;  // bf16 128.0: 0x4300 | q == 128 + q
  static constexpr uint32_t kOne2 = 0x3f803f80u;
};

template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (magic + q) - (magic + z) as an fma with 1.0: exact, both are small integers. The
// nibble pair is masked and given the magic exponent in one lop3 (a C++ "& m | c" takes two).
template <typename T>
__device__ __forceinline__ uint32_t DequantPair(uint32_t w, int p, uint32_t neg_zm) {
  uint32_t h;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(h) : "r"(w >> (4 * p)), "n"(0x000f000f), "n"(Act<T>::kMagic * 0x10001u));
  uint32_t d;
  if constexpr (std::is_same_v<T, __half>)
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(h), "r"(Act<T>::kOne2), "r"(neg_zm));
  else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(h), "r"(Act<T>::kOne2), "r"(neg_zm));
  return d;
}

// One fp8 word (weights.cu: Fp8PackWord) -> b0 = (c0, c1), b1 = (c2, c3) in 16-bit floats. The word holds c0 and c1
// at their bf16 places (sign at bit 15 / 31, exponent and mantissa at bits 10..4 / 26..20) and c2 and c3 in the bits
// between: the low 4 of exponent and mantissa at 3..0 / 19..16, the sign at 11 / 27, the high 3 at 14..12 / 30..28.
// bf16: one mask (b0) or two shifts and masks (b1) give the value * 2^-120 exactly (E4M3 subnormals on bf16
// subnormals), then one exact bf16x2 multiply by 2^120: 7 instructions a word, where E4M3 bytes take 8 at best (a
// byte's sign and exponent need different shifts). fp16: value * 2^-8 exactly (the 2^8 folds into the fp32 channel
// scale), 9 instructions a word (7 from bytes). H200, against bytes sign-extended by prmt (d250681): W8A16 bf16 4096²
// M = 8 5.73 -> 5.66 µs, M = 16 6.96 -> 6.88; fp16 M = 16 7.12 -> 7.30, 14336 x 4096 M = 1 14.85 -> 15.35
// (docs/perf/experiments.md). The layout is chosen for bf16, the dtype of the benchmark's bars.
template <typename T>
__device__ __forceinline__ void Fp8Word(uint32_t w, uint32_t& b0, uint32_t& b1) {
  if constexpr (std::is_same_v<T, __half>) {
    b0 = ((w << 3) & 0x3f803f80u) | (w & 0x80008000u);
    b1 = ((w << 7) & 0x07800780u) | ((w << 4) & 0x80008000u) | ((w >> 1) & 0x38003800u);
  } else {
    const uint32_t h0 = w & 0x87f087f0u;
    const uint32_t h1 = ((w << 4) & 0x80f080f0u) | ((w >> 4) & 0x07000700u);
    constexpr uint32_t k2p120 = 0x7b807b80u;  // bf16 2^120 in both halves
    constexpr uint32_t kNegZero = 0x80008000u;
    // x * 2^120 + (-0) == x * 2^120 exactly; fma.bf16x2 exists from sm_80 (mul.bf16x2 only from sm_90).
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(b0) : "r"(h0), "r"(k2p120), "r"(kNegZero));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(b1) : "r"(h1), "r"(k2p120), "r"(kNegZero));
  }
}

// mma with a zero accumulator input (starts a fresh k32 partial without zeroing registers).
template <typename T>
__device__ __forceinline__ void Mma0(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float z = 0.0f;
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  }
}

// -(magic + z) in both halves of a register, z = byte `b` of zs: the magic's low byte is zero, so magic + z is the
// magic's high byte above the zero byte, and the sign bit goes on that high byte. One byte permute.
template <typename T>
__device__ __forceinline__ uint32_t NegMagicZero(uint32_t zs, int b) {
  constexpr uint32_t kNegMagicHi = ((Act<T>::kMagic >> 8) | 0x80u) * 0x01010101u;
  return __byte_perm(zs, kNegMagicHi, 0x4040u | (b * 0x0101u));
}

// Group change: the group's fp32 scales and -(magic + zero) of the warp's columns 8s + g, from
// the group's 96-byte block in shared memory (fp16 scales [g][s], then uint8 zeros [g][s]).
// sv: the 4 fp16 scales of row g of the block, z: its 4 uint8 zeros.
template <typename T>
__device__ __forceinline__ void GroupRegs(uint2 sv, uint32_t z, float (&scl)[4], uint32_t (&nzm)[4]) {
  const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&sv.x));
  const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&sv.y));
  scl[0] = f0.x; scl[1] = f0.y; scl[2] = f1.x; scl[3] = f1.y;
#pragma unroll
  for (int s = 0; s < 4; ++s) nzm[s] = NegMagicZero<T>(z, s);
}
template <typename T>
__device__ __forceinline__ void LoadGroup(const uint4* sz, int g, float (&scl)[4], uint32_t (&nzm)[4]) {
  GroupRegs<T>(reinterpret_cast<const uint2*>(sz)[g], reinterpret_cast<const uint32_t*>(sz + kSzZeros / 16)[g], scl, nzm);
}

// One k32 step of a warp, the arithmetic every kernel here shares (batch invariance rests on it):
// A fragments from the step's weight words wv (int4: the exact integers q - z; fp8: the E4M3
// values), one mma per (k16 half, 16-column half, 8-token tile). int4 accumulates into the
// partial c, which the first mma of a flush unit (`fresh`) starts from zero; fp8 into acc.
template <typename T, int NT, bool kFp8>
__device__ __forceinline__ void StepMma(const uint32_t* wv, const uint4 (&xv)[NT], const uint32_t (&nzm)[4], bool fresh,
                                        float (&c)[NT][2][4], float (&acc)[NT][2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t a[4];
      if constexpr (kFp8) {
        Fp8Word<T>(wv[2 * (2 * u) + ks], a[0], a[2]);
        Fp8Word<T>(wv[2 * (2 * u + 1) + ks], a[1], a[3]);
      } else {
        a[0] = DequantPair<T>(wv[2 * u], 2 * ks, nzm[2 * u]);
        a[1] = DequantPair<T>(wv[2 * u + 1], 2 * ks, nzm[2 * u + 1]);
        a[2] = DequantPair<T>(wv[2 * u], 2 * ks + 1, nzm[2 * u]);
        a[3] = DequantPair<T>(wv[2 * u + 1], 2 * ks + 1, nzm[2 * u + 1]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = ks ? xv[nt].z : xv[nt].x, b1 = ks ? xv[nt].w : xv[nt].y;
        if constexpr (kFp8) Mma<T>(acc[nt][u], a, b0, b1);
        else if (ks == 0 && fresh) Mma0<T>(c[nt][u], a, b0, b1);
        else Mma<T>(c[nt][u], a, b0, b1);
      }
    }
  }
}

// Zeroes a warp's fp32 accumulators (NT token tiles x 2 column halves x 4).
template <int NT>
__device__ __forceinline__ void ZeroAcc(float (&acc)[NT][2][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][u][e] = 0.0f;
}

// int4 flush: acc += scale * (the exact-integer-weight partial), in fp32.
template <int NT>
__device__ __forceinline__ void Flush(const float (&scl)[4], const float (&c)[NT][2][4], float (&acc)[NT][2][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][u][e] = fmaf(scl[2 * u + (e >> 1)], c[nt][u][e], acc[nt][u][e]);
}

// A warp's accumulators to shared memory, [warp w][accumulator (nt, u, e)][lane], for a cross-warp sum.
template <int NT>
__device__ __forceinline__ void StoreAcc(float* red, int w, int lane, const float (&acc)[NT][2][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(w * NT * 8 + (nt * 2 + u) * 4 + e) * 32 + lane] = acc[nt][u][e];
}

// The fp32 split partials v[0] + v[1] + ... + v[n - 1] in that order (n <= kN), as the wgmma kernel adds them.
// QLinearKernel's two copies of this sum stay inline: with this helper its SASS changed and 4096² M = 32-64 ran about
// 1% slower on the H200.
template <int kN>
__device__ __forceinline__ float4 SumSplits(const float4 (&v)[kN], int n) {
  float4 sum = v[0];
#pragma unroll
  for (int q = 1; q < kN; ++q)
    if (q < n) {
      sum.x += v[q].x;
      sum.y += v[q].y;
      sum.z += v[q].z;
      sum.w += v[q].w;
    }
  return sum;
}
// Y's columns col..col+3 at dst from sum, rounded to T: one 8-byte store when N % 4 == 0 (vec), else the columns < N.
template <typename T>
__device__ __forceinline__ void StoreY4(T* dst, int col, int N, bool vec, float4 sum) {
  if (vec) {
    const T o[4] = {T(sum.x), T(sum.y), T(sum.z), T(sum.w)};
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(o);
  } else {
    dst[0] = T(sum.x);
    if (col + 1 < N) dst[1] = T(sum.y);
    if (col + 2 < N) dst[2] = T(sum.z);
    if (col + 3 < N) dst[3] = T(sum.w);
  }
}

template <bool kFp8, int NT, bool kStageFlush, bool kMulti>
struct Cfg {
  static constexpr int kWarps = kThreads / 32;
  // k32 steps per warp per pipeline stage: int4 4 (one stage = one g128 group, half the
  // per-byte loop overhead of 2), fp8 2 (its stages are twice the bytes). Both divide the plan's
  // kSubSteps-granular warp ranges.
  static constexpr int kSub = kFp8 ? 2 : kSubSteps;
  static_assert(kSubSteps % kSub == 0, "a warp's K range must be whole stages");
  // Blocks per SM: bytes in flight per SM = blocks * (stages in flight) * weight bytes per stage.
  // (Measured on H200: ~2 blocks per SM with deep stages beat 3 with shallow ones.)
  static constexpr int kMinBlocks = 2;
  static constexpr int kWChunks = kFp8 ? 2 : 1;  // uint4 of weights per lane per k32 step
  static constexpr int kW = kWarps * kSub * kWChunks * 32;        // uint4 per stage [warp][ss][c][lane]
  static constexpr int kXRows = 8 * NT;                                // tokens per block
  static constexpr int kX = kWarpsK * kSub * kXRows * 4;          // uint4 per stage [kg][ss][row][4]
  static constexpr int kXPer = (kX + kThreads - 1) / kThreads;        // X chunks per thread per stage
  // Scales + zeros: one 96-byte block per warp per group change (at most once per stage with
  // the stage flush, once per k32 step without).
  static constexpr int kSZ = kFp8 ? 0 : kWarps * (kStageFlush ? 1 : kSub) * kSzChunks;
  static constexpr int kStage = kW + kX + kSZ;                         // uint4 per stage
  static constexpr int kStages = kFp8 ? 4 : 3;  // measured for NT = 4 (the only instantiation)
  // pair_done's K-warp sum runs in rounds of kRedNT token tiles: half the tile where that fits beside the stages.
  static constexpr size_t kPipe = size_t(kStages) * kStage * 16;
  static constexpr size_t kRedRound = size_t(kWarpsN) * 8 * 32 * 4;  // one token tile of the N-warps' accumulators
  static constexpr int kRedNT = (kPipe + kRedRound * (NT / 2)) * kMinBlocks <= 227 * 1024 - kMinBlocks * 2048 ? NT / 2 : 1;
  static constexpr size_t kBytes = kPipe + (kMulti ? kRedRound * kRedNT : 0);
  static_assert(kX % kThreads == 0 || kX < kThreads, "X tile chunks split evenly over the block");
  static_assert(kBytes >= size_t(kWarpsN) * NT * 8 * 32 * 4 + size_t(NT) * 8 * kBlockN * 4,
                "the K-warp reduction and the cluster tile reuse the pipeline buffer");
  static_assert(kBytes * kMinBlocks <= 227 * 1024 - kMinBlocks * 1024, "blocks per SM must fit in shared memory");
};

// Roles are swapped (Yᵀ = W · Xᵀ): the mma's A operand is 16 output columns of W (dequantized
// straight into the A fragment registers), its B operand is 8 tokens of X, so M <= 8 costs
// one n8 tile instead of a mostly empty m16 tile and no register shuffles are needed.
// kStageFlush (int4, groups of a multiple of kSub k32 steps): the fp32 scale is applied once
// per pipeline stage instead of once per k32 step; a property of the weights, not of M.
// p.cluster (sm_90 launches only): the split-K blocks of a tile form one cluster and reduce
// through distributed shared memory instead of the fp32 workspace and an atomic ticket.
template <typename T, int NT, bool kFp8, bool kStageFlush, bool kMulti>
__global__ void __launch_bounds__(kThreads, (Cfg<kFp8, NT, kStageFlush, kMulti>::kMinBlocks)) QLinearKernel(const QLinearParams p) {
  using C = Cfg<kFp8, NT, kStageFlush, kMulti>;
  constexpr int kXPer = C::kXPer;
  // 1024-byte aligned pipeline buffer: with the default alignment (16 bytes past the static s_last) the kernel
  // was 25-45% slower at M = 32-128, int4 and fp8 alike, on the H200 (docs/perf/experiments.md).
  extern __shared__ __align__(1024) uint4 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = warp / kWarpsN, nw = warp % kWarpsN;
  const int g = lane >> 2, t = lane & 3;
  // Grid (token tiles, splits, column blocks): the token tiles of one column block and split are
  // neighbours in launch order, so they run together and all but the first find the weights in L2.
  const int cblock = blockIdx.z, mtile = blockIdx.x;
  const int strip = cblock * kWarpsN + nw;
  const int npairs = kMulti ? p.pairs : 1;  // splits (warp range pairs) this block runs, one after another
  const int pair0 = blockIdx.y * npairs;     // the first of them
  const int m0 = mtile * C::kXRows;
  const int spw = p.steps_per_warp;
  const int nst = spw / C::kSub;  // pipeline stages per pair, the same for every warp of the block
  const int ntot = nst * npairs;
  auto j0_of = [&](int q) { return ((pair0 + q) * kWarpsK + kw) * spw; };  // first k32 step of pair q's range
  const int j0 = j0_of(0);
  int nvalid = min(spw, p.nk32 - j0);  // producer: this warp's real k32 steps in the pair it issues (may be <= 0)
  int nvalid_c = nvalid;               // consumer: the same for the pair it computes
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // ---- producer state (incremental: no divisions in the loop) ----
  auto wsrc_of = [&](int j) {  // the weights of this lane at k32 step j
    return static_cast<const uint4*>(p.qw) + (size_t(strip) * p.nk32 + j) * (C::kWChunks * 32) + lane;
  };
  const uint4* wsrc = wsrc_of(j0);
  const uint32_t wdst = uint32_t(((warp * C::kSub) * C::kWChunks) * 32 + lane) * 16;
  const uint4* szsrc = nullptr;
  int ipos = 0, cpos = 0;
  if constexpr (!kFp8) {
    const int grp0 = j0 / p.gsteps;
    ipos = cpos = j0 - grp0 * p.gsteps;
    szsrc = static_cast<const uint4*>(p.sz) + (size_t(grp0) * p.strips + strip) * kSzChunks + lane;
  }
  const size_t szstride = size_t(p.strips) * kSzChunks;
  constexpr int kSzPer = kStageFlush ? 1 : C::kSub;  // scale blocks per warp per stage
  const uint32_t szdst = uint32_t(C::kW + C::kX + warp * kSzPer * kSzChunks + lane) * 16;
  // X chunk q of this thread: row, k of stage 0, and whether it is copied at all.
  const T* xsrc[kXPer];
  int xk[kXPer];
  bool xcopy[kXPer];
#pragma unroll
  for (int q = 0; q < kXPer; ++q) {
    const int id = tid + q * kThreads;
    const int c = id & 3, r = id >> 2;
    const int row = r % C::kXRows, kgss = r / C::kXRows;
    const int ss = kgss % C::kSub, kg = kgss / C::kSub;
    xk[q] = ((pair0 * kWarpsK + kg) * spw + ss) * kStepK + 8 * c;
    xcopy[q] = id < C::kX && m0 + row < p.M;
    xsrc[q] = static_cast<const T*>(p.x) + size_t(xcopy[q] ? m0 + row : 0) * p.K + (xcopy[q] ? xk[q] : 0);
  }

  int jis = 0;  // next k32 step (inside this warp's range) to issue
  int wli = 0, wq = 0, xli = 0;  // stage inside the pair and pair of the next weights / X to issue
  // Weights and scale blocks of stage slot st (they do not depend on the previous kernel).
  auto issue_w = [&](int st) {
    if (kMulti && wli == nst) {  // next pair: its own warp range
      wli = 0;
      ++wq;
      const int jq = j0_of(wq);
      wsrc = wsrc_of(jq);
      jis = 0;
      nvalid = min(spw, p.nk32 - jq);
      if constexpr (!kFp8) {
        const int grp = jq / p.gsteps;
        ipos = jq - grp * p.gsteps;
        szsrc = static_cast<const uint4*>(p.sz) + (size_t(grp) * p.strips + strip) * kSzChunks + lane;
      }
    }
    if constexpr (kMulti) ++wli;
    const uint32_t sst = sbase + uint32_t(st) * (C::kStage * 16);
#pragma unroll
    for (int ss = 0; ss < C::kSub; ++ss) {
      const bool valid = jis + ss < nvalid;
#pragma unroll
      // Steps past the weights read zeros (not stale data): the small-M kernel does the same, so
      // both issue the very same mma operands (zeros of X meet these words).
      for (int c = 0; c < C::kWChunks; ++c)
        ptx::CpAsync16IfZfill(sst + wdst + uint32_t((ss * C::kWChunks + c) * 32 * 16),
                         valid ? wsrc + (ss * C::kWChunks + c) * 32 : p.qw, true, !valid);
      if constexpr (!kFp8) {
        if (!kStageFlush || ss == 0) {
          const bool newgrp = valid && (jis + ss == 0 || ipos == 0);
          ptx::CpAsync16If(sst + szdst + uint32_t((kStageFlush ? 0 : ss) * kSzBlockBytes), szsrc, newgrp && lane < kSzChunks);
          ipos += kStageFlush ? C::kSub : 1;
          if (ipos == p.gsteps) {
            ipos = 0;
            szsrc += szstride;
          }
        }
      }
    }
    wsrc += C::kSub * C::kWChunks * 32;
    jis += C::kSub;
  };
  // X of stage slot st.
  auto issue_x = [&](int st) {
    if (kMulti && xli == nst) {  // next pair: skip the other K-warps' ranges
      xli = 0;
#pragma unroll
      for (int q = 0; q < kXPer; ++q) {
        xk[q] += (kWarpsK - 1) * spw * kStepK;
        xsrc[q] += (kWarpsK - 1) * spw * kStepK;
      }
    }
    if constexpr (kMulti) ++xli;
    const uint32_t sst = sbase + uint32_t(st) * (C::kStage * 16);
#pragma unroll
    for (int q = 0; q < kXPer; ++q) {
      // Rows >= M are never stored, so their B columns may hold anything; the K tail must be
      // zeros (padded weights dequantize to -z), so it is zero-filled.
      const bool kin = xk[q] < p.K;
      ptx::CpAsync16IfZfill(sst + uint32_t(C::kW + tid + q * kThreads) * 16, kin ? xsrc[q] : p.x, xcopy[q], !kin);
      xk[q] += C::kSub * kStepK;
      xsrc[q] += C::kSub * kStepK;
    }
  };

  // acc[nt][u][e]: output column n = 32*strip + 16u + g + 8*(e >= 2), token 8nt + 2t + (e & 1).
  float acc[NT][2][4] = {};
  float scl[4] = {};     // int4: the group scales of columns 8s + g
  uint32_t nzm[4] = {};  // int4: -(magic + zero) of columns 8s + g, both halves

  auto compute = [&](int i, int st) {
    const uint4* sst = smem + size_t(st) * C::kStage;
    float c[NT][2][4];  // int4: this k32 step's (or stage's) partial, scaled into acc after it
#pragma unroll
    for (int ss = 0; ss < C::kSub; ++ss) {
      const int jj = i * C::kSub + ss;
      if (!kFp8 && (!kStageFlush || ss == 0)) {
        // Group change: new scales and zero points (only registers change, warp-uniform).
        if (jj < nvalid_c && (jj == 0 || cpos == 0))
          LoadGroup<T>(sst + C::kW + C::kX + (warp * kSzPer + (kStageFlush ? 0 : ss)) * kSzChunks, g, scl, nzm);
        cpos += kStageFlush ? C::kSub : 1;
        if (cpos == p.gsteps) cpos = 0;
      }
      const uint4* wsm = sst + ((warp * C::kSub + ss) * C::kWChunks) * 32 + lane;
      uint32_t wv[4 * C::kWChunks];
#pragma unroll
      for (int cc = 0; cc < C::kWChunks; ++cc) {
        const uint4 v = wsm[cc * 32];
        wv[4 * cc] = v.x; wv[4 * cc + 1] = v.y; wv[4 * cc + 2] = v.z; wv[4 * cc + 3] = v.w;
      }
      const uint4* xsm = sst + C::kW + ((kw * C::kSub + ss) * C::kXRows + g) * 4 + t;
      uint4 xv[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xv[nt] = xsm[nt * 8 * 4];
      StepMma<T, NT, kFp8>(wv, xv, nzm, !kStageFlush || ss == 0, c, acc);
      if (!kFp8 && (!kStageFlush || ss == C::kSub - 1)) Flush<NT>(scl, c, acc);
    }
  };

  // ---- main loop: kStages-deep cp.async pipeline, one barrier per stage ----
  // The next kernel may launch at once: its blocks take SM room as ours leave it and prefetch their
  // weights, and anything that touches our output or workspace waits in griddepcontrol.wait for this
  // grid to complete (H200: 2-9% faster at M = 32 and 64 than with the trigger after the main loop).
  ptx::LaunchDependents();
  // Prologue: the first stages' weights before griddepcontrol.wait (with a programmatic launch they
  // stream in while the previous kernel finishes), their X after it. The weights of all prologue
  // stages land in the first commit group, which only makes its wait stricter.
  constexpr int kNA = NT * 8;
  // fp8: the channel scales of columns 8s + g (fp16 weights were w * 2^-8).
  auto load_fs = [&](float (&fs)[4]) {
    const float4 u4 = __ldg(reinterpret_cast<const float4*>(p.fscales + (size_t(strip) * 8 + g) * 4));
    const float k = std::is_same_v<T, __half> ? 256.0f : 1.0f;
    fs[0] = u4.x * k; fs[1] = u4.y * k; fs[2] = u4.z * k; fs[3] = u4.w * k;
  };
  // A pair that is not the block's last: the 2 K-warps summed in order 0, 1 through a shared-memory area
  // of its own (the pipeline keeps streaming the next pair), in two halves of the token tiles, and the
  // pair's partial stored; both warps then start the next pair from zero. The final reduction below repeats
  // this exchange in one round, and the cluster path repeats the tail's in-order split sum: shared helpers for
  // both made QLinearKernel 1-7% slower (docs/perf/experiments.md).
  float* red2 = reinterpret_cast<float*>(smem + size_t(C::kStages) * C::kStage);
  auto pair_done = [&](int q) {
    constexpr int kH = C::kRedNT;
    auto slot = [&](int n, int u, int e) -> float& { return red2[((nw * kH + n) * 8 + u * 4 + e) * 32 + lane]; };
    float fs[4] = {};
    if constexpr (kFp8) load_fs(fs);
#pragma unroll
    for (int h = 0; h < NT / kH; ++h) {
      if (kw == 1) {
#pragma unroll
        for (int n = 0; n < kH; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) slot(n, u, e) = acc[h * kH + n][u][e];
      }
      __syncthreads();
      if (kw == 0) {
#pragma unroll
        for (int n = 0; n < kH; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = acc[h * kH + n][u][e] + slot(n, u, e);
              if constexpr (kFp8) v *= fs[2 * u + (e >> 1)];
              const int row = m0 + (h * kH + n) * 8 + 2 * t + (e & 1);
              const int col = strip * kWarpN + g + 16 * u + 8 * (e >> 1);
              if (row < p.M && col < p.N) p.partial[(size_t(pair0 + q) * p.M + row) * p.N + col] = v;
            }
      }
      __syncthreads();
    }
    ZeroAcc<NT>(acc);
  };
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s)
    if (s < ntot) issue_w(s);
  ptx::GridDependencyWait();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < ntot) issue_x(s);
    ptx::CpAsyncCommit();
  }
  int rd = 0, wr = C::kStages - 1;
  int cq = 0, cli = 0;  // pair and stage inside it being computed
  for (int i = 0; i < ntot; ++i) {
    ptx::CpAsyncWait<C::kStages - 2>();
    __syncthreads();
    if (i + C::kStages - 1 < ntot) {
      issue_w(wr);
      issue_x(wr);
    }
    ptx::CpAsyncCommit();
    compute(cli, rd);
    rd = rd + 1 == C::kStages ? 0 : rd + 1;
    wr = wr + 1 == C::kStages ? 0 : wr + 1;
    ++cli;
    if (kMulti && cli == nst && cq + 1 < npairs) {
      pair_done(cq);
      cli = 0;
      ++cq;
      const int jq = j0_of(cq);
      nvalid_c = min(spw, p.nk32 - jq);
      if constexpr (!kFp8) cpos = jq % p.gsteps;
    }
  }
  ptx::CpAsyncWait<0>();
  __syncthreads();
  const int split = pair0 + npairs - 1;  // the last pair's split: its partial is written below

  // ---- reduce the 2 K-warps in order 0, 1 ----
  float* red = reinterpret_cast<float*>(smem);
  float* ctile = red + kWarpsN * kNA * 32;  // cluster path: this block's fp32 tile [kXRows][kBlockN]
  if (kw == 1) StoreAcc<NT>(red, nw, lane, acc);
  __syncthreads();
  T* y = static_cast<T*>(p.y);
  if (kw == 0) {
    float fs[4] = {};
    if constexpr (kFp8) load_fs(fs);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = acc[nt][u][e] + red[(nw * kNA + (nt * 2 + u) * 4 + e) * 32 + lane];
          if constexpr (kFp8) v *= fs[2 * u + (e >> 1)];
          acc[nt][u][e] = v;
        }
    const int colw = strip * kWarpN + g;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + nt * 8 + 2 * t + (e & 1);
          const int col = colw + 16 * u + 8 * (e >> 1);
          if (p.cluster) {
            ctile[(nt * 8 + 2 * t + (e & 1)) * kBlockN + nw * kWarpN + 16 * u + 8 * (e >> 1) + g] = acc[nt][u][e];
          } else if (row < p.M && col < p.N) {
            if (p.splits == 1) y[size_t(row) * p.N + col] = T(acc[nt][u][e]);
            else p.partial[(size_t(split) * p.M + row) * p.N + col] = acc[nt][u][e];
          }
        }
  }
  if (p.splits == 1) return;
  const int ncol0 = cblock * kBlockN;
  const bool vec = (p.N & 3) == 0;
  auto store4 = [&](int row, int col, float4 sum) { StoreY4(y + size_t(row) * p.N + col, col, p.N, vec, sum); };
  if (p.cluster) {
    // The tile's S split blocks are one cluster (rank = split): after the barrier each block
    // sums every S-th group of 4 columns over ranks 0..S-1 in that order (the same fp32 sum as
    // the workspace path below), reading the other blocks' tiles through distributed shared memory.
    ptx::ClusterSync();
    const int rows = min(C::kXRows, p.M - m0);
    const uint32_t tbase = static_cast<uint32_t>(__cvta_generic_to_shared(ctile));
#pragma unroll 1
    for (int c = split + p.splits * tid; c < rows * (kBlockN / 4); c += p.splits * kThreads) {
      const int row = m0 + c / (kBlockN / 4), col = ncol0 + 4 * (c % (kBlockN / 4));
      float4 v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (q < p.splits) v[q] = ptx::LdClusterF4(tbase + uint32_t(c) * 16, q);
      float4 sum = v[0];
#pragma unroll
      for (int q = 1; q < 8; ++q)
        if (q < p.splits) {
          sum.x += v[q].x;
          sum.y += v[q].y;
          sum.z += v[q].z;
          sum.w += v[q].w;
        }
      if (col < p.N) store4(row, col, sum);
    }
    ptx::ClusterSyncExit();  // no block leaves while another still reads its tile
    return;
  }
  // Split-K: the last block of the tile (atomic ticket) sums splits 0..S-1 in that order. Thread 0's
  // ticket is one acq_rel atomic after the block barrier: its release publishes the block's partials (no
  // per-thread fence), its acquire orders the last block's loads after every other block's partials.
  __shared__ int s_last;
  const int tile = cblock * gridDim.x + mtile;
  __syncthreads();
  if (tid == 0) s_last = ptx::AtomicAddAcqRel(p.counters + tile, 1) == int(gridDim.y) - 1;
  __syncthreads();
  if (!s_last) return;
  // All 256 threads: 4 consecutive columns each (32 per row) x 8 rows per pass. The loads of two passes,
  // every split's, issue together, so the tail costs one L2 round trip per 16 rows.
  constexpr int kRowsPerPass = kThreads / 32, kPasses = 2;
  static_assert(C::kXRows % (kPasses * kRowsPerPass) == 0, "the tail's passes cover the token tile");
  const size_t stride = size_t(p.M) * p.N;
  const int col = ncol0 + 4 * (tid & 31);
  // The tail for N % 4 == 0 (float4 loads) or not (columns past N read as 0), chosen once.
  auto tail = [&](auto vec4) {
    auto load4 = [&](const float* src) {
      if constexpr (decltype(vec4)::value) return __ldcg(reinterpret_cast<const float4*>(src));
      else
        return make_float4(__ldcg(src), col + 1 < p.N ? __ldcg(src + 1) : 0.0f, col + 2 < p.N ? __ldcg(src + 2) : 0.0f,
                           col + 3 < p.N ? __ldcg(src + 3) : 0.0f);
    };
#pragma unroll 1
    for (int r0 = 0; r0 < C::kXRows; r0 += kPasses * kRowsPerPass) {
      float4 v[kPasses][kMaxSplits];
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int row = m0 + r0 + q * kRowsPerPass + (tid >> 5);
        const float* src = p.partial + size_t(min(row, p.M - 1)) * p.N + col;  // rows past M: loaded, not stored
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp)
          if (sp < p.splits) v[q][sp] = load4(src + sp * stride);
      }
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int row = m0 + r0 + q * kRowsPerPass + (tid >> 5);
        float4 sum = v[q][0];
#pragma unroll
        for (int sp = 1; sp < kMaxSplits; ++sp)
          if (sp < p.splits) {
            sum.x += v[q][sp].x;
            sum.y += v[q][sp].y;
            sum.z += v[q][sp].z;
            sum.w += v[q][sp].w;
          }
        if (row < p.M) store4(row, col, sum);
      }
    }
  };
  if (col < p.N) {
    if (vec) tail(std::true_type{});
    else tail(std::false_type{});
  }
  if (tid == 0) p.counters[tile] = 0;
}

// Compute capability major and SM count of the current device (0 if they cannot be read), queried once per
// device: the launchers ask on every call.
struct DeviceProps {
  int major = 0, sms = 0;
};
constexpr int kMaxDevices = 64;  // per-device host caches of the launchers
inline DeviceProps CurrentDevice() {
  static std::atomic<uint64_t> cache[kMaxDevices] = {};  // (major + 1) << 32 | sms once known
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return {};
  if (dev < kMaxDevices) {
    if (const uint64_t known = cache[dev].load(std::memory_order_relaxed))
      return {int(known >> 32) - 1, int(known & 0xffffffffu)};
  }
  DeviceProps d;
  if (cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return {};
  if (dev < kMaxDevices) cache[dev].store(uint64_t(d.major + 1) << 32 | uint32_t(d.sms), std::memory_order_relaxed);
  return d;
}
inline int DeviceMajor() { return CurrentDevice().major; }

// A bench knob "NAME=1" in the environment (read once by each caller: it keeps the result in a static).
inline bool KnobSet(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '1';
}

// Split-K through a cluster needs sm_90. Only 2-split plans use it: on the H200 clusters of 2
// beat the workspace + ticket reduction at M = 1, 16 and 64, clusters of 4 and 8 lost to it
// (docs/perf/experiments.md; again at M = 32 and 64 with PDL).
// Bench knob FLASHQ_GEMM_NOCLUSTER=1 turns it off.
inline bool UseCluster(int splits) {
  static const bool off = KnobSet("FLASHQ_GEMM_NOCLUSTER");
  return !off && splits == 2 && DeviceMajor() >= 9;
}
// Strip pairs in QLinearDirectKernel (kPair): int4 with stage flush, 8-split plans, sm_90 (strip_pairs in
// gemm_internal.h turns them off).
inline bool UsePairs(const QLinearParams& p) {
  return strip_pairs.load() && p.splits == kMaxSplits && DeviceMajor() >= 9;
}
// Programmatic dependent launch of both kernels (sm_90). Bench knob FLASHQ_GEMM_NOPDL=1
// turns it off (H200 --bars: it saves 0.8-1.5 µs per call at M <= 16, 0.7-1.6 µs at M = 32 and 64).
inline bool UsePdl() {
  static const bool off = KnobSet("FLASHQ_GEMM_NOPDL");
  return !off && DeviceMajor() >= 9;
}
// Appends the programmatic-serialization attribute to cfg (whose attrs array has room) when PDL is on.
inline void AddPdl(cudaLaunchConfig_t* cfg) {
  if (!UsePdl()) return;
  cudaLaunchAttribute& a = cfg->attrs[cfg->numAttrs++];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
}

// Splits (warp range pairs) per QLinearKernel block. A block runs P consecutive splits one after another in
// one pipeline, writing each split's partial as before, so the sums and their order do not change. P doubles
// while the grid holds more than one wave (min_blocks per SM) and a block would still stream at most 8
// pipeline stages: short warp ranges then stop paying a block's fill and drain per split. H200: 4096² (8
// splits of 2 stages) M = 64 -12%, M = 128 -10%; the shapes with 7-8 stages per split gained nothing at P = 2
// (docs/perf/experiments.md). Blocks that add their splits' sums themselves, in an order that allows it, were slower.
// Cluster plans keep P = 1.
inline int PairsPerBlock(const QLinearParams& p, int mtiles, int stage_steps, int min_blocks) {
  constexpr int kMaxStagesPerBlock = 8;
  if (UseCluster(p.splits)) return 1;
  const int nst = p.steps_per_warp / stage_steps;
  const int tiles = mtiles * ((p.N + kBlockN - 1) / kBlockN);
  const int wave = min_blocks * CurrentDevice().sms;
  int pairs = 1;
  while (p.splits % (2 * pairs) == 0 && tiles * (p.splits / pairs) > wave && 2 * pairs * nst <= kMaxStagesPerBlock)
    pairs *= 2;
  return pairs;
}

template <typename T, int NT, bool kFp8, bool kStageFlush, bool kMulti>
cudaError_t LaunchQLinearNT(const QLinearParams& p0, cudaStream_t stream) {
  using C = Cfg<kFp8, NT, kStageFlush, kMulti>;
  auto* kernel = QLinearKernel<T, NT, kFp8, kStageFlush, kMulti>;
  // The attribute belongs to the current device: set it on every launch (a static
  // once-only call left every GPU but the first without it: cudaErrorInvalidValue).
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kBytes));
  if (attr != cudaSuccess) return attr;
  QLinearParams p = p0;
  p.cluster = UseCluster(p.splits) ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.M + C::kXRows - 1) / C::kXRows, p.splits / p.pairs, (p.N + kBlockN - 1) / kBlockN);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = C::kBytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  if (p.cluster) {
    at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg.numAttrs].val.clusterDim.x = 1;
    at[cfg.numAttrs].val.clusterDim.y = p.splits;
    at[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  AddPdl(&cfg);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// ---------------------------------------------------------------------------------------------
// Small-M kernel (M <= 16): one block holds one 32-column strip and ALL of K, one warp per plan
// warp range (2 * splits warps, 64..512 threads), so there is no split-K across blocks (no
// workspace, ticket or second pass) and no shared memory or barrier in the main loop. Each warp
// keeps kDepth k32 steps of its weights, X chunks and scale blocks in flight in REGISTERS
// (ld.global.nc straight into the fragment words: the packed layout already gives each lane its
// own 16 bytes), so a step costs one load per operand, the dequantization and the mmas. The
// arithmetic per warp is StepMma/Flush on the same warp range as QLinearKernel, and the block
// sums the warps in QLinearKernel's order ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...),
// so each output is bitwise the one the 32-token kernel computes for M > 16.
// ---------------------------------------------------------------------------------------------
constexpr int kDirectMaxThreads = 64 * kMaxSplits;

// The small-M kernels' block sum: each warp's accumulators to shared memory `red`, then the warp ranges of the strip
// added in QLinearKernel's order ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...) and Y stored. fsv: the fp8
// channel scales of the outputs o = threadIdx.x + it * blockDim.x (unused for int4).
template <typename T, int NT, bool kFp8, int kOutIter>
__device__ __forceinline__ void BlockSum(float* red, const QLinearParams& p, int strip, int warp, int lane,
                                         const float (&acc)[NT][2][4], const float (&fsv)[kOutIter]) {
  constexpr int kNA = NT * 8;  // accumulators per lane
  StoreAcc<NT>(red, warp, lane, acc);
  __syncthreads();
  T* y = static_cast<T*>(p.y);
  // Output o (accumulator (nt, u, e) of lane l) of the block's sum; fs: the fp8 channel scale of its column.
  auto out = [&](int o, float fs) {
    const int i = o >> 5, l = o & 31;
    const int e = i & 3, u = (i >> 2) & 1, nt = i >> 3;
    const int row = nt * 8 + 2 * (l & 3) + (e & 1);
    const int cs = 16 * u + 8 * (e >> 1) + (l >> 2);  // column inside the strip
    const int col = strip * kWarpN + cs;
    // Rounded adds and multiplies (no fma contraction): QLinearKernel rounds each split's sum
    // to fp32 in memory before it adds the next.
    // Unrolled over kMaxSplits, so that all the shared-memory loads issue before the adds (H200: int4
    // M <= 16 1-4% faster than the loop over p.splits).
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q)
      if (q < p.splits) {
        float v = __fadd_rn(red[2 * q * kNA * 32 + o], red[(2 * q + 1) * kNA * 32 + o]);
        if constexpr (kFp8) v = __fmul_rn(v, fs);
        sum = q == 0 ? v : __fadd_rn(sum, v);
      }
    if (row < p.M && col < p.N) y[size_t(row) * p.N + col] = T(sum);
  };
  if constexpr (kFp8) {
#pragma unroll
    for (int it = 0; it < kOutIter; ++it) {
      const int o = threadIdx.x + it * blockDim.x;
      if (o < kNA * 32) out(o, fsv[it]);
    }
  } else {
    for (int o = threadIdx.x; o < kNA * 32; o += blockDim.x) out(o, 1.0f);
  }
}

// kPair's sum (QLinearDirectKernel, 8-split plans: 512 threads): warp 2r + s of a block holds warp range r of the
// block's half and strip s. Each thread adds the pairs of ranges of kIt outputs; rank 0 adds them up in BlockSum's order
// and hands the sums to rank 1 (`hand`, completing on its mbarrier hbar), which adds its own pairs to them in order and
// stores both strips.
template <typename T, int NT>
__device__ __forceinline__ void PairSum(float* red, float* hand, uint32_t hbar, const QLinearParams& p, int rank,
                                        int warp, int lane, const float (&acc)[NT][2][4]) {
  constexpr int kNA = NT * 8, kPairs = kMaxSplits / 2, kIt = 2 * kNA * 32 / kDirectMaxThreads;
  StoreAcc<NT>(red, warp, lane, acc);
  __syncthreads();
  float v[kIt][kPairs];
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int idx = threadIdx.x + it * kDirectMaxThreads, s = idx / (kNA * 32), o = idx % (kNA * 32);
#pragma unroll
    for (int q = 0; q < kPairs; ++q)  // pair q: the block's ranges 2q and 2q + 1 of strip s, warps 4q + s and 4q + 2 + s
      v[it][q] = __fadd_rn(red[(4 * q + s) * kNA * 32 + o], red[(4 * q + 2 + s) * kNA * 32 + o]);
  }
  if (rank == 0) {
    const uint32_t rhand = ptx::MapaShared(static_cast<uint32_t>(__cvta_generic_to_shared(hand)), 1);
    const uint32_t rbar = ptx::MapaShared(hbar, 1);
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      float sum = v[it][0];
#pragma unroll
      for (int q = 1; q < kPairs; ++q) sum = __fadd_rn(sum, v[it][q]);
      ptx::StAsyncF32(rhand + uint32_t(threadIdx.x + it * kDirectMaxThreads) * 4u, sum, rbar);
    }
    return;
  }
  ptx::MbarWaitAsmLoop(hbar, 0);
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int idx = threadIdx.x + it * kDirectMaxThreads, s = idx / (kNA * 32), o = idx % (kNA * 32);
    float sum = hand[idx];
#pragma unroll
    for (int q = 0; q < kPairs; ++q) sum = __fadd_rn(sum, v[it][q]);
    const int i = o >> 5, l = o & 31;
    const int e = i & 3, u = (i >> 2) & 1, nt = i >> 3;
    const int row = nt * 8 + 2 * (l & 3) + (e & 1);
    const int col = (int(blockIdx.x & ~1u) + s) * kWarpN + 16 * u + 8 * (e >> 1) + (l >> 2);
    if (row < p.M && col < p.N) y[size_t(row) * p.N + col] = T(sum);
  }
}

// fp8: the channel scales of the outputs o = threadIdx.x + it * blockDim.x that BlockSum writes (it < kOutIter).
template <typename T, int NT, int kOutIter>
__device__ __forceinline__ void Fp8OutScales(const QLinearParams& p, int strip, float (&fsv)[kOutIter]) {
#pragma unroll
  for (int it = 0; it < kOutIter; ++it) {
    // Output o is accumulator (nt, u, e) = (o >> 8, (o >> 7) & 1, (o >> 5) & 3) of lane o & 31 (see `out`): its
    // column is 8 * (2u + (e >> 1)) + lane / 4 of the strip. fp16 weights were w * 2^-8.
    const int o = threadIdx.x + it * blockDim.x;
    const int cg = 2 * ((o >> 7) & 1) + ((o >> 6) & 1);
    if (o < NT * 8 * 32)
      fsv[it] = __ldg(p.fscales + (size_t(strip) * 8 + ((o & 31) >> 2)) * 4 + cg) * (std::is_same_v<T, __half> ? 256.0f : 1.0f);
  }
}

constexpr int kDirectMaxDepth = 8;  // the deepest ring of QLinearDirectKernel (DirectCfg::kDepth)
template <bool kFp8, int NT>
struct DirectCfg {
  static constexpr int kWChunks = kFp8 ? 2 : 1;  // uint4 of weights per lane per step
  static constexpr int kSub = kFp8 ? 2 : kSubSteps;
  // Steps in flight per warp, in registers: (kWChunks + NT) * 4 words each.
  static constexpr int kDepth = kWChunks + NT > 2 ? 4 : kDirectMaxDepth;
  static_assert(kDepth % kSub == 0 && kSubSteps % kSub == 0, "ring slots follow the flush units");
};

// kPre: the weight steps of the ring requested before griddepcontrol.wait (kDirectMaxDepth: all of them).
// kPair (sm_90, int4 with stage flush, 8-split plans): a 2-block cluster runs strips 2c and 2c + 1, block
// rank q the first (q = 0) or second half of both strips' warp ranges, so that the two warps of a range (one per strip,
// neighbours in the block) read the same X and one of them finds it in L1: half the L2 reads of X. Rank 0 adds its
// pairs of warp ranges, (w0 + w1) + (w2 + w3) + ..., and hands that over to rank 1 (st.async into its shared memory),
// which adds its own pairs to it in order and stores both strips: the sum and its order are BlockSum's. The blocks
// arrive at the cluster barrier at once and wait after the prologue's loads, where the warps wait for data anyway.
// H200, 14336 x 4096: M = 16 13.12 -> 11.94 µs, M = 13 12.17 -> 11.80, M = 9 unchanged, M = 4 10.18 -> 9.83,
// M = 8 10.69 -> 10.34; 4096² (where the staged kernel takes M <= 8) M = 16 5.43 -> 5.18, M = 12 5.17 -> 5.07, but M = 9
// 4.91 -> 5.02. In a first form (the hand-over behind a cluster barrier after the main loop) the 2- and 4-split
// plans (4096 x 14336, 8192²) lost 0.6-1.3 µs; they keep one-strip blocks
// (docs/perf/experiments.md).
template <typename T, int NT, bool kFp8, bool kStageFlush, int kPre, bool kPair = false>
__global__ void __launch_bounds__(kDirectMaxThreads, 1) QLinearDirectKernel(const QLinearParams p) {
  static_assert(!(kPair && kFp8), "strip pairs are built for int4");
  // The pairs' clusters and mbarriers exist from sm_90 on, where alone UsePairs launches them; compiled for an older
  // architecture, a kPair instance is the one-strip kernel behind a trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kPaired = false;
  if constexpr (kPair) __trap();
#else
  constexpr bool kPaired = kPair;
#endif
  using C = DirectCfg<kFp8, NT>;
  constexpr int kSub = C::kSub, kD = kFp8 || kStageFlush ? C::kDepth : 4;  // a scale block per step costs registers
  constexpr int kRefill = kD >= 2 * kSubSteps ? kSubSteps : 1;
  // Where each slot is refilled on its own, the load pointers stay put for a whole pass of the ring
  // and slot r loads at a constant offset from them (H200: int4 M = 16 up to 3.5% faster than moving
  // them at every load); stage refills move them at every load (there the offsets made M = 1 slower).
  constexpr bool kSlotAddr = kRefill == 1;
  // Scale blocks in flight: one per flush unit of the ring (stage flush), else one per step.
  constexpr int kSzSlots = kFp8 ? 1 : kStageFlush ? kD / kSub : kD;
  extern __shared__ float red[];  // [warp][NT * 8][32] accumulators, for the block's sum
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rank = kPaired ? int(blockIdx.x & 1) : 0;  // == %cluster_ctarank: the cluster is (2, 1, 1)
  const int strip = kPaired ? int(blockIdx.x & ~1u) + (warp & 1) : int(blockIdx.x);
  const int range = kPaired ? rank * int(blockDim.x >> 6) + (warp >> 1) : warp;  // the warp range of the plan
  const int spw = p.steps_per_warp;
  const int j0 = range * spw;                // == (split * kWarpsK + kw) * spw of QLinearKernel
  const int nvalid = min(spw, p.nk32 - j0);  // real k32 steps of this warp (may be <= 0)
  // Steps [0, nfast) need no predicate: inside the warp's weights and inside K for every lane.
  const int nfast = max(0, min(nvalid, p.K / kStepK - j0));

  // ---- producer state: pointers advance one k32 step per load ----
  const uint4* wp = static_cast<const uint4*>(p.qw) + (size_t(strip) * p.nk32 + j0) * (C::kWChunks * 32) + lane;
  // X chunks: token rows 8nt + g (rows past M read row M-1: a broadcast, their outputs are never
  // stored), k 8t..8t+7 of the step.
  const int xk0 = j0 * kStepK + 8 * t;
  const T* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xp[nt] = static_cast<const T*>(p.x) + size_t(min(nt * 8 + g, p.M - 1)) * p.K + xk0;
  const char* szp = nullptr;  // 96-byte scale block of the group of the step loaded last
  const size_t szstride = size_t(p.strips) * kSzBlockBytes;  // from one group's block to the next
  int gnext = 0, cnext = 0;   // next group start on the load side and on the compute side (relative to j0)
  if constexpr (!kFp8) {
    const int grp0 = j0 / p.gsteps;
    szp = static_cast<const char*>(p.sz) + (size_t(grp0) * p.strips + strip) * kSzBlockBytes;
    gnext = cnext = (grp0 + 1) * p.gsteps - j0;
  }

  uint4 wb[kD][C::kWChunks];
  uint4 xb[kD][NT];
  uint2 sbs[kSzSlots];
  uint32_t sbz[kSzSlots];
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  // Weights of step jn into ring slot r (zeros past the warp's steps) and, where a group starts,
  // its scale block into scale slot r / kSub (stage flush) or r.
  auto load_w = [&](int jn, int r, auto fast) {
    const bool valid = fast || jn < nvalid;
#pragma unroll
    for (int c = 0; c < C::kWChunks; ++c)
      wb[r][c] = valid ? ptx::LdStream(wp + ((kSlotAddr ? r : 0) * C::kWChunks + c) * 32) : zero4;
    if (!kSlotAddr) wp += C::kWChunks * 32;
    if constexpr (!kFp8) {
      if (!kStageFlush || r % kSub == 0) {
        const int sr = kStageFlush ? r / kSub : r;
        if (jn == gnext) {
          szp += szstride;
          gnext += p.gsteps;
        }
        if ((fast || jn < nvalid) && (jn == 0 || jn + p.gsteps == gnext)) {
          sbs[sr] = __ldg(reinterpret_cast<const uint2*>(szp) + g);
          sbz[sr] = __ldg(reinterpret_cast<const uint32_t*>(szp + kSzZeros) + g);
        }
      }
    }
  };
  // X of step jn into ring slot r (zeros past K).
  auto load_x = [&](int jn, int r, auto fast) {
    const bool kin = fast || xk0 + jn * kStepK < p.K;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      xb[r][nt] = kin ? ptx::LdCached16(xp[nt] + (kSlotAddr ? r : 0) * kStepK) : zero4;
      if (!kSlotAddr) xp[nt] += kStepK;
    }
  };
  // Slot addressing: moves the load pointers on by a pass of the ring.
  auto next_pass = [&] {
    if constexpr (kSlotAddr) {
      wp += kD * C::kWChunks * 32;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xp[nt] += kD * kStepK;
    }
  };

  float acc[NT][2][4];
  float c[NT][2][4];  // int4: the current flush unit's partial
  ZeroAcc<NT>(acc);
  float scl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint32_t nzm[4] = {0u, 0u, 0u, 0u};
  // fp8: the block's sum writes outputs o = threadIdx.x + it * blockDim.x (it < kOutIter: blocks have 64 threads
  // or more); their channel scales load with the first weights rather than after the main loop.
  constexpr int kOutIter = kFp8 ? NT * 8 * 32 / 64 : 1;
  float fsv[kOutIter];
  if constexpr (kFp8) Fp8OutScales<T, NT>(p, strip, fsv);

  // int4 lets the next kernel launch at once, as QLinearKernel does (H200: int4 M = 1 4-8% faster than
  // with the trigger after the main loop). fp8 triggers after its main loop: with the early trigger W8A16
  // at 4096 x 14336, M = 1 took 18.8 instead of 16.8 µs, past its 1.6x bar (docs/perf/experiments.md).
  constexpr bool kEarlyTrigger = !kFp8;
  if constexpr (kEarlyTrigger) ptx::LaunchDependents();
  // kPair: rank 1's hand-over mbarrier (after the accumulators and rank 0's sums in shared memory), published to rank 0
  // by the cluster barrier's arrive here and its wait after the prologue's loads, where the warps wait for data anyway.
  constexpr int kNA = NT * 8;  // accumulators per lane
  float* const hand = red + (blockDim.x >> 5) * kNA * 32;  // [2 strips][kNA * 32]: rank 0's sums, in rank 1
  const uint32_t hbar = static_cast<uint32_t>(__cvta_generic_to_shared(hand + 2 * kNA * 32));
  if constexpr (kPaired) {
    if (rank == 1 && threadIdx.x == 0) {
      ptx::MbarInit(hbar, 1);
      ptx::MbarArriveExpectTx(hbar, 2 * kNA * 32 * sizeof(float));
      ptx::FenceMbarInitCluster();
    }
    ptx::ClusterArriveRelaxed();
  }
  // ---- prologue: steps 0 .. kD-1. Weights and scales do not depend on the previous kernel: with
  // a programmatic launch they stream in while it finishes; X only after the wait. An SM's requests return roughly in
  // the order it made them, so the weight steps requested before X also land before it: with short warp ranges only
  // kPre of them, the rest after X (H200, 4096² M = 16: W4A16 5.51 -> 5.34 µs, W8A16 7.32 -> 7.04; with 28-32 steps per
  // warp the whole ring first is 0.3-1.3 µs faster; docs/perf/experiments.md). ----
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw && r < kPre) load_w(r, r, std::false_type{});
  ptx::GridDependencyWait();
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw) load_x(r, r, std::false_type{});
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw && r >= kPre) load_w(r, r, std::false_type{});
  next_pass();
  if constexpr (kPaired) ptx::ClusterWait();

  // ---- main loop: step j computes from slot j % kD, then refills it with step j + kD. A pass of the
  // ring is `steady` where every step it computes and loads lies in [0, nfast): no bounds checks. ----
  auto pass = [&](int i, auto steady) {
#pragma unroll
    for (int r = 0; r < kD; ++r) {
      const int j = i + r;
      if (!steady && r % kSubSteps == 0 && j >= spw) break;  // spw is a multiple of kSubSteps
      if (!kFp8 && (!kStageFlush || r % kSub == 0)) {
        const int sr = kStageFlush ? r / kSub : r;
        if ((steady || j < nvalid) && (j == 0 || j == cnext)) GroupRegs<T>(sbs[sr], sbz[sr], scl, nzm);
        if (j == cnext) cnext += p.gsteps;
      }
      uint32_t wv[4 * C::kWChunks];
#pragma unroll
      for (int cc = 0; cc < C::kWChunks; ++cc) {
        wv[4 * cc] = wb[r][cc].x; wv[4 * cc + 1] = wb[r][cc].y; wv[4 * cc + 2] = wb[r][cc].z; wv[4 * cc + 3] = wb[r][cc].w;
      }
      StepMma<T, NT, kFp8>(wv, xb[r], nzm, !kStageFlush || r % kSub == 0, c, acc);
      if (!kFp8 && (!kStageFlush || r % kSub == kSub - 1)) Flush<NT>(scl, c, acc);
      // Refill kRefill slots at once: a whole stage (2 KB of int4 weights, contiguous per warp)
      // when the ring holds two or more stages, else each slot as soon as it is consumed.
      if (r % kRefill == kRefill - 1) {
        const int jn0 = j - (kRefill - 1) + kD;
        if (steady || jn0 + kRefill <= nfast) {
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_w(jn0 + q, r - (kRefill - 1) + q, std::true_type{});
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_x(jn0 + q, r - (kRefill - 1) + q, std::true_type{});
        } else if (jn0 < spw) {
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_w(jn0 + q, r - (kRefill - 1) + q, std::false_type{});
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_x(jn0 + q, r - (kRefill - 1) + q, std::false_type{});
        }
      }
    }
    next_pass();
  };
  // Steady passes first, where they paid on the H200 (docs/perf/experiments.md): int4 with stage flush, two token
  // tiles on every plan (8 splits: 14336 x 4096 M = 16 12.02 -> 11.28 µs, M = 12 11.83 -> 11.04, 4096² M = 16 5.18 ->
  // 5.12), one tile on plans of fewer than kMaxSplits
  // splits (4096 x 14336 and 8192² M = 1-8 2.5-5% faster; on 8-split plans, one 512-thread block per SM, 1-4% slower at
  // 14336 x 4096). fp8 lost 0-3% in both forms, and the step-flush instances spilled registers.
  int i = 0;
  if constexpr (!kFp8 && kStageFlush) {
    if (NT > 1 || p.splits < kMaxSplits)
      for (; i + 2 * kD <= nfast; i += kD) pass(i, std::true_type{});
  }
  for (; i < spw; i += kD) pass(i, std::false_type{});

  // ---- sum the warps in QLinearKernel's order ----
  if constexpr (!kEarlyTrigger) ptx::LaunchDependents();  // the next kernel's blocks may start their weight prefetch
  if constexpr (kPaired) {
    PairSum<T, NT>(red, hand, hbar, p, rank, warp, lane, acc);
  } else {
    BlockSum<T, NT, kFp8>(red, p, strip, warp, lane, acc, fsv);
  }
}

// QLinearDirectKernel, as strip pairs where UsePairs allows them (int4 with stage flush).
template <typename T, int NT, bool kFp8, bool kStageFlush>
cudaError_t LaunchQLinearDirect(const QLinearParams& p, cudaStream_t stream) {
  constexpr bool kCanPair = !kFp8 && kStageFlush;
  const bool pair = kCanPair && UsePairs(p);
  cudaLaunchConfig_t cfg = {};
  const int strips = (p.N + kWarpN - 1) / kWarpN;
  cfg.gridDim = dim3(pair ? (strips + 1) & ~1 : strips);  // pairs: the packed strips are a multiple of kWarpsN
  cfg.blockDim = dim3(32 * kWarpsK * p.splits);
  // The warps' accumulators; pairs: then rank 0's sums of both strips and an mbarrier.
  cfg.dynamicSmemBytes = (size_t(kWarpsK) * p.splits + (pair ? 2 : 0)) * NT * 8 * 32 * sizeof(float) + (pair ? 8 : 0);
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  AddPdl(&cfg);
  if (pair) {
    ++pair_launches;
    cudaLaunchAttribute& a = at[cfg.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = 2;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  // Short warp ranges (two stages or fewer: 4096²) request 2 weight steps before the wait and the rest of the ring
  // after X; longer ones the whole ring first (see the kernel's prologue).
  const bool short_ranges = p.steps_per_warp <= 2 * kSubSteps;
  if constexpr (kCanPair) {
    if (pair)
      return short_ranges ? cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, 2, true>, p)
                          : cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, kDirectMaxDepth, true>, p);
  }
  if (short_ranges) return cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, 2>, p);
  return cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, kDirectMaxDepth>, p);
}

// The sm_90 staged small-M kernel for 8-split plans (qlinear_staged.cuh, included by the int4 stage-flush and the fp8
// instantiations): cudaErrorNotSupported, with nothing launched, where it does not apply.
template <typename T, bool kFp8>
cudaError_t LaunchQLinearStaged(const QLinearParams& p, cudaStream_t stream);

// The sm_90a wgmma kernel for int4 M > 32 (qlinear_wgmma.cuh, included by the int4
// stage-flush instantiations): cudaErrorNotSupported, with nothing launched, where it does not apply.
template <typename T>
cudaError_t LaunchQLinearWgmma(const QLinearParams& p, cudaStream_t stream);

// One instantiation file per (T, kFp8, kStageFlush) calls this: M <= 8 takes the staged kernel (8-split plans on sm_90,
// int4 with stage flush or fp8, where it applies), else M <= 8 and M <= 16 take the small-M kernel with one or two
// 8-token tiles, larger M the wgmma kernel (where it applies) or the 32-token split-K kernel.
template <typename T, bool kFp8, bool kStageFlush>
cudaError_t LaunchQLinear(const QLinearParams& p, cudaStream_t stream) {
  if constexpr (kFp8 || kStageFlush) {
    if (p.M <= kStagedMaxRows) {
      const cudaError_t e = LaunchQLinearStaged<T, kFp8>(p, stream);
      if (e != cudaErrorNotSupported) return e;
    }
  }
  if (p.M <= 8) return LaunchQLinearDirect<T, 1, kFp8, kStageFlush>(p, stream);
  static_assert(kSmallMMaxRows == 16, "the small-M kernel's widest instantiation holds two 8-token tiles");
  if (p.M <= kSmallMMaxRows) return LaunchQLinearDirect<T, 2, kFp8, kStageFlush>(p, stream);
  if constexpr (!kFp8 && kStageFlush) {
    const cudaError_t e = LaunchQLinearWgmma<T>(p, stream);
    if (e != cudaErrorNotSupported) return e;
  }
  using C = Cfg<kFp8, 4, kStageFlush, true>;
  QLinearParams q = p;
  q.pairs = PairsPerBlock(p, (p.M + C::kXRows - 1) / C::kXRows, C::kSub, C::kMinBlocks);
  if (q.pairs > 1) return LaunchQLinearNT<T, 4, kFp8, kStageFlush, true>(q, stream);
  return LaunchQLinearNT<T, 4, kFp8, kStageFlush, false>(q, stream);
}

}  // namespace flashq::gemm::detail
