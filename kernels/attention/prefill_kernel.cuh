// Varlen prefill attention, FlashAttention-2 style, mma.sync (sm_80+; runs on sm_90a too).
//
// Algorithm: one CTA per (query tile of kBM rows, query head, sequence). Each warp owns kMT x 16
// query rows (kMT = 2 for D <= 128: one K/V fragment feeds two MMAs). K and V tiles of kBN keys stream through shared memory with cp.async (K[n+1] loads while
// softmax and P*V of tile n run; V[n] loads while Q*K^T of tile n runs). Scores stay in registers:
// online softmax in the exp2 domain (running max and per-thread partial sums), P is re-packed from
// the S accumulators into A fragments for P*V without touching shared memory. FP32 accumulation.
// Causal is bottom-right aligned; tiles past the diagonal are never loaded; rows that see no key
// give O = 0, LSE = -inf. GQA: head h reads kv head h / (Hq / Hkv).
// Layouts: Q/K/V/O [tokens, heads, D] with element strides; shared tiles [rows, D] swizzled
// (Swz). Output staged through shared memory for 16-byte coalesced stores. LSE fp32 [Hq, total_q].
// Limits: D in {64, 128, 256}; 16-byte aligned rows. Tiles are a function of D only, so results
// are batch invariant and deterministic.
// Used on sm_80/sm_89, and on Hopper for D = 256. Measured on H200 (bench/results/attention-nvidia-h200.md,
// the "mma.sync" column, BF16, 32 heads): hd128 264-285 TFLOP/s non-causal, hd64 267.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/attention/mma_utils.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"

namespace flashq::attention::detail {

// kBMOverride != 0 replaces the default query tile (bench variants only).
// Tile shape. kMT = 16-row m-tiles per warp: with 2, each K/V fragment read from shared memory
// feeds two MMAs, which halves shared-memory traffic per FLOP (the limit of the 1-tile version:
// 128 B/clk/SM of ldmatrix against mma.sync's rate). kBM / kMT overrides are for bench variants.
template <int D, int kBMOverride = 0, int kMTOverride = 0>
struct PrefillTraits {
  static constexpr int kMT = kMTOverride ? kMTOverride : (D == 256 ? 1 : 2);
  static constexpr int kBM = kBMOverride ? kBMOverride : (D == 256 ? 64 : 128);  // query rows per CTA
  static constexpr int kBN = (D == 256 || (D == 128 && kMT == 2)) ? 32 : 64;  // keys per tile (register budget)
  static constexpr int kWarps = kBM / (16 * kMT);
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kQInRegs = D <= 128 && kMT == 1;  // else Q fragments are re-read from shared memory
  static constexpr int kChunks = D / 8;            // 16-byte chunks per row
  static constexpr int kSmemElems = (kBM + 2 * kBN) * D;
  static_assert(D % 64 == 0, "head dim must be a multiple of 64");
  static_assert(kBN % 16 == 0, "key tile must be a multiple of 16");
  static_assert(kBM % (16 * kMT) == 0, "query tile must be whole warps");
};

// rows x D tile into XOR-swizzled shared memory (Swz), rows >= valid zero-filled.
template <int D, int kThreads, int kRows, typename T>
__device__ __forceinline__ void LoadTile(T* smem, const T* base, int64_t row_stride, int valid, int tid) {
  CpAsyncTile<D, kThreads, kRows>(smem, base, row_stride, valid, tid, [](int r, int c) { return Swz<D>(r, c); });
}

template <typename T, int D, bool kCausal, int kBMOverride = 0, int kMTOverride = 0>
__global__ void __launch_bounds__(PrefillTraits<D, kBMOverride, kMTOverride>::kThreads)
    PrefillKernel(const VarlenAttentionParams p) {
  using Tr = PrefillTraits<D, kBMOverride, kMTOverride>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kThreads = Tr::kThreads, kMT = Tr::kMT;
  constexpr int kNB = kBN / 8;   // 8-wide score blocks per warp row
  constexpr int kDB = D / 8;     // 8-wide output blocks
  constexpr int kKD = D / 16;    // 16-deep k-steps of Q*K^T
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBM, D)
  T* sK = sQ + kBM * D;                    // (kBN, D)
  T* sV = sK + kBN * D;                    // (kBN, D)

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest causal tiles first
  const int q_start = p.cu_seqlens_q[b], k_start = p.cu_seqlens_k[b];
  const int lq = p.cu_seqlens_q[b + 1] - q_start, lk = p.cu_seqlens_k[b + 1] - k_start;
  const int m0 = m_block * kBM;
  if (m0 >= lq) return;
  const int hk = h / (p.num_heads_q / p.num_heads_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  int n_blocks = (lk + kBN - 1) / kBN;
  if constexpr (kCausal) {
    const int last_key = m0 + kBM - 1 + lk - lq;  // the tile's last row sees keys <= last_key
    n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / kBN + 1);
  }

  const T* q = static_cast<const T*>(p.q) + (int64_t(q_start) + m0) * p.q_row_stride + int64_t(h) * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + int64_t(k_start) * p.k_row_stride + int64_t(hk) * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + int64_t(k_start) * p.v_row_stride + int64_t(hk) * p.v_head_stride;

  float acc_o[kMT][kDB][4];
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int j = 0; j < kDB; ++j) acc_o[mt][j][0] = acc_o[mt][j][1] = acc_o[mt][j][2] = acc_o[mt][j][3] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int warp_row0 = warp * 16 * kMT;

  if (n_blocks > 0) {
    LoadTile<D, kThreads, kBM>(sQ, q, p.q_row_stride, lq - m0, tid);
    LoadTile<D, kThreads, kBN>(sK, k, p.k_row_stride, lk, tid);
    ptx::CpAsyncCommit();
  }
  uint32_t q_frag[Tr::kQInRegs ? kKD : 1][4];

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int n0 = nb * kBN;
    LoadTile<D, kThreads, kBN>(sV, v + int64_t(n0) * p.v_row_stride, p.v_row_stride, lk - n0, tid);
    ptx::CpAsyncCommit();
    ptx::CpAsyncWait<1>();  // Q and K[nb] have landed
    __syncthreads();

    if constexpr (Tr::kQInRegs) {
      if (nb == 0) {
#pragma unroll
        for (int kk = 0; kk < kKD; ++kk)
          ptx::LdMatrixX4(ptx::SmemAddr(sQ + Swz<D>(warp_row0 + (lane % 16), 2 * kk + lane / 16)), q_frag[kk][0],
                     q_frag[kk][1], q_frag[kk][2], q_frag[kk][3]);
      }
    }

    // S = Q K^T  (kMT x 16 rows x kBN keys per warp); each K fragment feeds kMT MMAs.
    float s[kMT][kNB][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < kNB; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (Tr::kQInRegs) {
          a[mt][0] = q_frag[kk][0]; a[mt][1] = q_frag[kk][1]; a[mt][2] = q_frag[kk][2]; a[mt][3] = q_frag[kk][3];
        } else {
          ptx::LdMatrixX4(ptx::SmemAddr(sQ + Swz<D>(warp_row0 + mt * 16 + (lane % 16), 2 * kk + lane / 16)), a[mt][0],
                     a[mt][1], a[mt][2], a[mt][3]);
        }
      }
#pragma unroll
      for (int np = 0; np < kNB / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ptx::LdMatrixX4(ptx::SmemAddr(sK + Swz<D>(np * 16 + (lane % 8) + (lane / 16) * 8, 2 * kk + (lane / 8) % 2)), b0, b1,
                   b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma16816<T>(s[mt][2 * np], a[mt], b0, b1);
          Mma16816<T>(s[mt][2 * np + 1], a[mt], b2, b3);
        }
      }
    }
    __syncthreads();  // every warp is done with sK
    if (nb + 1 < n_blocks) {
      LoadTile<D, kThreads, kBN>(sK, k + int64_t(n0 + kBN) * p.k_row_stride, p.k_row_stride, lk - n0 - kBN, tid);
      ptx::CpAsyncCommit();
    }

    // Mask the tail tile and the causal diagonal.
    const bool tail = n0 + kBN > lk;
    const bool diag = kCausal && (n0 + kBN - 1 > m0 + lk - lq);
    if (tail || diag) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < kNB; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + j * 8 + 2 * t + (e & 1);
            const int row = m0 + warp_row0 + mt * 16 + g + (e >= 2 ? 8 : 0);
            bool masked = col >= lk;
            if constexpr (kCausal) masked = masked || (col > row + lk - lq);
            if (masked) s[mt][j][e] = -INFINITY;
          }
    }

    // Online softmax (exp2 domain), two rows per thread and m-tile: g and g + 8.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int j = 0; j < kNB; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        mx = QuadMax(mx);
        const float m_use = mx == -INFINITY ? 0.0f : mx * scale_log2;
        const float alpha = exp2f(row_max[mt][r] * scale_log2 - m_use);
        row_max[mt][r] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kNB; ++j) {
          s[mt][j][2 * r] = exp2f(fmaf(s[mt][j][2 * r], scale_log2, -m_use));
          s[mt][j][2 * r + 1] = exp2f(fmaf(s[mt][j][2 * r + 1], scale_log2, -m_use));
          sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < kDB; ++j) {
          acc_o[mt][j][2 * r] *= alpha;
          acc_o[mt][j][2 * r + 1] *= alpha;
        }
      }

    if (nb + 1 < n_blocks) ptx::CpAsyncWait<1>(); else ptx::CpAsyncWait<0>();  // V[nb] has landed
    __syncthreads();

    // O += P V; each V fragment feeds kMT MMAs.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = Pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = Pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = Pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = Pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDB / 2; ++dp) {
        uint32_t b0, b1, b2, b3;
        ptx::LdMatrixX4Trans(ptx::SmemAddr(sV + Swz<D>(kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, 2 * dp + lane / 16)), b0,
                        b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma16816<T>(acc_o[mt][2 * dp], a[mt], b0, b1);
          Mma16816<T>(acc_o[mt][2 * dp + 1], a[mt], b2, b3);
        }
      }
    }
    __syncthreads();  // every warp is done with sV
  }

  // Epilogue: normalise, stage the warp's rows in its own rows of sQ, store 16-byte chunks.
  T* sO = sQ;
  __syncwarp();
  const int64_t lse_stride = p.lse_head_stride ? p.lse_head_stride : int64_t(p.cu_seqlens_q[p.batch]);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(row_sum[mt][r]);
      inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      lse[r] = sum > 0.0f ? (row_max[mt][r] * scale_log2 + log2f(sum)) * kLn2 : -INFINITY;
    }
    const int r0 = warp_row0 + mt * 16;
#pragma unroll
    for (int j = 0; j < kDB; ++j) {
      *reinterpret_cast<uint32_t*>(sO + Swz<D>(r0 + g, j) + 2 * t) =
          Pack2<T>(acc_o[mt][j][0] * inv[0], acc_o[mt][j][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sO + Swz<D>(r0 + g + 8, j) + 2 * t) =
          Pack2<T>(acc_o[mt][j][2] * inv[1], acc_o[mt][j][3] * inv[1]);
    }
    if (p.lse != nullptr && t == 0) {
      float* l = p.lse + int64_t(h) * lse_stride + q_start + m0 + r0;
      if (m0 + r0 + g < lq) l[g] = lse[0];
      if (m0 + r0 + g + 8 < lq) l[g + 8] = lse[1];
    }
  }
  __syncwarp();
  T* o = static_cast<T*>(p.o) + (int64_t(q_start) + m0) * p.o_row_stride + int64_t(h) * p.o_head_stride;
#pragma unroll
  for (int i = 0; i < 16 * kMT * Tr::kChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = warp_row0 + idx / Tr::kChunks, chunk = idx % Tr::kChunks;
    if (m0 + row < lq)
      *reinterpret_cast<uint4*>(o + row * p.o_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(sO + Swz<D>(row, chunk));
  }
}

template <typename T, int D, bool kCausal, int kBMOverride = 0, int kMTOverride = 0>
Status LaunchPrefillImpl(const VarlenAttentionParams& p, cudaStream_t stream) {
  using Tr = PrefillTraits<D, kBMOverride, kMTOverride>;
  constexpr int kSmem = Tr::kSmemElems * int(sizeof(T));
  auto kernel = PrefillKernel<T, D, kCausal, kBMOverride, kMTOverride>;
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((p.max_seqlen_q + Tr::kBM - 1) / Tr::kBM, p.num_heads_q, p.batch);
  kernel<<<grid, Tr::kThreads, kSmem, stream>>>(p);
  FQ_CUDA_RETURN_LAUNCH();
  return Status::Ok();
}

template <typename T, int D, bool kCausal>
Status LaunchPrefill(const VarlenAttentionParams& p, cudaStream_t stream) {
  return LaunchPrefillImpl<T, D, kCausal>(p, stream);
}

}  // namespace flashq::attention::detail
