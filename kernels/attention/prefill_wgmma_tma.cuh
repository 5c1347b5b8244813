// Varlen prefill attention for Hopper (sm_90a), FlashAttention-3 style: TMA producer, two
// consumer warpgroups with ping-pong and intra-warpgroup overlap.
//
// Algorithm: the consumer side is prefill_wgmma_ws.cuh's (per consumer warpgroup, iteration j
// issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back and computes softmax(S_j) while
// P_{j-1} V_{j-1} is in flight; the two warpgroups take turns issuing MMAs on named barriers). The
// producer warpgroup no longer streams cp.async: one thread issues cp.async.bulk.tensor (TMA)
// copies of 64-column SWIZZLE_128B boxes (the panel layout the wgmma descriptors read) through 3D
// tensor maps over (D, heads, rows), completing on the stage's mbarrier by transaction count, so
// the load path costs the consumers' schedulers almost no issue slots. A tile that would run past
// its sequence (the last K/V tile, a partial Q tile) is loaded with cp.async and zero fill
// instead: the maps' row extent is unknown on the host (cu_seqlens live on the device), so a
// TMA box must never cross a sequence end. Registers: producer 40, consumers 232 (setmaxnreg;
// 24/240 or 32/240 only added spills in ptxas).
// Layouts, masking, LSE and limits: as prefill_wgmma.cuh. D in {64, 128}; sm_90a only.
// Dispatched on Hopper for D = 64 and 128. Measured on H200 (bench/results/attention-h200-2026-11-22-r2.md,
// BF16, 32 heads): hd128 non-causal 368-433 TFLOP/s (+5-9% over prefill_wgmma.cuh in the same run;
// 1.07-1.24x SDPA flash, 0.66-0.71x cuDNN), causal 282-431, hd64 384 / 351 causal, ragged 345 / 295.
#pragma once

#include <cuda.h>

#include <string>
#include <type_traits>

#include "kernels/attention/prefill_wgmma_ws.cuh"

namespace flashq::attention::detail {

struct PrefillTmaMaps {
  CUtensorMap q, k, v;  // (D, heads, rows) boxes (64, 1, 128), SWIZZLE_128B
};

// A tile loaded by one warp with cp.async and zero fill past `valid` rows (the tails).
template <int D, int kRows, typename T>
__device__ __forceinline__ void WarpLoadTile(T* smem, const T* base, int64_t row_stride, int valid, int lane) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = 32 / kChunks;
  const int chunk = lane % kChunks, r0 = lane / kChunks;
#pragma unroll 4
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int row = r0 + i * kRowsPerPass;
    const bool ok = row < valid;
    CpAsync16(SmemAddr(smem + PanelOff<kRows>(row, chunk)), ok ? base + int64_t(row) * row_stride + chunk * 8 : base, ok);
  }
}

template <int D>
struct TmaPrefillTraits {
  static constexpr int kBM = 128;
  static constexpr int kBN = 128;
  static constexpr int kConsumers = 256;
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegs = 40;   // 128 x 40 + 256 x 232 <= 64K registers
  static constexpr int kConsumerRegs = 232;
  static constexpr int kStages = 3;          // tile j+1 loading, j in QK^T, j-1 in PV (192 KB for D = 128)
  static constexpr int kPanels = D / 64;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKVBytes = kBN * D * 2;
  static constexpr int kBarOffset = kQBytes + kStages * 2 * kKVBytes;
  static constexpr int kSmemBytes = kBarOffset + (2 * kStages + 1) * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t addr, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
}
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// kTmaTails (bench variant): a tail tile also comes by TMA when its box stays inside the buffer
// (ends by row cu_seqlens[batch]); the rows past the sequence then hold the next sequence's values,
// which the mask turns into P = 0 (finite inputs assumed).
template <typename T, int D, bool kCausal, bool kTmaTails = false>
__global__ void __launch_bounds__(384, 1)
    PrefillTmaKernel(const VarlenAttentionParams p, const __grid_constant__ PrefillTmaMaps maps) {
  constexpr bool kPingPong = true;
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = TmaPrefillTraits<D>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kStages = Tr::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kSN = kBN / 2;
  constexpr int kON = D / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sKV = reinterpret_cast<T*>(smem + Tr::kQBytes);
  auto sK = [&](int st) { return sKV + st * 2 * (kBN * D); };
  auto sV = [&](int st) { return sKV + st * 2 * (kBN * D) + kBN * D; };
  const uint32_t bar_base = SmemAddr(smem + Tr::kBarOffset);
  auto full_bar = [&](int st) { return bar_base + st * 8; };
  auto empty_bar = [&](int st) { return bar_base + (kStages + st) * 8; };
  const uint32_t q_bar = bar_base + 2 * kStages * 8;

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int q_start = p.cu_seqlens_q[b], k_start = p.cu_seqlens_k[b];
  const int lq = p.cu_seqlens_q[b + 1] - q_start, lk = p.cu_seqlens_k[b + 1] - k_start;
  const int m0 = m_block * kBM;
  if (m0 >= lq) return;
  const int hk = h / (p.num_heads_q / p.num_heads_kv);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int n_blocks = (lk + kBN - 1) / kBN;
  if constexpr (kCausal) {
    const int last_key = m0 + kBM - 1 + lk - lq;
    n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / kBN + 1);
  }
  const T* q = static_cast<const T*>(p.q) + (int64_t(q_start) + m0) * p.q_row_stride + int64_t(h) * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + int64_t(k_start) * p.k_row_stride + int64_t(hk) * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + int64_t(k_start) * p.v_row_stride + int64_t(hk) * p.v_head_stride;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(full_bar(st), 32);                 // the producer warp's lanes
      MbarInit(empty_bar(st), Tr::kConsumers);    // every consumer thread
    }
    MbarInit(q_bar, 32);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::kProducerRegs));
    if (warp != 8) return;  // one producer warp: TMA needs one issuing thread, tails 32 lanes
    const int ptid = lane;
    // Whole tiles come by TMA (thread 0 issues, the others just arrive); a tile that runs past
    // the sequence end comes by cp.async with zero fill, so no copy ever reads past its sequence's
    // rows plus the tile (and never past the buffer: the maps' row extent is not known here).
    const bool q_tma = m0 + kBM <= lq || (kTmaTails && q_start + m0 + kBM <= p.cu_seqlens_q[p.batch]);
    const int total_k = kTmaTails ? p.cu_seqlens_k[p.batch] : 0;
    if (q_tma) {
      if (ptid == 0) {
        MbarArriveExpectTx(q_bar, Tr::kQBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn)
          TmaLoad3d(SmemAddr(sQ) + pn * kBM * 128, &maps.q, pn * 64, h, q_start + m0, q_bar);
      } else {
        MbarArrive(q_bar);
      }
    } else {
      WarpLoadTile<D, kBM>(sQ, q, p.q_row_stride, lq - m0, ptid);
      CpAsyncMbarArrive(q_bar);
    }
    for (int j = 0; j < n_blocks; ++j) {
      const int st = j % kStages, n1 = j * kBN;
      if (j >= kStages) MbarWait(empty_bar(st), ((j / kStages) - 1) & 1);
      if (n1 + kBN <= lk || (kTmaTails && k_start + n1 + kBN <= total_k)) {
        if (ptid == 0) {
          MbarArriveExpectTx(full_bar(st), 2 * Tr::kKVBytes);
#pragma unroll
          for (int pn = 0; pn < Tr::kPanels; ++pn) {
            TmaLoad3d(SmemAddr(sK(st)) + pn * kBN * 128, &maps.k, pn * 64, hk, k_start + n1, full_bar(st));
            TmaLoad3d(SmemAddr(sV(st)) + pn * kBN * 128, &maps.v, pn * 64, hk, k_start + n1, full_bar(st));
          }
        } else {
          MbarArrive(full_bar(st));
        }
      } else {
        WarpLoadTile<D, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, ptid);
        WarpLoadTile<D, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, ptid);
        CpAsyncMbarArrive(full_bar(st));
      }
    }
    CpAsyncWait<0>();
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::kConsumerRegs));

  // ---- consumer warpgroups ----
  const int wg = warp / 4, wl = warp % 4;
  const int g = lane / 4, t = lane % 4;
  float o[kON];
#pragma unroll
  for (int i = 0; i < kON; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int row0 = m0 + wg * 64 + wl * 16 + g;
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
  // Ping-pong: warpgroup w waits on named barrier 1 + w before issuing its MMAs, then releases
  // the other one; warpgroup 0 goes first. Each warpgroup has n_blocks + 1 issue points.
  const int my_bar = 1 + wg, other_bar = 2 - wg;
  auto bar_sync = [&] {
    if constexpr (kPingPong) NamedBarSync(my_bar, 256);
  };
  auto bar_arrive = [&](int id) {
    if constexpr (kPingPong) NamedBarArrive(id, 256);
  };
  auto wait_full = [&](int j) {
    MbarWait(full_bar(j % kStages), (j / kStages) & 1);
    FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
  };
  MbarWait(q_bar, 0);
  if (n_blocks > 0) {
    if (wg == 1) bar_arrive(1);
    wait_full(0);
    bar_sync();
    WgmmaFence();
    issue_qk(0);
    WgmmaCommit();
    bar_arrive(other_bar);
    WgmmaWait<0>();
    fence_s();
    float alpha[2];
    softmax(0, alpha);
    rescale_and_take_p(alpha);
  }
  for (int j = 1; j < n_blocks; ++j) {
    wait_full(j);
    bar_sync();
    WgmmaFence();
    issue_qk(j % kStages);
    WgmmaCommit();
    issue_pv((j - 1) % kStages);
    WgmmaCommit();
    bar_arrive(other_bar);
    WgmmaWait<1>();
    fence_s();
    float alpha[2];
    softmax(j * kBN, alpha);
    WgmmaWait<0>();
    fence_o_a();
    rescale_and_take_p(alpha);
    MbarArrive(empty_bar((j - 1) % kStages));
  }
  if (n_blocks > 0) {
    bar_sync();
    WgmmaFence();
    issue_pv((n_blocks - 1) % kStages);
    WgmmaCommit();
    if (wg == 0) bar_arrive(other_bar);  // warpgroup 1 has no issue point left to release
    WgmmaWait<0>();
    fence_o_a();
  }

  // Epilogue: normalise; each warp stages its 16 rows in its own rows of sQ (same panel layout,
  // so the other warpgroup's Q bytes are untouched) and stores 16-byte chunks.
  float inv[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(row_sum[r]);
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    lse[r] = sum > 0.0f ? (row_max[r] * scale_log2 + log2f(sum)) * kLn2 : -INFINITY;
  }
  const int wrow0 = wg * 64 + wl * 16;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<uint32_t*>(sQ + PanelOff<kBM>(wrow0 + g, j) + 2 * t) =
        Pack2<T>(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sQ + PanelOff<kBM>(wrow0 + g + 8, j) + 2 * t) =
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
          *reinterpret_cast<const uint4*>(sQ + PanelOff<kBM>(row, chunk));
  }
#else
  __trap();
#endif
}


// Host: a 3D tensor map (Unimplemented when the driver rejects the layout: the caller falls back) (D, heads, rows) over a [rows, heads, D] tensor with the given element
// strides; boxes of 64 columns x 1 head x 128 rows, 128-byte swizzle. The row extent is set to
// 2^31 - 1: every box the kernel issues lies inside one sequence (tails use cp.async).
inline Status EncodePrefillMap(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t row_stride,
                               int64_t head_stride) {
  using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static EncodeFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<EncodeFn>(fn);
  }();
  if (encode == nullptr) return Unimplemented("cuTensorMapEncodeTiled not available");
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(0x7fffffff)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(row_stride) * 2};
  const cuuint32_t box[3] = {64, 1, 128};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return Unimplemented("cuTensorMapEncodeTiled rejected the layout: " + std::to_string(int(r)));
  return Status::Ok();
}

template <typename T, int D, bool kCausal, bool kTmaTails>
Status LaunchPrefillTmaImpl(const VarlenAttentionParams& p, cudaStream_t stream) {
  using Tr = TmaPrefillTraits<D>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  PrefillTmaMaps maps;
  FQ_RETURN_IF_ERROR(EncodePrefillMap(&maps.q, p.q, kBf16, D, p.num_heads_q, p.q_row_stride, p.q_head_stride));
  FQ_RETURN_IF_ERROR(EncodePrefillMap(&maps.k, p.k, kBf16, D, p.num_heads_kv, p.k_row_stride, p.k_head_stride));
  FQ_RETURN_IF_ERROR(EncodePrefillMap(&maps.v, p.v, kBf16, D, p.num_heads_kv, p.v_row_stride, p.v_head_stride));
  auto kernel = PrefillTmaKernel<T, D, kCausal, kTmaTails>;
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid((p.max_seqlen_q + Tr::kBM - 1) / Tr::kBM, p.num_heads_q, p.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, maps);
  FQ_CUDA_RETURN_LAUNCH();
  return Status::Ok();
}

template <typename T, int D, bool kCausal>
Status LaunchPrefillTma(const VarlenAttentionParams& p, cudaStream_t stream) {
  return LaunchPrefillTmaImpl<T, D, kCausal, false>(p, stream);
}

}  // namespace flashq::attention::detail
