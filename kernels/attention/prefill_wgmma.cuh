// Varlen prefill attention for Hopper (sm_90a): wgmma tensor-core MMAs, FlashAttention-style.
//
// Algorithm: one CTA of two warpgroups per (128-query tile, query head, sequence); warpgroup w owns
// query rows [64w, 64w + 64). K/V tiles of 128 keys stream through a 3-stage cp.async ring in
// shared memory. Iteration j loads tile j+1, issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back
// to back, and runs softmax(S_j) while P_{j-1} V_{j-1} is still on the tensor cores (the
// intra-warpgroup overlap of FlashAttention-3). Per tile: S = Q K^T with
// wgmma m64n128k16 (A = Q and B = K both from shared memory, K-major), online softmax on the
// FP32 accumulators in registers (exp2 domain), then O += P V with wgmma m64nDk16 where A = P
// comes straight from registers (the accumulator layout is the A-fragment layout) and B = V from
// shared memory read MN-major (no transpose pass). Masking (tail, bottom-right causal), GQA,
// LSE and the epilogue are the same as the mma.sync kernel (prefill_kernel.cuh).
// Layouts: shared tiles are 64-column panels of 128-byte rows with the 128-byte XOR swizzle
// (chunk ^ row % 8), the canonical wgmma SWIZZLE_128B layout; panel p of a tile with R rows
// sits at p * R * 128 bytes. Tiles are 1024-byte aligned.
// Limits: D in {64, 128}; sm_90a only (the launcher falls back to mma.sync elsewhere). No TMA,
// no warp specialisation or inter-warpgroup ping-pong: all 256 threads load, then compute.
// Dispatched on Hopper only as the fallback of prefill_wgmma_tma.cuh for D = 128 (driver rejects
// the tensor maps). Measured on H200 (bench/results, 2026-11-22, BF16, 32 heads):
// hd128 351-412 TFLOP/s non-causal, 282-426 causal (1.04-1.28x SDPA flash, 0.62-0.74x cuDNN);
// hd64 290 (the warp-specialised kernel is faster there). ncu (hd128): tensor pipe ~41% busy,
// 2 warps per scheduler, issue-bound on softmax + cp.async instructions.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/attention/mma_utils.cuh"
#include "kernels/attention/wgmma_ops.cuh"
#include "kernels/common/cuda_check.h"

namespace flashq::attention::detail {

template <int D>
struct WgmmaPrefillTraits {
  static constexpr int kBM = 128;  // 2 warpgroups x 64 rows
  static constexpr int kBN = 128;  // keys per tile
  static constexpr int kThreads = 256;
  static constexpr int kPanels = D / 64;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKVBytes = kBN * D * 2;  // one of K or V, one stage
  static constexpr int kStages = 3;  // tile j+1 loading, tile j in QK^T, tile j-1's V in P*V
  static constexpr int kSmemBytes = kQBytes + kStages * 2 * kKVBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(D == 64 || D == 128, "wgmma prefill: head dim 64 or 128");
};

// Element offset of (row, 16-byte chunk) in a panel-major SWIZZLE_128B tile of kRows rows.
template <int kRows>
__device__ __forceinline__ int PanelOff(int row, int chunk) {
  return (chunk >> 3) * kRows * 64 + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

template <int D, int kThreads, int kRows, typename T>
__device__ __forceinline__ void LoadPanelTile(T* smem, const T* base, int64_t row_stride, int valid, int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "tile chunks must divide evenly over the threads");
#pragma unroll
  for (int i = 0; i < kTotal / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const bool ok = row < valid;
    const T* src = ok ? base + row * row_stride + chunk * 8 : base;
    CpAsync16(SmemAddr(smem + PanelOff<kRows>(row, chunk)), src, ok);
  }
}

// wgmma shared-memory descriptor, SWIZZLE_128B (byte offsets; 16-byte units in the encoding).
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <typename T, int D, bool kCausal>
__global__ void __launch_bounds__(256, 1) PrefillWgmmaKernel(const VarlenAttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = WgmmaPrefillTraits<D>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kThreads = Tr::kThreads;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kSN = kBN / 2;  // S accumulators per thread (m64 x kBN / 128 threads)
  constexpr int kON = D / 2;    // O accumulators per thread
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem);                                          // panels of (kBM, 64)
  T* sKV = reinterpret_cast<T*>(smem + Tr::kQBytes);  // kStages x [K, V], panels of (kBN, 64)
  auto sK = [&](int st) { return sKV + st * 2 * (kBN * D); };  // stage st: K then V
  auto sV = [&](int st) { return sKV + st * 2 * (kBN * D) + kBN * D; };

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest causal tiles first
  const int q_start = p.cu_seqlens_q[b], k_start = p.cu_seqlens_k[b];
  const int lq = p.cu_seqlens_q[b + 1] - q_start, lk = p.cu_seqlens_k[b + 1] - k_start;
  const int m0 = m_block * kBM;
  if (m0 >= lq) return;
  const int hk = h / (p.num_heads_q / p.num_heads_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4, wl = warp % 4;
  const int g = lane / 4, t = lane % 4;

  int n_blocks = (lk + kBN - 1) / kBN;
  if constexpr (kCausal) {
    const int last_key = m0 + kBM - 1 + lk - lq;
    n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / kBN + 1);
  }
  const T* q = static_cast<const T*>(p.q) + (int64_t(q_start) + m0) * p.q_row_stride + int64_t(h) * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + int64_t(k_start) * p.k_row_stride + int64_t(hk) * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + int64_t(k_start) * p.v_row_stride + int64_t(hk) * p.v_head_stride;

  float o[kON];
#pragma unroll
  for (int i = 0; i < kON; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int row0 = m0 + wg * 64 + wl * 16 + g;  // this thread's rows: row0 and row0 + 8

  const uint32_t q_addr = SmemAddr(sQ) + wg * 64 * 128;
  float s[kSN];
  uint32_t a[kBN / 16][4], a_next[kBN / 16][4];

  // S = Q K^T for the tile in stage st: D/16 k-steps of m64 n128 k16 (not waited on here).
  auto issue_qk = [&](int st) {
    const uint32_t k_addr = SmemAddr(sK(st));
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da = SmemDesc(q_addr + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = SmemDesc(k_addr + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
      Wgmma<kBN, kBf16>::SS(s, da, db, kk > 0 ? 1 : 0);
    }
  };
  // O += P V for the tile in stage st: kBN/16 k-steps of m64 nD k16, A = P (registers), B = V MN-major.
  auto issue_pv = [&](int st) {
    const uint32_t v_addr = SmemAddr(sV(st));
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint64_t db = SmemDesc(v_addr + kk * 16 * 128, kBN * 128, 1024);
      Wgmma<D, kBf16>::RS(o, a[kk], db, 1);
    }
  };
  // Mask and online softmax of the tile starting at key n0; P goes to a_next; returns alpha
  // (the rescale O needs once the previous P*V has landed) for rows g and g + 8.
  auto softmax = [&](int n0, float (&alpha)[2]) {
    const bool tail = n0 + kBN > lk;
    const bool diag = kCausal && (n0 + kBN - 1 > m0 + lk - lq);
    if (tail || diag) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + j * 8 + 2 * t + (e & 1);
          const int row = row0 + (e >= 2 ? 8 : 0);
          bool masked = col >= lk;
          if constexpr (kCausal) masked = masked || (col > row + lk - lq);
          if (masked) s[4 * j + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = QuadMax(mx);
      const float m_use = mx == -INFINITY ? 0.0f : mx * scale_log2;
      alpha[r] = exp2f(row_max[r] * scale_log2 - m_use);
      row_max[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        s[4 * j + 2 * r] = exp2f(fmaf(s[4 * j + 2 * r], scale_log2, -m_use));
        s[4 * j + 2 * r + 1] = exp2f(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_use));
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      a_next[kk][0] = Pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      a_next[kk][1] = Pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      a_next[kk][2] = Pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      a_next[kk][3] = Pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  auto rescale_and_take_p = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= alpha[0]; o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1]; o[4 * j + 3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[kk][i] = a_next[kk][i];
  };
  auto fence_s = [&] {
#pragma unroll
    for (int i = 0; i < kSN; ++i) RegFence(s[i]);
  };
  auto fence_o_a = [&] {
#pragma unroll
    for (int i = 0; i < kON; ++i) RegFence(o[i]);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) RegFence(a[kk][i]);
  };
  auto load_tile = [&](int j) {
    const int n1 = j * kBN, st = j % Tr::kStages;
    LoadPanelTile<D, kThreads, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, tid);
    LoadPanelTile<D, kThreads, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, tid);
  };

  // Pipeline (3 stages): iteration j loads tile j+1, runs S_j = Q K_j^T and O += P_{j-1} V_{j-1}
  // back to back on the tensor cores, and computes softmax(S_j) while P_{j-1} V_{j-1} is in flight.
  if (n_blocks > 0) {
    LoadPanelTile<D, kThreads, kBM>(sQ, q, p.q_row_stride, lq - m0, tid);
    load_tile(0);
    CpAsyncCommit();
    CpAsyncWait<0>();
    FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    __syncthreads();
    if (n_blocks > 1) {
      load_tile(1);
      CpAsyncCommit();
    }
    WgmmaFence();
    issue_qk(0);
    WgmmaCommit();
    WgmmaWait<0>();
    fence_s();
    float alpha[2];
    softmax(0, alpha);
    rescale_and_take_p(alpha);  // o is still zero
  }
  for (int j = 1; j < n_blocks; ++j) {
    CpAsyncWait<0>();  // tile j
    FenceProxyAsync();
    __syncthreads();   // tile j visible; everyone's P_{j-2} V_{j-2} finished, so its stage is free
    if (j + 1 < n_blocks) {
      load_tile(j + 1);
      CpAsyncCommit();
    }
    WgmmaFence();
    issue_qk(j % Tr::kStages);
    WgmmaCommit();
    issue_pv((j - 1) % Tr::kStages);
    WgmmaCommit();
    WgmmaWait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
    fence_s();
    float alpha[2];
    softmax(j * kBN, alpha);
    WgmmaWait<0>();
    fence_o_a();
    rescale_and_take_p(alpha);
  }
  if (n_blocks > 0) {
    WgmmaFence();
    issue_pv((n_blocks - 1) % Tr::kStages);
    WgmmaCommit();
    WgmmaWait<0>();
    fence_o_a();
  }

  // Epilogue (as prefill_kernel.cuh): normalise, stage rows in sQ (Swz layout), 16-byte stores.
  __syncthreads();
  float inv[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(row_sum[r]);
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    lse[r] = sum > 0.0f ? (row_max[r] * scale_log2 + log2f(sum)) * kLn2 : -INFINITY;
  }
  const int wrow0 = wg * 64 + wl * 16;  // this warp's first row in the tile
  T* sO = sQ;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<uint32_t*>(sO + Swz<D>(wrow0 + g, j) + 2 * t) = Pack2<T>(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sO + Swz<D>(wrow0 + g + 8, j) + 2 * t) =
        Pack2<T>(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]);
  }
  if (p.lse != nullptr && t == 0) {
    const int64_t lse_stride = p.lse_head_stride ? p.lse_head_stride : int64_t(p.cu_seqlens_q[p.batch]);
    float* l = p.lse + int64_t(h) * lse_stride + q_start;
    if (row0 < lq) l[row0] = lse[0];
    if (row0 + 8 < lq) l[row0 + 8] = lse[1];
  }
  __syncwarp();
  T* out = static_cast<T*>(p.o) + (int64_t(q_start) + m0) * p.o_row_stride + int64_t(h) * p.o_head_stride;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = wrow0 + idx / kChunks, chunk = idx % kChunks;
    if (m0 + row < lq)
      *reinterpret_cast<uint4*>(out + row * p.o_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(sO + Swz<D>(row, chunk));
  }
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel there
#endif
}

template <typename T, int D, bool kCausal>
Status LaunchPrefillWgmma(const VarlenAttentionParams& p, cudaStream_t stream) {
  using Tr = WgmmaPrefillTraits<D>;
  auto kernel = PrefillWgmmaKernel<T, D, kCausal>;
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid((p.max_seqlen_q + Tr::kBM - 1) / Tr::kBM, p.num_heads_q, p.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  FQ_CUDA_RETURN_LAUNCH();
  return Status::Ok();
}

}  // namespace flashq::attention::detail
