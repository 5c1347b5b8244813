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
// Limits: D in {64, 128}; sm_90a only. No TMA,
// no warp specialisation or inter-warpgroup ping-pong: all 256 threads load, then compute.
// Bench-only since c92bcc0 (instantiated in prefill_variants.cu, timed as "plain wgmma"); the
// consumer math is kernels/attention/wgmma_consumer.cuh's, shared with the shipped
// warp-specialised kernels. Measured on H200 (bench/results/attention-nvidia-h200.md,
// BF16, 32 heads): hd128 371-437 TFLOP/s non-causal, 289-432 causal; hd64 312 / 292, against
// 414-647 for the TMA kernel in the same run.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/attention/mma_utils.cuh"
#include "kernels/attention/wgmma_consumer.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/wgmma.cuh"

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

// rows x D tile into panel-major SWIZZLE_128B shared memory (PanelOff), rows >= valid zero-filled.
template <int D, int kThreads, int kRows, typename T>
__device__ __forceinline__ void LoadPanelTile(T* smem, const T* base, int64_t row_stride, int valid, int tid) {
  CpAsyncTile<D, kThreads, kRows>(smem, base, row_stride, valid, tid, [](int r, int c) { return PanelOff<kRows>(r, c); });
}

template <typename T, int D, bool kCausal>
__global__ void __launch_bounds__(256, 1) PrefillWgmmaKernel(const VarlenAttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = WgmmaPrefillTraits<D>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kThreads = Tr::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = ptx::SmemAddr(smem_raw);
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

  int n_blocks = (lk + kBN - 1) / kBN;
  if constexpr (kCausal) {
    const int last_key = m0 + kBM - 1 + lk - lq;
    n_blocks = min(n_blocks, last_key < 0 ? 0 : last_key / kBN + 1);
  }
  const T* q = static_cast<const T*>(p.q) + (int64_t(q_start) + m0) * p.q_row_stride + int64_t(h) * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + int64_t(k_start) * p.k_row_stride + int64_t(hk) * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + int64_t(k_start) * p.v_row_stride + int64_t(hk) * p.v_head_stride;

  // Tiles: iteration j loads tile j+1 (3-stage cp.async ring, all 256 threads) after the
  // CTA barrier that makes tile j visible and frees tile j-2's stage.
  auto load_tile = [&](int j) {
    const int n1 = j * kBN, st = j % Tr::kStages;
    LoadPanelTile<D, kThreads, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, tid);
    LoadPanelTile<D, kThreads, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, tid);
  };
  struct Sync {
    decltype(load_tile)& load;
    T* sq;
    T* skv;
    const T* q;
    int64_t q_row_stride;
    int q_valid, n_blocks, tid;
    __device__ __forceinline__ void WaitTile(int j) {
      if (j == 0) {
        LoadPanelTile<D, kThreads, kBM>(sq, q, q_row_stride, q_valid, tid);
        load(0);
        ptx::CpAsyncCommit();
      }
      ptx::CpAsyncWait<0>();
      ptx::FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
      __syncthreads();
      if (j + 1 < n_blocks) {
        load(j + 1);
        ptx::CpAsyncCommit();
      }
    }
    __device__ __forceinline__ void BeginIssue() {}
    __device__ __forceinline__ void EndIssue() {}
    __device__ __forceinline__ void EndLastIssue() {}
    __device__ __forceinline__ void Release(int) {}
    __device__ __forceinline__ uint32_t KAddr(int j) { return ptx::SmemAddr(skv + (j % Tr::kStages) * 2 * (kBN * D)); }
    __device__ __forceinline__ uint32_t VAddr(int j) { return KAddr(j) + kBN * D * 2; }
  } sync{load_tile, sQ, sKV, q, p.q_row_stride, lq - m0, n_blocks, tid};

  WgmmaConsumer<T, D, kBM, kBN, kCausal> c(p.softmax_scale, lq, lk, m0, warp, lane, ptx::SmemAddr(sQ));
  c.Run(n_blocks, sync);
  c.Epilogue(p, sQ, h, q_start, lane);
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
