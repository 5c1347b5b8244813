// Varlen prefill attention for Hopper (sm_90a), warp-specialised: a producer warpgroup streams
// Q/K/V tiles with cp.async into a 3-stage shared-memory ring (mbarrier full/empty handshakes),
// two consumer warpgroups run the wgmma math of wgmma_consumer.cuh on 64 query rows each
// (setmaxnreg moves registers from the producer, 40, to the consumers, 232).
//
// Algorithm: per consumer warpgroup, iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
// back to back (wgmma, A = P from registers) and computes softmax(S_j) while P_{j-1} V_{j-1} is
// in flight. The two consumer warpgroups take turns issuing their MMAs (named barriers, the
// "ping-pong" of FlashAttention-3), so one warpgroup's softmax runs under the other's MMAs.
// Consumers never touch the load path and never wait for each other at a CTA-wide barrier.
// Layouts (64-column SWIZZLE_128B panels), masking and LSE: wgmma_consumer.cuh. D in {64, 128}; sm_90a only.
// Dispatched on Hopper only as the fallback of prefill_wgmma_tma.cuh (the driver rejects its tensor
// maps). Measured on H200 (bench/results/attention-nvidia-h200.md, BF16, 32 heads): hd128
// 418-471 TFLOP/s non-causal, 324-478 causal; hd64 360 / 329 (the TMA kernel: 414-647).
#pragma once

#include "kernels/attention/rows_tensor_map.h"
#include "kernels/attention/wgmma_consumer.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"

namespace flashq::attention::detail {

template <int D>
struct WsPrefillTraits {
  static constexpr int kBM = 128;            // 2 consumer warpgroups x 64 rows
  static constexpr int kBN = 128;            // keys per tile
  static constexpr int kConsumers = 256;
  static constexpr int kThreads = 384;       // + 1 producer warpgroup
  static constexpr int kProducerRegs = 40;   // setmaxnreg: 128 x 40 + 256 x 232 <= 64K registers
  static constexpr int kConsumerRegs = 232;
  static constexpr int kStages = 3;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKVBytes = kBN * D * 2;
  static constexpr int kBarOffset = kQBytes + kStages * 2 * kKVBytes;
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + barriers + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Producer-side tile load with few live registers (the producer runs on 40): each of the 128
// threads owns one 16-byte column chunk and walks rows with a fixed stride.
template <int D, int kRows, typename T>
__device__ __forceinline__ void ProducerLoadTile(T* smem, const T* base, int64_t row_stride, int valid, int ptid) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = 128 / kChunks;  // multiple of 8: the swizzle phase is unchanged
  static_assert(kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0, "producer tiling");
  const int chunk = ptid % kChunks, r0 = ptid / kChunks;
  const T* src = base + r0 * row_stride + chunk * 8;
  const uint32_t dst = ptx::SmemAddr(smem + PanelOff<kRows>(r0, chunk));
#pragma unroll 4
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const bool ok = r0 + i * kRowsPerPass < valid;
    ptx::CpAsync16(dst + i * kRowsPerPass * 128, ok ? src + int64_t(i) * kRowsPerPass * row_stride : base, ok);
  }
}

// The K/V ring of the warp-specialised pipelines (here and prefill_wgmma_tma.cuh): tile j sits in
// stage j % kStages ([K, V] of kBN x D each, from skv), filled by the producer and announced on the
// stage's full mbarrier, and handed back by the consumers on its empty mbarrier. It is also the
// Sync policy of WgmmaConsumer::Run for the consumers. Ping-pong: warpgroup w waits on named
// barrier 1 + w before issuing its MMAs, then releases the other one; warpgroup 0 goes first. Each
// warpgroup has n_blocks + 1 issue points.
template <int D, int kBN, int kStages, bool kPingPong>
struct WsRing {
  uint32_t bar_base, skv;
  int wg;
  static __device__ __forceinline__ uint32_t FullBar(uint32_t bars, int stage) { return bars + stage * 8; }
  static __device__ __forceinline__ uint32_t EmptyBar(uint32_t bars, int stage) { return bars + (kStages + stage) * 8; }
  __device__ __forceinline__ void WaitTile(int j) {
    if (j == 0 && wg == 1 && kPingPong) ptx::NamedBarArrive(1, 256);
    ptx::MbarWait(FullBar(bar_base, j % kStages), (j / kStages) & 1);
    ptx::FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
  }
  __device__ __forceinline__ void BeginIssue() {
    if constexpr (kPingPong) ptx::NamedBarSync(1 + wg, 256);
  }
  __device__ __forceinline__ void EndIssue() {
    if constexpr (kPingPong) ptx::NamedBarArrive(2 - wg, 256);
  }
  __device__ __forceinline__ void EndLastIssue() {
    if (wg == 0) EndIssue();  // warpgroup 1 has no issue point left to release
  }
  __device__ __forceinline__ void Release(int j) { ptx::MbarArrive(EmptyBar(bar_base, j % kStages)); }
  __device__ __forceinline__ uint32_t KAddr(int j) { return skv + (j % kStages) * 2 * (kBN * D * 2); }
  __device__ __forceinline__ uint32_t VAddr(int j) { return KAddr(j) + kBN * D * 2; }
};

template <typename T, int D, bool kCausal, bool kPingPong = true>
__global__ void __launch_bounds__(384, 1) PrefillWsKernel(const VarlenAttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = WsPrefillTraits<D>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kStages = Tr::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = ptx::SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sKV = reinterpret_cast<T*>(smem + Tr::kQBytes);
  auto sK = [&](int st) { return sKV + st * 2 * (kBN * D); };
  auto sV = [&](int st) { return sKV + st * 2 * (kBN * D) + kBN * D; };
  const uint32_t bar_base = ptx::SmemAddr(smem + Tr::kBarOffset);
  using Ring = WsRing<D, kBN, kStages, kPingPong>;
  auto full_bar = [&](int st) { return Ring::FullBar(bar_base, st); };
  auto empty_bar = [&](int st) { return Ring::EmptyBar(bar_base, st); };

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
      ptx::MbarInit(full_bar(st), 128);                // the producer warpgroup's threads
      ptx::MbarInit(empty_bar(st), Tr::kConsumers);    // every consumer thread
    }
    ptx::FenceMbarInitCluster();
  }
  __syncthreads();

  if (warp >= 8) {  // ---- producer warpgroup ----
    ptx::SetMaxNRegDec<Tr::kProducerRegs>();
    const int ptid = tid - Tr::kConsumers;
    for (int j = 0; j < n_blocks; ++j) {
      const int st = j % kStages, n1 = j * kBN;
      if (j >= kStages) ptx::MbarWait(empty_bar(st), ((j / kStages) - 1) & 1);
      if (j == 0) ProducerLoadTile<D, kBM>(sQ, q, p.q_row_stride, lq - m0, ptid);
      ProducerLoadTile<D, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, ptid);
      ProducerLoadTile<D, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, ptid);
      ptx::CpAsyncMbarArrive(full_bar(st));
    }
    ptx::CpAsyncWait<0>();
    return;
  }
  ptx::SetMaxNRegInc<Tr::kConsumerRegs>();

  // ---- consumer warpgroups ----
  Ring sync{bar_base, ptx::SmemAddr(sKV), warp / 4};
  WgmmaConsumer<T, D, kBM, kBN, kCausal> c(p.softmax_scale, lq, lk, m0, warp, lane, ptx::SmemAddr(sQ));
  c.Run(n_blocks, sync);
  c.Epilogue(p, sQ, h, q_start, lane);
#else
  __trap();
#endif
}

template <typename T, int D, bool kCausal, bool kPingPong>
Status LaunchPrefillWsImpl(const VarlenAttentionParams& p, cudaStream_t stream) {
  using Tr = WsPrefillTraits<D>;
  auto kernel = PrefillWsKernel<T, D, kCausal, kPingPong>;
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid((p.max_seqlen_q + Tr::kBM - 1) / Tr::kBM, p.num_heads_q, p.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  FQ_CUDA_RETURN_LAUNCH();
  return Status::Ok();
}

template <typename T, int D, bool kCausal>
Status LaunchPrefillWs(const VarlenAttentionParams& p, cudaStream_t stream) {
  return LaunchPrefillWsImpl<T, D, kCausal, true>(p, stream);
}

}  // namespace flashq::attention::detail
