// The math of one consumer warpgroup of the Hopper prefill kernels (prefill_wgmma_tma.cuh,
// prefill_wgmma_ws.cuh, and the bench-only bench/attention/prefill_wgmma_plain.cuh): 64 query rows,
// K/V tiles of kBN keys. Masking is bottom-right causal (FlashAttention 2.1+) and for key tails; LSE
// is natural-log, fp32 [Hq, total_q] (or lse_head_stride).
//
// Algorithm (FlashAttention-3's intra-warpgroup overlap): iteration j issues S_j = Q K_j^T
// (wgmma m64 n kBN k16, A = Q and B = K from shared memory, K-major) and O += P_{j-1} V_{j-1}
// (wgmma m64 nD k16, A = P from registers: the accumulator layout is the A-fragment layout, B = V
// read MN-major) back to back, runs the masked online softmax of S_j (exp2 domain, in place)
// while P_{j-1} V_{j-1} is still on the tensor cores, then waits, rescales O and packs S_j into
// P. Only one P buffer is live: it is overwritten after the wait, so per thread S (kBN/2), O (D/2)
// and P (kBN/4) registers are live at once, 160 for D = kBN = 128.
// The kernels differ only in how tiles arrive and how the two warpgroups take turns; they
// pass those steps to Run() as a policy (WaitTile, BeginIssue, EndIssue, EndLastIssue, Release,
// K and V stage addresses).
// Registers: the warp-specialised kernels give the consumers 232 registers with setmaxnreg. ptxas
// only allocates past the launch-bound cap (168 at 384 threads) in the region after
// setmaxnreg.inc if no __trap() sits in it (an mbarrier wait with a trap after N polls kept the
// whole kernel at 168: spills and serialized wgmma, ptxas C7512); keep traps out of consumer code.
// Layouts: shared tiles are 64-column panels of 128-byte rows, SWIZZLE_128B (PanelOff). The
// epilogue stages each warp's 16 output rows in that warp's own rows of the Q tile, so it needs
// no CTA barrier.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/attention/mma_utils.cuh"
#include "kernels/common/ptx/wgmma.cuh"

namespace flashq::attention::detail {

// wgmma shared-memory descriptor, SWIZZLE_128B (byte offsets; 16-byte units in the encoding).
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

template <typename T, int D, int kBM, int kBN, bool kCausal>
struct WgmmaConsumer {
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr int kSN = kBN / 2;  // S accumulators per thread (m64 x kBN over 128 threads)
  static constexpr int kON = D / 2;    // O accumulators per thread

  float o[kON];
  float s[kSN];
  uint32_t pf[kBN / 16][4];  // P of the previous tile: A fragments of O += P V
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  const float scale_log2;
  const int lq, lk, m0;
  const int wrow0;  // this warp's first row in the tile
  const int row0;   // this thread's rows in the sequence: row0 and row0 + 8
  const int g, t;
  const uint32_t q_addr;

  __device__ __forceinline__ WgmmaConsumer(float softmax_scale, int lq_, int lk_, int m0_, int warp, int lane,
                                           uint32_t sq_addr)
      : scale_log2(softmax_scale * kLog2e), lq(lq_), lk(lk_), m0(m0_), wrow0((warp / 4) * 64 + (warp % 4) * 16),
        row0(m0_ + wrow0 + lane / 4), g(lane / 4), t(lane % 4), q_addr(sq_addr + (warp / 4) * 64 * 128) {
#pragma unroll
    for (int i = 0; i < kON; ++i) o[i] = 0.0f;
  }

  // S = Q K^T: D/16 k-steps of m64 n kBN k16 (not waited on here).
  __device__ __forceinline__ void IssueQk(uint32_t k_addr) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da = SmemDesc(q_addr + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = SmemDesc(k_addr + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
      ptx::Wgmma<kBN, kBf16>::SS(s, da, db, kk > 0 ? 1 : 0);
    }
  }
  // O += P V: kBN/16 k-steps of m64 nD k16, B = V MN-major.
  __device__ __forceinline__ void IssuePv(uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint64_t db = SmemDesc(v_addr + kk * 16 * 128, kBN * 128, 1024);
      ptx::Wgmma<D, kBf16>::RS(o, pf[kk], db, 1);
    }
  }
  // Mask and online softmax of the tile starting at key n0, exp(S) in place in s; alpha is the
  // rescale O needs once the previous P V has landed (rows g and g + 8).
  __device__ __forceinline__ void Softmax(int n0, float (&alpha)[2]) {
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
  }
  // After the previous P V has landed: O *= alpha, P = pack(exp(S)).
  __device__ __forceinline__ void RescaleAndPack(const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pf[kk][0] = Pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pf[kk][1] = Pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pf[kk][2] = Pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pf[kk][3] = Pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
  __device__ __forceinline__ void FenceS() {
#pragma unroll
    for (int i = 0; i < kSN; ++i) ptx::RegFence(s[i]);
  }
  __device__ __forceinline__ void FenceOP() {
#pragma unroll
    for (int i = 0; i < kON; ++i) ptx::RegFence(o[i]);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) ptx::RegFence(pf[kk][i]);
  }

  // The pipeline over n_blocks K/V tiles. Sync: WaitTile(j) (tile j is in shared memory),
  // BeginIssue() / EndIssue() around each warpgroup's MMA issue, EndLastIssue() after the last,
  // Release(j) (tile j's stage may be refilled), KAddr(j) / VAddr(j) (its shared addresses).
  template <typename Sync>
  __device__ __forceinline__ void Run(int n_blocks, Sync& sync) {
    if (n_blocks <= 0) return;
    float alpha[2];
    sync.WaitTile(0);
    sync.BeginIssue();
    ptx::WgmmaFence();
    IssueQk(sync.KAddr(0));
    ptx::WgmmaCommit();
    sync.EndIssue();
    ptx::WgmmaWait<0>();
    FenceS();
    Softmax(0, alpha);
    RescaleAndPack(alpha);  // o is still zero
    for (int j = 1; j < n_blocks; ++j) {
      sync.WaitTile(j);
      sync.BeginIssue();
      ptx::WgmmaFence();
      IssueQk(sync.KAddr(j));
      ptx::WgmmaCommit();
      IssuePv(sync.VAddr(j - 1));
      ptx::WgmmaCommit();
      sync.EndIssue();
      ptx::WgmmaWait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
      FenceS();
      Softmax(j * kBN, alpha);
      ptx::WgmmaWait<0>();
      FenceOP();
      RescaleAndPack(alpha);
      sync.Release(j - 1);
    }
    sync.BeginIssue();
    ptx::WgmmaFence();
    IssuePv(sync.VAddr(n_blocks - 1));
    ptx::WgmmaCommit();
    sync.EndLastIssue();
    ptx::WgmmaWait<0>();
    FenceOP();
  }

  // Normalise, write LSE, stage this warp's 16 rows in its own rows of sq (panel layout) and
  // store them as 16-byte chunks.
  __device__ __forceinline__ void Epilogue(const VarlenAttentionParams& p, T* sq, int h, int q_start, int lane) {
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(row_sum[r]);
      inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      lse[r] = sum > 0.0f ? (row_max[r] * scale_log2 + log2f(sum)) * kLn2 : -INFINITY;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(sq + PanelOff<kBM>(wrow0 + g, j) + 2 * t) =
          Pack2<T>(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sq + PanelOff<kBM>(wrow0 + g + 8, j) + 2 * t) =
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
            *reinterpret_cast<const uint4*>(sq + PanelOff<kBM>(row, chunk));
    }
  }
};

}  // namespace flashq::attention::detail
