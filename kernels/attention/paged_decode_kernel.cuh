// Paged split-KV decode attention with GQA packing, mma.sync (sm_80+), K/V tiles by TMA on sm_90.
//
// Algorithm: one CTA per (split of split_tokens keys, kv head x 16-row query tile, sequence).
// The query rows of a CTA are the (new token, query head) pairs of one kv head packed together
// (row = token * group + head_in_group), so each K/V byte of a split is read once for all
// Hq / Hkv heads. K/V tiles of 64 keys are gathered through the block table (the split's slice is
// staged in shared memory first, so issuing a tile never waits on a global load) into a
// kStages-deep ring: on sm_90, when pages tile the 64-key tiles, a whole tile is one TMA box per
// (page, 64-column panel) issued by one thread and completing on the stage's mbarrier; tail tiles,
// other page sizes and sm_80/sm_89 use cp.async (16 bytes per thread, zero fill past the end).
// Each of the 4 warps takes 16 keys of a tile (split-K inside the CTA) with its own online softmax,
// and the warps merge in a fixed order at the end. With one split the CTA writes O and LSE; with
// several it writes fp32 (O, LSE) partials that CombineKernel merges with a log-sum-exp in split
// order. Causal masking over the new tokens is bottom-right aligned (runtime flag).
// Layouts: q/o [tokens, Hq, D]; caches [num_blocks, page_size, Hkv, D] via strides; block_table
// [batch, max_blocks]; shared K/V tiles in 64-column SWIZZLE_128B panels (PanelOff, the TMA layout);
// workspace: O partials [total_q, Hq, max_splits, D] fp32 then LSE partials [total_q, Hq, max_splits].
// Limits: D in {64, 128, 256}; split_tokens a multiple of 64; any page size >= 1. Splits are a
// function of the sequence's own length only (batch invariant, deterministic); TMA and cp.async
// fill the same layout, so the path taken does not change a bit of the result. Many new tokens
// per sequence work but re-read K/V once per 16 packed rows (the prefill kernel is the fast path).
// Measured on H200 (bench/results/attention-nvidia-h200.md, commit c92bcc0; Hq 32, Hkv 8, hd128,
// BF16, split 1024): B=64 L=8k 3.98-4.06 TB/s (94-96% of the 4.24 TB/s copy ceiling; 1.52-1.56x SDPA
// flash, 0.89-0.91x cuDNN), B=32 L=4k 3.53-3.65 TB/s (0.87-0.90x cuDNN), B=1 L=32k 2.70-2.78 TB/s
// (1.01-1.04x cuDNN); the cp.async-only kernel in the same run: 3.58, 3.32, 2.68 TB/s. A persistent
// warp-specialised variant was slower (docs/perf/attention.md says why; its line in docs/perf/experiments.md).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/attention/attention.h"
#include "kernels/attention/mma_utils.cuh"
#include "kernels/attention/rows_tensor_map.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"

namespace flashq::attention::detail {

template <int D>
struct DecodeTraits {
  static constexpr int kRows = 16;    // packed query rows per CTA
  static constexpr int kBN = 64;      // keys per tile
  static constexpr int kWarps = 4;    // 16 keys of each tile per warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = D == 256 ? 2 : 3;
  static constexpr int kChunks = D / 8;
  static constexpr int kOStride = D + 8;  // fp32 merge buffer row stride (conflict-free float2 stores)
  static constexpr int kStageElems = 2 * kBN * D;  // K and V
  static constexpr int kSmemBytes = (kRows * D + kStages * kStageElems) * 2;
  static_assert(kWarps * 16 == kBN, "each warp takes 16 keys of a tile");
  static_assert(kWarps * kRows * kOStride * 4 + 2 * kWarps * kRows * 4 <= kStages * kStageElems * 2,
                "merge buffers must fit in the K/V stages");
};

__host__ __device__ inline int NumSplits(int lk, int split) { return (lk + split - 1) / split; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kDecodeTmaArch = false;  // the TMA instantiation compiles to the cp.async kernel here
#else
constexpr bool kDecodeTmaArch = true;
#endif

// K and V cache tensor maps for the TMA path: (D, Hkv, rows), rows = block * page_size + offset.
struct DecodeMaps {
  CUtensorMap k, v;
};

template <typename T, int D, bool kTma>
__global__ void __launch_bounds__(DecodeTraits<D>::kThreads)
    PagedDecodeKernel(const PagedDecodeParams p, const __grid_constant__ DecodeMaps maps, int split_tokens,
                      int max_splits, int m_tiles, int table_slots) {
  using Tr = DecodeTraits<D>;
  constexpr int kBN = Tr::kBN, kThreads = Tr::kThreads, kStages = Tr::kStages, kChunks = Tr::kChunks;
  constexpr int kDB = D / 8, kKD = D / 16;
  constexpr bool kUseTma = kTma && kDecodeTmaArch;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (ptx::SmemAddr(smem_raw) & 1023)) & 1023);  // TMA swizzle atoms
  T* sQ = reinterpret_cast<T*>(smem);  // (16, D), Swz
  T* sKV = sQ + Tr::kRows * D;         // kStages x [(kBN, D) K, (kBN, D) V], PanelOff<kBN>
  uint64_t* sBar = reinterpret_cast<uint64_t*>(sKV + kStages * Tr::kStageElems);  // (kStages,) TMA path
  int32_t* sTable = reinterpret_cast<int32_t*>(sBar + kStages);                   // (table_slots,)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // With a programmatic dependent launch of the combine kernel, its CTAs may be scheduled once
  // every CTA here has started (they fill the last wave's idle slots and wait for this grid).
  ptx::LaunchDependents();
#endif
  const int b = blockIdx.z, split = blockIdx.x;
  const int hk = blockIdx.y / m_tiles, mt = blockIdx.y % m_tiles;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int q_start = p.cu_seqlens_q[b];
  const int lq = p.cu_seqlens_q[b + 1] - q_start, lk = p.seqlens_k[b];
  const int rows_total = lq * group, row0 = mt * Tr::kRows;
  if (row0 >= rows_total) return;
  const int n_splits = NumSplits(lk, split_tokens);
  if (split >= n_splits) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  const int kb = split * split_tokens;
  int ke = min(lk, kb + split_tokens);
  if (p.causal) {  // the tile's last packed row belongs to its latest token
    const int last_tok = (min(rows_total, row0 + Tr::kRows) - 1) / group;
    ke = min(ke, last_tok + lk - lq + 1);
  }
  const int n_tiles = ke > kb ? (ke - kb + kBN - 1) / kBN : 0;

  // Q tile: packed row r -> token r / group, head hk * group + r % group.
  const T* q = static_cast<const T*>(p.q);
#pragma unroll
  for (int i = 0; i < Tr::kRows * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kChunks, chunk = idx % kChunks;
    const int pr = row0 + r;
    const bool ok = pr < rows_total;
    const T* src = ok ? q + (int64_t(q_start) + pr / group) * p.q_row_stride +
                            int64_t(hk * group + pr % group) * p.q_head_stride + chunk * 8
                      : q;
    ptx::CpAsync16(ptx::SmemAddr(sQ + Swz<D>(r, chunk)), src, ok);
  }

  // This split's slice of the block table, staged once in shared memory so that issuing a tile's
  // copies never waits on a global load.
  const int32_t* table = p.block_table + int64_t(b) * p.max_blocks_per_seq;
  const int first_page = kb / p.page_size;
  const int n_pages = ke > kb ? (ke - 1) / p.page_size - first_page + 1 : 0;
  for (int i = tid; i < n_pages && i < table_slots; i += kThreads) sTable[i] = table[first_page + i];
  auto full_bar = [&](int stage) { return ptx::SmemAddr(sBar + stage); };
  if constexpr (kUseTma) {
    if (tid == 0) {
      for (int st = 0; st < kStages; ++st) ptx::MbarInit(full_bar(st), kThreads);
      ptx::FenceMbarInitCluster();
    }
  }
  __syncthreads();
  const T* kc = static_cast<const T*>(p.k_cache) + int64_t(hk) * p.kv_head_stride;
  const T* vc = static_cast<const T*>(p.v_cache) + int64_t(hk) * p.kv_head_stride;
  // A whole tile on the TMA path: one box of min(page_size, kBN) rows per page and 64-column panel
  // (issued by thread 0; the launcher checks that pages tile the 64-key tiles), completing on the
  // stage's mbarrier; every other thread just arrives.
  auto tma_tile = [&](int tile, int stage) {
    const uint32_t bar = full_bar(stage);
    if (tid != 0) {
      ptx::MbarArrive(bar);
      return;
    }
    const uint32_t sk = ptx::SmemAddr(sKV + stage * Tr::kStageElems), sv = sk + kBN * D * 2;
    ptx::MbarArriveExpectTx(bar, 2 * kBN * D * 2);
    const int rows = min(p.page_size, kBN);
    for (int r0 = 0; r0 < kBN; r0 += rows) {
      const int key = kb + tile * kBN + r0;
      const int page = key / p.page_size;
      const int row = sTable[page - first_page] * p.page_size + (key - page * p.page_size);
#pragma unroll
      for (int pn = 0; pn < D / 64; ++pn) {
        ptx::TmaLoad3d(sk + pn * kBN * 128 + r0 * 128, &maps.k, pn * 64, hk, row, bar);
        ptx::TmaLoad3d(sv + pn * kBN * 128 + r0 * 128, &maps.v, pn * 64, hk, row, bar);
      }
    }
  };
  auto load_tile = [&](int tile, int stage) {
    if constexpr (kUseTma) {
      if (kb + (tile + 1) * kBN <= ke) return tma_tile(tile, stage);
    }
    T* sK = sKV + stage * Tr::kStageElems;
    T* sV = sK + kBN * D;
    constexpr int kPer = kBN * kChunks / kThreads;
    static_assert(kThreads % kChunks == 0 || kChunks % kThreads == 0, "chunk mapping");
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = tid + i * kThreads;
      const int r = idx / kChunks, chunk = idx % kChunks;
      const int key = kb + tile * kBN + r;
      const bool ok = key < ke;
      int64_t off = 0;
      if (ok) {
        const int page = key / p.page_size;
        off = int64_t(sTable[page - first_page]) * p.kv_block_stride + int64_t(key - page * p.page_size) * p.kv_row_stride;
      }
      ptx::CpAsync16(ptx::SmemAddr(sK + PanelOff<kBN>(r, chunk)), ok ? kc + off + chunk * 8 : kc, ok);
      ptx::CpAsync16(ptx::SmemAddr(sV + PanelOff<kBN>(r, chunk)), ok ? vc + off + chunk * 8 : vc, ok);
    }
    if constexpr (kUseTma) ptx::CpAsyncMbarArrive(full_bar(stage));  // a tail tile: zero fill past ke
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    ptx::CpAsyncCommit();  // group s (the first one also holds Q)
  }

  float acc_o[kDB][4];
#pragma unroll
  for (int j = 0; j < kDB; ++j) acc_o[j][0] = acc_o[j][1] = acc_o[j][2] = acc_o[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.softmax_scale * kLog2e;
  uint32_t q_frag[kKD][4];
  // Causal limits of this thread's two rows (token index + lk - lq).
  int limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = row0 + g + 8 * r;
    limit[r] = p.causal ? pr / group + lk - lq : lk - 1;
  }

  for (int it = 0; it < n_tiles; ++it) {
    if constexpr (kUseTma) {
      if (it == 0) ptx::CpAsyncWait<0>();  // Q (and a tail tile issued in the prologue)
      ptx::MbarWait(full_bar(it % kStages), (it / kStages) & 1);
    } else {
      ptx::CpAsyncWait<kStages - 2>();
    }
    __syncthreads();  // tile it is visible; every warp is done with tile it - 1, whose stage is refilled below
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < kKD; ++kk)
        ptx::LdMatrixX4(ptx::SmemAddr(sQ + Swz<D>(lane % 16, 2 * kk + lane / 16)), q_frag[kk][0], q_frag[kk][1],
                   q_frag[kk][2], q_frag[kk][3]);
    }
    if (it + kStages - 1 < n_tiles) load_tile(it + kStages - 1, (it + kStages - 1) % kStages);
    ptx::CpAsyncCommit();

    const T* sK = sKV + (it % kStages) * Tr::kStageElems;  // this warp takes keys 16 warp .. 16 warp + 15
    const T* sV = sK + kBN * D;
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      uint32_t b0, b1, b2, b3;
      ptx::LdMatrixX4(ptx::SmemAddr(sK + PanelOff<kBN>(warp * 16 + (lane % 8) + (lane / 16) * 8, 2 * kk + (lane / 8) % 2)), b0,
                 b1, b2, b3);
      Mma16816<T>(s[0], q_frag[kk], b0, b1);
      Mma16816<T>(s[1], q_frag[kk], b2, b3);
    }
    const int key0 = kb + it * kBN + warp * 16;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + j * 8 + 2 * t + (e & 1);
        if (key >= ke || key > limit[e >> 1]) s[j][e] = -INFINITY;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(row_max[r], fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1])));
      mx = QuadMax(mx);
      const float m_use = mx == -INFINITY ? 0.0f : mx * scale_log2;
      const float alpha = exp2f(row_max[r] * scale_log2 - m_use);
      row_max[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[j][2 * r] = exp2f(fmaf(s[j][2 * r], scale_log2, -m_use));
        s[j][2 * r + 1] = exp2f(fmaf(s[j][2 * r + 1], scale_log2, -m_use));
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kDB; ++j) {
        acc_o[j][2 * r] *= alpha;
        acc_o[j][2 * r + 1] *= alpha;
      }
    }
    uint32_t a[4];
    a[0] = Pack2<T>(s[0][0], s[0][1]);
    a[1] = Pack2<T>(s[0][2], s[0][3]);
    a[2] = Pack2<T>(s[1][0], s[1][1]);
    a[3] = Pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < kDB / 2; ++dp) {
      uint32_t b0, b1, b2, b3;
      ptx::LdMatrixX4Trans(ptx::SmemAddr(sV + PanelOff<kBN>(warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8, 2 * dp + lane / 16)),
                      b0, b1, b2, b3);
      Mma16816<T>(acc_o[2 * dp], a, b0, b1);
      Mma16816<T>(acc_o[2 * dp + 1], a, b2, b3);
    }
  }
  ptx::CpAsyncWait<0>();
  __syncthreads();  // all warps done with the stages: reuse them for the merge

  // Merge the 4 warps (fixed order). Per warp: m (scaled, log2 domain), l, unnormalised O.
  float* sO = reinterpret_cast<float*>(sKV);                      // (kWarps, 16, kOStride)
  float* sM = sO + Tr::kWarps * Tr::kRows * Tr::kOStride;          // (kWarps, 16)
  float* sL = sM + Tr::kWarps * Tr::kRows;                          // (kWarps, 16)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(row_sum[r]);
    if (t == 0) {
      sM[warp * 16 + g + 8 * r] = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
      sL[warp * 16 + g + 8 * r] = sum;
    }
  }
  float* myO = sO + warp * Tr::kRows * Tr::kOStride;
#pragma unroll
  for (int j = 0; j < kDB; ++j) {
    *reinterpret_cast<float2*>(myO + g * Tr::kOStride + j * 8 + 2 * t) = make_float2(acc_o[j][0], acc_o[j][1]);
    *reinterpret_cast<float2*>(myO + (g + 8) * Tr::kOStride + j * 8 + 2 * t) = make_float2(acc_o[j][2], acc_o[j][3]);
  }
  __syncthreads();

  const bool single = n_splits == 1;
  float* ws_o = static_cast<float*>(p.workspace);
  float* ws_lse = ws_o + int64_t(p.total_q) * p.num_heads_q * max_splits * D;
  const int64_t lse_stride = p.lse_head_stride ? p.lse_head_stride : int64_t(p.total_q);
  constexpr int kVec = 4;
  for (int idx = tid; idx < Tr::kRows * (D / kVec); idx += kThreads) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    const int pr = row0 + r;
    if (pr >= rows_total) continue;
    float mw[Tr::kWarps], m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      mw[w] = sM[w * 16 + r];
      m = fmaxf(m, mw[w]);
    }
    float l = 0.0f, o[kVec] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float f = mw[w] == -INFINITY ? 0.0f : exp2f(mw[w] - m);
      l += f * sL[w * 16 + r];
      const float4 ow = *reinterpret_cast<const float4*>(sO + (w * Tr::kRows + r) * Tr::kOStride + c);
      o[0] += f * ow.x; o[1] += f * ow.y; o[2] += f * ow.z; o[3] += f * ow.w;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float lse = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    const int tok = q_start + pr / group, h = hk * group + pr % group;
    if (single) {
      T* out = static_cast<T*>(p.o) + int64_t(tok) * p.o_row_stride + int64_t(h) * p.o_head_stride + c;
      uint2 packed;
      packed.x = Pack2<T>(o[0] * inv, o[1] * inv);
      packed.y = Pack2<T>(o[2] * inv, o[3] * inv);
      *reinterpret_cast<uint2*>(out) = packed;
      if (p.lse != nullptr && c == 0) p.lse[int64_t(h) * lse_stride + tok] = lse;
    } else {
      const int64_t slot = (int64_t(tok) * p.num_heads_q + h) * max_splits + split;
      *reinterpret_cast<float4*>(ws_o + slot * D + c) = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
      if (c == 0) ws_lse[slot] = lse;
    }
  }
}

// Merge split partials: one CTA of 128 threads per (sequence, query head), looping over the new
// tokens. LSE max and weights are computed across threads, then thread (group sg, column c)
// accumulates splits sg, sg + G, ... for 4 columns, and the G groups are summed in a fixed order
// (deterministic, independent of the batch).
template <typename T, int D>
__global__ void __launch_bounds__(128) CombineKernel(const PagedDecodeParams p, int split_tokens, int max_splits) {
  constexpr int kThreads = 128, kCols = D / 4, kGroups = kThreads / kCols;
  static_assert(kThreads % kCols == 0, "column groups");
  extern __shared__ float sW[];  // (max_splits,) weights
  __shared__ float4 sPart[kThreads];
  __shared__ float sRed[kThreads / 32];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::GridDependencyWait();  // no-op unless launched as a dependent
#endif
  const int b = blockIdx.x, h = blockIdx.y;
  const int q_start = p.cu_seqlens_q[b];
  const int lq = p.cu_seqlens_q[b + 1] - q_start, lk = p.seqlens_k[b];
  const int n = NumSplits(lk, split_tokens);
  if (n <= 1) return;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* ws_o = static_cast<const float*>(p.workspace);
  const float* ws_lse = ws_o + int64_t(p.total_q) * p.num_heads_q * max_splits * D;
  const int64_t lse_stride = p.lse_head_stride ? p.lse_head_stride : int64_t(p.total_q);
  const int sg = tid / kCols, c = (tid % kCols) * 4;
  for (int i = 0; i < lq; ++i) {
    const int tok = q_start + i;
    const int64_t slot0 = (int64_t(tok) * p.num_heads_q + h) * max_splits;
    float m = -INFINITY;
    for (int s = tid; s < n; s += kThreads) m = fmaxf(m, ws_lse[slot0 + s]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) sRed[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(sRed[0], sRed[1]), fmaxf(sRed[2], sRed[3]));
    __syncthreads();
    float l = 0.0f;
    for (int s = tid; s < n; s += kThreads) {
      const float ls = ws_lse[slot0 + s];
      const float w = ls == -INFINITY ? 0.0f : __expf(ls - m);
      sW[s] = w;
      l += w;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) sRed[warp] = l;
    __syncthreads();
    l = (sRed[0] + sRed[1]) + (sRed[2] + sRed[3]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* src = ws_o + slot0 * D + c;
#pragma unroll 4
    for (int s = sg; s < n; s += kGroups) {
      const float w = sW[s];
      const float4 v = *reinterpret_cast<const float4*>(src + int64_t(s) * D);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    sPart[tid] = acc;
    __syncthreads();
    if (sg == 0) {
      float4 tot = sPart[tid];
#pragma unroll
      for (int g2 = 1; g2 < kGroups; ++g2) {
        const float4 v = sPart[g2 * kCols + tid];
        tot.x += v.x; tot.y += v.y; tot.z += v.z; tot.w += v.w;
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      T* out = static_cast<T*>(p.o) + int64_t(tok) * p.o_row_stride + int64_t(h) * p.o_head_stride + c;
      uint2 packed;
      packed.x = Pack2<T>(tot.x * inv, tot.y * inv);
      packed.y = Pack2<T>(tot.z * inv, tot.w * inv);
      *reinterpret_cast<uint2*>(out) = packed;
      if (p.lse != nullptr && tid == 0) p.lse[int64_t(h) * lse_stride + tok] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
    __syncthreads();  // sW, sPart and sRed are reused by the next token
  }
}

// Raises `kernel`'s dynamic shared-memory limit to the most it can have on the current device (the opt-in maximum
// less its static shared memory), and returns that limit. The value is the same on every call: a per-launch value
// (the decode kernel's varies with page_size, the combine's with the context length) raced with launches from other
// threads, which then failed with cudaErrorInvalidValue. It is set once per kernel and device (the attribute stays
// with the function), so that a launch pays no runtime queries.
inline Status RaiseSmemLimit(const void* kernel, int* limit) {
  int dev = 0;
  FQ_CUDA_RETURN(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> limits;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = limits.find({kernel, dev}); it != limits.end()) {
    *limit = it->second;
    return Status::Ok();
  }
  int optin = 0;
  FQ_CUDA_RETURN(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr;
  FQ_CUDA_RETURN(cudaFuncGetAttributes(&attr, kernel));
  *limit = optin - int(attr.sharedSizeBytes);
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *limit));
  limits[{kernel, dev}] = *limit;
  return Status::Ok();
}

// Launches CombineKernel; with pdl, as a programmatic dependent launch (sm_90: it is scheduled
// while the decode grid runs and waits for it in griddepcontrol.wait).
template <typename T, int D>
Status LaunchCombine(const PagedDecodeParams& p, int split_tokens, int max_splits, bool pdl, cudaStream_t stream) {
  const int combine_smem = max_splits * 4;
  auto combine = CombineKernel<T, D>;
  int smem_limit = 0;
  FQ_RETURN_IF_ERROR(RaiseSmemLimit(reinterpret_cast<const void*>(combine), &smem_limit));
  if (combine_smem > smem_limit) return InvalidArgument("RunPagedDecode: too many splits (raise split_tokens)");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.batch, p.num_heads_q);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = size_t(combine_smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  FQ_CUDA_RETURN(cudaLaunchKernelEx(&cfg, combine, p, split_tokens, max_splits));
  return Status::Ok();
}

// One CTA per (split, kv head x query tile, sequence), then the combine kernel. With tma (sm_90),
// whole K/V tiles come by TMA when the pages tile the 64-key tiles (page_size a multiple of 64, or
// 8, 16 or 32) and a block's rows are contiguous (kv_block_stride = page_size x kv_row_stride);
// otherwise, and for tail tiles, by cp.async.
template <typename T, int D>
Status LaunchPagedDecodeSplit(const PagedDecodeParams& p, int split_tokens, cudaStream_t stream, bool pdl = false,
                              bool tma = false) {
  using Tr = DecodeTraits<D>;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int max_splits = NumSplits(p.max_seqlen_k, split_tokens);
  const int m_tiles = (p.max_seqlen_q * group + Tr::kRows - 1) / Tr::kRows;
  if (p.batch == 0 || max_splits == 0 || m_tiles == 0) return Status::Ok();
  // Pages one split can touch: split_tokens / page_size + 1 (a split may start mid-page).
  const int table_slots = split_tokens / p.page_size + 2;
  const int smem = Tr::kSmemBytes + Tr::kStages * 8 + table_slots * 4 + 1024;  // + barriers, alignment slack

  const int ps = p.page_size;
  DecodeMaps maps{};
  tma = tma && (ps % 64 == 0 || ps == 8 || ps == 16 || ps == 32) && p.kv_block_stride == int64_t(ps) * p.kv_row_stride;
  if (tma) {
    constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
    const int rows = ps < Tr::kBN ? ps : Tr::kBN;
    tma = EncodeRowsMap(&maps.k, p.k_cache, kBf16, D, p.num_heads_kv, p.kv_row_stride, p.kv_head_stride, rows).ok() &&
          EncodeRowsMap(&maps.v, p.v_cache, kBf16, D, p.num_heads_kv, p.kv_row_stride, p.kv_head_stride, rows).ok();
  }
  auto kernel = tma ? PagedDecodeKernel<T, D, true> : PagedDecodeKernel<T, D, false>;
  int smem_limit = 0;
  FQ_RETURN_IF_ERROR(RaiseSmemLimit(reinterpret_cast<const void*>(kernel), &smem_limit));
  if (smem > smem_limit) return InvalidArgument("RunPagedDecode: page_size too small for split_tokens");
  const dim3 grid(max_splits, p.num_heads_kv * m_tiles, p.batch);
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p, maps, split_tokens, max_splits, m_tiles, table_slots);
  FQ_CUDA_RETURN_LAUNCH();
  if (max_splits > 1) {
    FQ_RETURN_IF_ERROR((LaunchCombine<T, D>(p, split_tokens, max_splits, pdl, stream)));
  }
  return Status::Ok();
}

// On sm_90 the combine kernel is a programmatic dependent launch (-0.4% to +0.7% at B >= 32, +2-3%
// at B=1 L=32k on an H200, over a plain launch; its CTAs fill the decode grid's last wave and wait for it).
template <typename T, int D>
Status LaunchPagedDecode(const PagedDecodeParams& p, int split_tokens, cudaStream_t stream) {
  int dev = 0, major = 0;
  FQ_CUDA_RETURN(cudaGetDevice(&dev));
  FQ_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return LaunchPagedDecodeSplit<T, D>(p, split_tokens, stream, /*pdl=*/major >= 9, /*tma=*/major >= 9);
}

}  // namespace flashq::attention::detail
