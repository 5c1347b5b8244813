// Device helpers shared by the attention kernels: mma.sync m16n8k16 (FP16/BF16 in, FP32 accumulate), packing,
// cp.async tile loads, and the XOR-swizzled shared-memory tile layouts (Swz: rows of D; PanelOff: 64-column panels, the wgmma/TMA SWIZZLE_128B layout).
// sm_80+ instructions only, so one source serves sm_80, sm_89 and sm_90a.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16, row): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8):       c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"

namespace flashq::attention::detail {

template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> two 16-bit values in one register, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }

// Element offset of (row, 16-byte chunk) in a [rows, D] tile of 16-bit values whose chunks are
// XOR-swizzled by row % 8: ldmatrix's 8 row addresses then hit 8 distinct 16-byte bank groups.
template <int D>
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Element offset of (row, 16-byte chunk) in a panel-major SWIZZLE_128B tile of kRows rows.
template <int kRows>
__device__ __forceinline__ int PanelOff(int row, int chunk) {
  return (chunk >> 3) * kRows * 64 + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// rows x D tile from global (row r at base + r * row_stride) into shared memory at element offset
// off(row, chunk), one cp.async per 16-byte chunk over kThreads threads; rows >= valid are
// zero-filled (so masked keys never inject NaN/Inf through P*V).
template <int D, int kThreads, int kRows, typename T, typename Off>
__device__ __forceinline__ void CpAsyncTile(T* smem, const T* base, int64_t row_stride, int valid, int tid, Off off) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "tile chunks must divide evenly over the threads");
#pragma unroll
  for (int i = 0; i < kTotal / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const bool ok = row < valid;
    const T* src = ok ? base + row * row_stride + chunk * 8 : base;
    ptx::CpAsync16(ptx::SmemAddr(smem + off(row, chunk)), src, ok);
  }
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace flashq::attention::detail
