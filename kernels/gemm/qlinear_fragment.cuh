// Fragment math of our dequantize-in-register linear kernels: W4A16 (group-wise int4) and W8A16 (FP8 E4M3,
// per-channel / per-tensor scale), 16-bit activations, fp32 accumulation. Every kernel (direct, staged, tiled, wgmma)
// does its arithmetic here, which is what keeps their outputs bitwise equal.
//
// The kernels compute Yᵀ = W · Xᵀ on mma.sync m16n8k16 with the roles swapped: the A operand is
// 16 output columns of W, dequantized straight into the A fragment registers, the B operand is
// 8 tokens of X, so M <= 8 costs one n8 tile (not a mostly empty m16 tile) and no register
// shuffles are needed. A warp owns a 32-column strip and one contiguous "warp range" of k32 steps;
// the plan (PlanFor: K and N only) cuts each strip's K into 2 * splits warp ranges.
// int4: q becomes the exact integer q - z in 16 bits (one lop3 with a magic exponent, one
// fma), the mma accumulates a stage (groups of 4k steps) or a k32 step (other group sizes,
// the step-flush instantiations) into a fresh fp32 fragment, and the group scale is applied in fp32.
// fp8: the E4M3 bits, placed at load time, are moved into a 16-bit float with shifts and masks (no
// cvt): for fp16 the value is w * 2^-8 (the 2^8 folds into the fp32 channel scale), for bf16
// w * 2^-120, then one exact bf16x2 multiply by 2^120 (subnormal E4M3 values stay exact).
// This per-warp arithmetic is StepMma/Flush in every kernel, and all sum the warp ranges as
// ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...) in fp32. No arithmetic mixes tokens, so
// row i is bitwise identical for any M.
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
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

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

}  // namespace flashq::gemm::detail
