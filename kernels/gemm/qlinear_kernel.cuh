// Dequantize-in-register linear kernel for small and medium M: W4A16 (group-wise int4)
// and W8A16 (FP8 E4M3, per-channel / per-tensor scale), 16-bit activations, fp32 accumulation.
//
// Algorithm. Y[M][N] = X[M][K] · Wᵀ on mma.sync m16n8k16 (A = X rows, B = W). A block is
// 8 warps: 2 side by side along N (64 columns each = 8 n8 subtiles) x 4 splitting the
// block's K range into contiguous runs of k32 steps. Blocks split K further (split-K,
// grid.y). Each thread stages its own bytes through shared memory with cp.async
// (kStages deep, no block barrier in the main loop): per k32 step 16 B of X per row
// pair, 32 B (int4) or 64 B (fp8) of W, and the group's scales / zeros on a group change.
// Weights are dequantized to exact small integers (q - z) or fp8 values in 16-bit, the
// mma accumulates one group into a fresh fp32 fragment, and the group scale is applied
// in fp32 (acc = fma(scale, c, acc)). The 4 K-warps reduce through shared memory in
// order 0..3; split-K partials go to an fp32 workspace and the last block of a tile
// (atomic ticket) sums splits 0..S-1 in order, all its threads in parallel (a first
// version let 64 threads walk the tile element by element: ~20 µs of serialized L2
// latency per launch, seen with ncu as SMs idle for 60% of the kernel). The K partition depends on (K, N) only
// (PlanFor), and no arithmetic mixes rows, so row i is bitwise identical for any M.
//
// Layouts (built by weights.cu). k is permuted inside each k32 step so that thread
// t = lane%4 owns channels 8t..8t+7 for both operands: X is read as one 16 B chunk per row
// and W as one 32-bit word (8 nibbles) or 8 bytes (fp8) per n8 subtile.
//   int4 qw  uint32 [strips][nk32][lane][s]: n = 64*strip + 8s + lane/4, nibble of k = 8t+j
//            at bit 4*(j/2) + 16*(j%2), so (w >> 4p) & 0x000f000f yields the pair (2p, 2p+1).
//   fp8  qw  uint8  [strips][nk32][lane][s][j]
//   scales   fp16 [G][strips][t][s][2]: n = 64*strip + 8s + 2t + e (the C fragment's columns)
//   zeros    uint8 [G][strips][g][s]:   n = 64*strip + 8s + g    (the B fragment's column)
// Limits: K % 8 == 0; group_size % 32 == 0 or channelwise; M per launch <= 128.
// Measured (H200, 2026-11-22, bench/results/gemm-nvidia-h200-2026-11-22.md): W4A16 g128 M=1
// 11.8 / 26.0 / 23.6 / 26.7 µs on (K,N) = 4096², 4096x14336, 14336x4096, 8192² = 1.06-1.31x
// cuBLASLt BF16, 19-33% of the copy ceiling; M=16 0.68-0.92x; M=64 0.25-0.39x. Far below
// the issue's bars: the loop is issue-bound (ncu: ~1.5 IPC/SM, 16 warps/SM, long dependent
// chains) and spends many instructions on per-step integer divisions and address math;
// bench/gemm/next-qlinear-nodiv.patch removes them (compiled, not yet run on a GPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdlib>

#include "kernels/gemm/gemm_internal.h"

namespace flashq::gemm::detail {

constexpr int kStages = 4;

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
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (magic + q) - (magic + z) as an fma with 1.0: exact, both are small integers.
template <typename T>
__device__ __forceinline__ uint32_t DequantPair(uint32_t w, int p, uint32_t neg_zm) {
  uint32_t h = ((w >> (4 * p)) & 0x000f000fu) | (Act<T>::kMagic * 0x10001u);
  uint32_t d;
  if constexpr (std::is_same_v<T, __half>)
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(h), "r"(Act<T>::kOne2), "r"(neg_zm));
  else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(h), "r"(Act<T>::kOne2), "r"(neg_zm));
  return d;
}

template <typename T>
__device__ __forceinline__ uint32_t Fp8Pair(uint32_t two_bytes) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xffffu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  } else {
    __half_raw lo, hi;
    lo.x = h.x;
    hi.x = h.y;
    __nv_bfloat162 b = __floats2bfloat162_rn(__half2float(__half(lo)), __half2float(__half(hi)));
    return *reinterpret_cast<uint32_t*>(&b);
  }
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool pred) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void CpAsync16Ca(void* smem, const void* gmem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsync8(void* smem, const void* gmem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <bool kFp8, int MT>
struct Smem {
  static constexpr int kB = kFp8 ? 4 : 2;        // uint4 of weights per thread per step
  static constexpr int kA = 2 * MT;              // uint4 of X per thread per step (rows g, g+8 per m16)
  static constexpr int kS = kFp8 ? 0 : 2;        // uint4 of fp16 scales (16 values)
  static constexpr int kSlots = kB + kA + kS;
  static constexpr int kZBytes = kFp8 ? 0 : 8;
  static constexpr size_t kBytes = size_t(kStages) * kThreads * (kSlots * 16 + kZBytes);
  static_assert(kBytes >= size_t(kThreads) * MT * 32 * 4, "the reduction reuses the pipeline buffer");
};

template <typename T, int MT, bool kFp8>
__global__ void __launch_bounds__(kThreads, MT == 1 ? 2 : 1) QLinearKernel(const QLinearParams p) {
  using S = Smem<kFp8, MT>;
  extern __shared__ uint4 smem[];
  uint2* zsm = reinterpret_cast<uint2*>(smem + size_t(kStages) * S::kSlots * kThreads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = warp % kWarpsK, nw = warp / kWarpsK;
  const int g = lane >> 2, t = lane & 3;
  const int strip = blockIdx.x * kWarpsN + nw;
  const int split = blockIdx.y;
  const int m0 = blockIdx.z * 16 * MT;
  const int part = split * kWarpsK + kw;
  const int j0 = part * p.steps_per_warp;
  const int nsteps = max(0, min(j0 + p.steps_per_warp, p.nk32) - j0);
  const T* x = static_cast<const T*>(p.x);

  auto slot = [&](int st, int s) -> uint4* { return smem + (size_t(st) * S::kSlots + s) * kThreads + tid; };
  auto new_group = [&](int i) { return i == 0 || (j0 + i) / p.gsteps != (j0 + i - 1) / p.gsteps; };

  auto issue = [&](int i) {
    const int j = j0 + i, st = i % kStages;
    const uint4* wsrc = static_cast<const uint4*>(p.qw) + ((size_t(strip) * p.nk32 + j) * 32 + lane) * S::kB;
#pragma unroll
    for (int b = 0; b < S::kB; ++b) CpAsync16(slot(st, b), wsrc + b, true);
    const int k = j * kStepK + 8 * t;
    const bool kin = k < p.K;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + mt * 16 + g + 8 * h;
        const bool pred = kin && row < p.M;
        CpAsync16(slot(st, S::kB + 2 * mt + h), pred ? x + size_t(row) * p.K + k : x, pred);
      }
    if constexpr (!kFp8) {
      if (new_group(i)) {
        const int grp = j / p.gsteps;
        const size_t gs = size_t(grp) * p.strips + strip;
        const uint16_t* ssrc = p.scales + (gs * 4 + t) * 16;
        CpAsync16Ca(slot(st, S::kB + S::kA), ssrc);
        CpAsync16Ca(slot(st, S::kB + S::kA + 1), ssrc + 8);
        CpAsync8(zsm + st * kThreads + tid, static_cast<const uint8_t*>(p.zeros) + (gs * 8 + g) * 8);
      }
    }
  };

  float acc[MT][8][4], c[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][s][e] = c[mt][s][e] = 0.0f;
  float scl[16];
  uint32_t nzm[8];
  if constexpr (kFp8) {
    const float4* fs = reinterpret_cast<const float4*>(p.fscales + (size_t(strip) * 4 + t) * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 v = __ldg(fs + i);
      scl[4 * i] = v.x; scl[4 * i + 1] = v.y; scl[4 * i + 2] = v.z; scl[4 * i + 3] = v.w;
    }
  }

  auto flush = [&]() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[mt][s][e] = fmaf(scl[2 * s + (e & 1)], c[mt][s][e], acc[mt][s][e]);
          c[mt][s][e] = 0.0f;
        }
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < nsteps) issue(i);
    CpAsyncCommit();
  }

  for (int i = 0; i < nsteps; ++i) {
    CpAsyncWait<kStages - 2>();
    __syncwarp();
    const int st = i % kStages;
    if constexpr (!kFp8) {
      if (new_group(i)) {
        if (i > 0) flush();
        const uint4 s0 = *slot(st, S::kB + S::kA), s1 = *slot(st, S::kB + S::kA + 1);
        const uint32_t sw[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          float2 f = __half22float2(*reinterpret_cast<const __half2*>(&sw[q]));
          scl[2 * q] = f.x;
          scl[2 * q + 1] = f.y;
        }
        const uint2 z = zsm[st * kThreads + tid];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          uint32_t zb = ((s < 4 ? z.x : z.y) >> (8 * (s & 3))) & 0xffu;
          nzm[s] = ((Act<T>::kMagic + zb) * 0x10001u) ^ 0x80008000u;  // -(magic + z) in both halves
        }
      }
    }
    uint32_t wv[S::kB * 4];
#pragma unroll
    for (int b = 0; b < S::kB; ++b) {
      const uint4 v = *slot(st, b);
      wv[4 * b] = v.x; wv[4 * b + 1] = v.y; wv[4 * b + 2] = v.z; wv[4 * b + 3] = v.w;
    }
    uint4 av[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      av[mt][0] = *slot(st, S::kB + 2 * mt);
      av[mt][1] = *slot(st, S::kB + 2 * mt + 1);
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = ks ? av[mt][0].z : av[mt][0].x;
        a[mt][1] = ks ? av[mt][1].z : av[mt][1].x;
        a[mt][2] = ks ? av[mt][0].w : av[mt][0].y;
        a[mt][3] = ks ? av[mt][1].w : av[mt][1].y;
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        uint32_t b0, b1;
        if constexpr (kFp8) {
          const uint32_t w = wv[2 * s + ks];
          b0 = Fp8Pair<T>(w);
          b1 = Fp8Pair<T>(w >> 16);
        } else {
          b0 = DequantPair<T>(wv[s], 2 * ks, nzm[s]);
          b1 = DequantPair<T>(wv[s], 2 * ks + 1, nzm[s]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) Mma<T>(c[mt][s], a[mt], b0, b1);
      }
    }
    __syncwarp();
    const int inext = i + kStages - 1;
    if (inext < nsteps) issue(inext);
    CpAsyncCommit();
  }
  if (nsteps > 0) flush();

  // ---- reduce the 4 K-warps in order 0..3 ----
  CpAsyncWait<0>();
  __syncthreads();
  constexpr int kNA = MT * 32;
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(warp * kNA + (mt * 8 + s) * 4 + e) * 32 + lane] = acc[mt][s][e];
  __syncthreads();
  if (kw == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int idx = (mt * 8 + s) * 4 + e;
          float v = red[(warp * kNA + idx) * 32 + lane];
#pragma unroll
          for (int w = 1; w < kWarpsK; ++w) v += red[((warp + w) * kNA + idx) * 32 + lane];
          acc[mt][s][e] = v;
        }
  }

  T* y = static_cast<T*>(p.y);
  const int col0 = strip * kWarpN + 2 * t;
  auto for_each_out = [&](auto&& fn) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + mt * 16 + g + (e >= 2 ? 8 : 0);
          const int col = col0 + s * 8 + (e & 1);
          if (row < p.M && col < p.N) fn(acc[mt][s][e], row, col);
        }
  };
  if (p.splits == 1) {
    if (kw == 0) for_each_out([&](float v, int row, int col) { y[size_t(row) * p.N + col] = T(v); });
    return;
  }
  if (kw == 0)
    for_each_out([&](float v, int row, int col) { p.partial[(size_t(split) * p.M + row) * p.N + col] = v; });
  __threadfence();
  __syncthreads();
  __shared__ int s_last;
  const int tile = blockIdx.z * gridDim.x + blockIdx.x;
  if (tid == 0) s_last = atomicAdd(p.counters + tile, 1) == p.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // The last block of the tile sums splits 0..S-1 in that order. All 256 threads take
  // part, each element's S loads are issued together (coalesced along N), so the tail
  // costs one round of L2 latency per 256 elements instead of one per element.
  constexpr int kTileRows = 16 * MT;
  constexpr int kPer = kTileRows * kBlockN / kThreads;
  const int ncol0 = blockIdx.x * kBlockN;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid + i * kThreads;
    const int row = m0 + e / kBlockN, col = ncol0 + e % kBlockN;
    if (row >= p.M || col >= p.N) continue;
    const float* src = p.partial + size_t(row) * p.N + col;
    const size_t stride = size_t(p.M) * p.N;
    float v[kMaxSplits];
#pragma unroll
    for (int sp = 0; sp < kMaxSplits; ++sp) v[sp] = sp < p.splits ? __ldcg(src + sp * stride) : 0.0f;
    float sum = v[0];
#pragma unroll
    for (int sp = 1; sp < kMaxSplits; ++sp)
      if (sp < p.splits) sum += v[sp];
    y[size_t(row) * p.N + col] = T(sum);
  }
  if (tid == 0) p.counters[tile] = 0;
}

template <typename T, int MT, bool kFp8>
cudaError_t LaunchQLinearMT(const QLinearParams& p, cudaStream_t stream) {
  using S = Smem<kFp8, MT>;
  // The attribute belongs to the current device: set it on every launch (a static
  // once-only call left every GPU but the first without it: cudaErrorInvalidValue).
  const cudaError_t attr = cudaFuncSetAttribute(QLinearKernel<T, MT, kFp8>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::kBytes));
  if (attr != cudaSuccess) return attr;
  const int n_blocks = (p.N + kBlockN - 1) / kBlockN;
  dim3 grid(n_blocks, p.splits, (p.M + 16 * MT - 1) / (16 * MT));
  QLinearKernel<T, MT, kFp8><<<grid, kThreads, S::kBytes, stream>>>(p);
  return cudaGetLastError();
}

// Benchmark knob: FLASHQ_GEMM_MAX_MT=1 keeps 16-row tiles for every M (numerically
// identical: tiling along M never changes a row's arithmetic).
inline int MaxMT() {
  static const int v = [] {
    const char* e = std::getenv("FLASHQ_GEMM_MAX_MT");
    return e && e[0] == '1' ? 1 : 2;
  }();
  return v;
}

template <typename T, bool kFp8>
cudaError_t LaunchQLinear(const QLinearParams& p, cudaStream_t stream) {
  if (p.M <= 16 || MaxMT() == 1) return LaunchQLinearMT<T, 1, kFp8>(p, stream);
  return LaunchQLinearMT<T, 2, kFp8>(p, stream);
}

}  // namespace flashq::gemm::detail
