// Varlen prefill attention for Hopper (sm_90a), FlashAttention-3 style: TMA producer, two
// consumer warpgroups with ping-pong and intra-warpgroup overlap.
//
// Algorithm: the consumers are wgmma_consumer.cuh's (per consumer warpgroup, iteration j issues
// S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back and computes softmax(S_j) while
// P_{j-1} V_{j-1} is in flight; the two warpgroups take turns issuing MMAs on named barriers).
// Unlike prefill_wgmma_ws.cuh, the producer does not stream cp.async: one thread issues
// cp.async.bulk.tensor (TMA) copies of 64-column SWIZZLE_128B boxes (the panel layout the wgmma
// descriptors read) through 3D tensor maps over (D, heads, rows), completing on the stage's
// mbarrier by transaction count, so the load path costs the consumers' schedulers almost no issue
// slots. A tile that would run past its sequence (the last K/V tile, a partial Q tile) is loaded
// with cp.async and zero fill instead: the maps' row extent is unknown on the host (cu_seqlens live
// on the device), so a TMA box must never cross a sequence end. Registers: producer 40, consumers 232 (setmaxnreg;
// hd128 consumers use ~200 with no spills).
// Layouts, masking and LSE: wgmma_consumer.cuh. D in {64, 128}; sm_90a only.
// Dispatched on Hopper for D = 64 and 128. Measured on H200 (bench/results/attention-nvidia-h200.md,
// commit c92bcc0, BF16, 32 heads): hd128 non-causal 528-647 TFLOP/s (1.55-1.87x SDPA flash,
// 0.92-1.07x cuDNN), causal 383-631, hd64 414 / 366 causal (0.88-0.91x cuDNN), ragged 480 / 408.
#pragma once

#include <cuda.h>

#include <string>
#include <type_traits>

#include "kernels/attention/prefill_wgmma_ws.cuh"
#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"

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
    ptx::CpAsync16(ptx::SmemAddr(smem + PanelOff<kRows>(row, chunk)), ok ? base + int64_t(row) * row_stride + chunk * 8 : base, ok);
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

// kTmaTails (bench variant): a tail tile also comes by TMA when its box stays inside the buffer
// (ends by row cu_seqlens[batch]); the rows past the sequence then hold the next sequence's values,
// which the mask turns into P = 0 (finite inputs assumed).
template <typename T, int D, bool kCausal, bool kTmaTails = false>
__global__ void __launch_bounds__(384, 1)
    PrefillTmaKernel(const VarlenAttentionParams p, const __grid_constant__ PrefillTmaMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = TmaPrefillTraits<D>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kStages = Tr::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = ptx::SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sKV = reinterpret_cast<T*>(smem + Tr::kQBytes);
  auto sK = [&](int st) { return sKV + st * 2 * (kBN * D); };
  auto sV = [&](int st) { return sKV + st * 2 * (kBN * D) + kBN * D; };
  const uint32_t bar_base = ptx::SmemAddr(smem + Tr::kBarOffset);
  using Ring = WsRing<D, kBN, kStages, /*kPingPong=*/true>;
  auto full_bar = [&](int st) { return Ring::FullBar(bar_base, st); };
  auto empty_bar = [&](int st) { return Ring::EmptyBar(bar_base, st); };
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
      ptx::MbarInit(full_bar(st), 32);                 // the producer warp's lanes
      ptx::MbarInit(empty_bar(st), Tr::kConsumers);    // every consumer thread
    }
    ptx::MbarInit(q_bar, 32);
    ptx::FenceMbarInitCluster();
  }
  __syncthreads();

  if (warp >= 8) {  // ---- producer warpgroup ----
    ptx::SetMaxNRegDec<Tr::kProducerRegs>();
    if (warp != 8) return;  // one producer warp: TMA needs one issuing thread, tails 32 lanes
    const int ptid = lane;
    // Whole tiles come by TMA (thread 0 issues, the others just arrive); a tile that runs past
    // the sequence end comes by cp.async with zero fill, so no copy ever reads past its sequence's
    // rows plus the tile (and never past the buffer: the maps' row extent is not known here).
    const bool q_tma = m0 + kBM <= lq || (kTmaTails && q_start + m0 + kBM <= p.cu_seqlens_q[p.batch]);
    const int total_k = kTmaTails ? p.cu_seqlens_k[p.batch] : 0;
    if (q_tma) {
      if (ptid == 0) {
        ptx::MbarArriveExpectTx(q_bar, Tr::kQBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn)
          ptx::TmaLoad3d(ptx::SmemAddr(sQ) + pn * kBM * 128, &maps.q, pn * 64, h, q_start + m0, q_bar);
      } else {
        ptx::MbarArrive(q_bar);
      }
    } else {
      WarpLoadTile<D, kBM>(sQ, q, p.q_row_stride, lq - m0, ptid);
      ptx::CpAsyncMbarArrive(q_bar);
    }
    for (int j = 0; j < n_blocks; ++j) {
      const int st = j % kStages, n1 = j * kBN;
      if (j >= kStages) ptx::MbarWait(empty_bar(st), ((j / kStages) - 1) & 1);
      if (n1 + kBN <= lk || (kTmaTails && k_start + n1 + kBN <= total_k)) {
        if (ptid == 0) {
          ptx::MbarArriveExpectTx(full_bar(st), 2 * Tr::kKVBytes);
#pragma unroll
          for (int pn = 0; pn < Tr::kPanels; ++pn) {
            ptx::TmaLoad3d(ptx::SmemAddr(sK(st)) + pn * kBN * 128, &maps.k, pn * 64, hk, k_start + n1, full_bar(st));
            ptx::TmaLoad3d(ptx::SmemAddr(sV(st)) + pn * kBN * 128, &maps.v, pn * 64, hk, k_start + n1, full_bar(st));
          }
        } else {
          ptx::MbarArrive(full_bar(st));
        }
      } else {
        WarpLoadTile<D, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, ptid);
        WarpLoadTile<D, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, ptid);
        ptx::CpAsyncMbarArrive(full_bar(st));
      }
    }
    ptx::CpAsyncWait<0>();
    return;
  }
  ptx::SetMaxNRegInc<Tr::kConsumerRegs>();

  // ---- consumer warpgroups ----
  Ring sync{bar_base, ptx::SmemAddr(sKV), warp / 4};
  WgmmaConsumer<T, D, kBM, kBN, kCausal> c(p.softmax_scale, lq, lk, m0, warp, lane, ptx::SmemAddr(sQ));
  ptx::MbarWait(q_bar, 0);  // also before an empty K range: the epilogue reuses the Q tile
  c.Run(n_blocks, sync);
  c.Epilogue(p, sQ, h, q_start, lane);
#else
  __trap();
#endif
}


template <typename T, int D, bool kCausal, bool kTmaTails>
Status LaunchPrefillTmaImpl(const VarlenAttentionParams& p, cudaStream_t stream) {
  using Tr = TmaPrefillTraits<D>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  PrefillTmaMaps maps;
  FQ_RETURN_IF_ERROR(EncodeRowsMap(&maps.q, p.q, kBf16, D, p.num_heads_q, p.q_row_stride, p.q_head_stride, Tr::kBM));
  FQ_RETURN_IF_ERROR(EncodeRowsMap(&maps.k, p.k, kBf16, D, p.num_heads_kv, p.k_row_stride, p.k_head_stride, Tr::kBN));
  FQ_RETURN_IF_ERROR(EncodeRowsMap(&maps.v, p.v, kBf16, D, p.num_heads_kv, p.v_row_stride, p.v_head_stride, Tr::kBN));
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
