// Varlen prefill attention for Hopper (sm_90a), warp-specialised: a producer warpgroup streams
// Q/K/V tiles with cp.async into a 3-stage shared-memory ring (mbarrier full/empty handshakes),
// two consumer warpgroups run the wgmma math of prefill_wgmma.cuh on 64 query rows each
// (setmaxnreg moves registers from the producer, 40, to the consumers, 232).
//
// Algorithm: per consumer warpgroup, iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
// back to back (wgmma, A = P from registers) and computes softmax(S_j) while P_{j-1} V_{j-1} is
// in flight. The two consumer warpgroups take turns issuing their MMAs (named barriers, the
// "ping-pong" of FlashAttention-3), so one warpgroup's softmax runs under the other's MMAs.
// Consumers never touch the load path and never wait for each other at a CTA-wide barrier.
// Layouts, masking, LSE and limits: as prefill_wgmma.cuh (64-column SWIZZLE_128B panels).
// A stuck mbarrier wait traps after ~2^26 polls instead of hanging.
// Dispatched on Hopper only as the fallback of prefill_wgmma_tma.cuh for D = 64.
// Measured on H200 (bench/results, 2026-11-22, BF16, 32 heads):
// hd64 365 TFLOP/s non-causal, 329 causal (1.17-1.20x SDPA flash, 0.79-0.80x cuDNN); hd128
// 330-379, slower than the plain wgmma kernel (prefill_wgmma.cuh), so not used there.
#pragma once

#include "kernels/attention/prefill_wgmma.cuh"

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

__device__ __forceinline__ void MbarInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ bool MbarTryWait(uint32_t addr, int parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(addr), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void MbarWait(uint32_t addr, int parity) {
  for (uint32_t i = 0; !MbarTryWait(addr, parity); ++i)
    if (i > (1u << 26)) __trap();  // a protocol bug: fail loudly rather than hang the GPU
}
__device__ __forceinline__ void MbarArrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void NamedBarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Producer-side tile load with few live registers (the producer runs on 40): each of the 128
// threads owns one 16-byte column chunk and walks rows with a fixed stride.
template <int D, int kRows, typename T>
__device__ __forceinline__ void ProducerLoadTile(T* smem, const T* base, int64_t row_stride, int valid, int ptid) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = 128 / kChunks;  // multiple of 8: the swizzle phase is unchanged
  static_assert(kRowsPerPass % 8 == 0 && kRows % kRowsPerPass == 0, "producer tiling");
  const int chunk = ptid % kChunks, r0 = ptid / kChunks;
  const T* src = base + r0 * row_stride + chunk * 8;
  const uint32_t dst = SmemAddr(smem + PanelOff<kRows>(r0, chunk));
#pragma unroll 4
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const bool ok = r0 + i * kRowsPerPass < valid;
    CpAsync16(dst + i * kRowsPerPass * 128, ok ? src + int64_t(i) * kRowsPerPass * row_stride : base, ok);
  }
}

template <typename T, int D, bool kCausal, bool kPingPong = true>
__global__ void __launch_bounds__(384, 1) PrefillWsKernel(const VarlenAttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = WsPrefillTraits<D>;
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
      MbarInit(full_bar(st), 128);                // the producer warpgroup's threads
      MbarInit(empty_bar(st), Tr::kConsumers);    // every consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::kProducerRegs));
    const int ptid = tid - Tr::kConsumers;
    for (int j = 0; j < n_blocks; ++j) {
      const int st = j % kStages, n1 = j * kBN;
      if (j >= kStages) MbarWait(empty_bar(st), ((j / kStages) - 1) & 1);
      if (j == 0) ProducerLoadTile<D, kBM>(sQ, q, p.q_row_stride, lq - m0, ptid);
      ProducerLoadTile<D, kBN>(sK(st), k + int64_t(n1) * p.k_row_stride, p.k_row_stride, lk - n1, ptid);
      ProducerLoadTile<D, kBN>(sV(st), v + int64_t(n1) * p.v_row_stride, p.v_row_stride, lk - n1, ptid);
      CpAsyncMbarArrive(full_bar(st));
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
