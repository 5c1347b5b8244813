// Bench variant: paged split-KV decode for Hopper (sm_90), persistent and warp-specialised.
//
// Algorithm: the work items are the (sequence, kv head, 16-row query tile, split) tuples of
// paged_decode_kernel.cuh, and each item is computed by exactly the same arithmetic in the same
// order (4 consumer warps take 16 keys of every 64-key tile, online softmax per warp, a fixed-order
// merge of the 4 warps, fp32 partials + LSE per split for CombineKernel). What changes is how the
// bytes arrive. The grid is persistent (one CTA per SM); CTA c takes items c, c + G, ... . One
// producer warp walks those items' tiles and gathers K/V rows through the block table with
// 16-byte cp.async into a kStages-deep ring in shared memory (full barrier: one
// cp.async.mbarrier.arrive per producer lane; empty barrier: every consumer thread); the first
// tile of an item also brings its 16 packed query rows (into the item's Q buffer). The producer waits for nothing but a free
// stage, so the next item's first tiles load while the consumers merge the current one: the
// per-CTA start-up of the one-CTA-per-item kernel (block table, then first tile) is paid once per
// CTA, and no CTA-wide barrier stalls the stream.
// Layouts: shared rows are padded to D*2 + 16 bytes (ldmatrix's 8 row addresses then hit 8
// distinct 16-byte bank groups). Stage = K (64 rows), V (64 rows); Q (16 rows) has two buffers by
// item parity, freed by a q_empty barrier once the consumers hold Q in registers. The cross-warp
// merge reuses the item's last stage (4 x 16 fp32 rows of D + 8 are exactly 128 padded rows)
// before releasing it.
// Batch invariance: an item's result depends only on its own sequence (the item -> CTA map only
// decides who computes it): deterministic and independent of the batch.
// Limits: sm_90 only; D in {64, 128}.
// Bench-only (not dispatched): on H200 it did not beat the one-CTA-per-item kernel of
// paged_decode_kernel.cuh (bench/results/attention-nvidia-h200.md, the "streamed" columns; docs/perf/experiments.md
// has the versions: one bulk copy per row, one producer warp, four producer warps).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention/paged_decode_kernel.cuh"

namespace flashq::attention::detail {

constexpr int kDecodeProducerWarps = 4;  // dispatched producer width

template <int D, int kPW, int kS>
struct StreamDecodeTraits {
  static constexpr int kProducerWarps = kPW;  // each gathers kBN / kPW rows of K and V per tile
  static constexpr int kRows = 16;             // packed query rows per item
  static constexpr int kBN = 64;               // keys per tile
  static constexpr int kConsumerWarps = 4;     // 16 keys of each tile per warp
  static constexpr int kThreads = 32 * (kConsumerWarps + kPW);
  static constexpr int kRowBytes = D * 2 + 16;  // padded shared row
  static constexpr int kKBytes = kBN * kRowBytes;
  static constexpr int kStageBytes = 2 * kBN * kRowBytes;  // K, V
  static constexpr int kStages = kS;  // kS - 1 tiles in flight while one is computed
  static constexpr int kOStride = D + 8;       // fp32 merge row stride (floats)
  static constexpr int kQOffset = kStages * kStageBytes;         // 2 x (kRows, padded row): item parity
  static constexpr int kMLOffset = kQOffset + 2 * kRows * kRowBytes;  // merge m and l: (2, 4, 16) fp32
  static constexpr int kBarOffset = kMLOffset + 2 * kConsumerWarps * kRows * 4;
  static constexpr int kSmemBytes = kBarOffset + (2 * kStages + 2) * 8;  // full, empty, q_empty[2]
  static_assert(D == 64 || D == 128, "streamed decode: head dim 64 or 128");
  static_assert(kConsumerWarps * kRows * kOStride * 4 == 2 * kKBytes, "merge buffer = the stage's K and V");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

__device__ __forceinline__ void SMbarInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// Waits for the phase with the given parity; the suspend-time hint (ns) lets the thread sleep in
// hardware until the phase completes instead of spinning on the barrier word.
__device__ __forceinline__ void SMbarWait(uint32_t addr, int parity) {
  uint32_t ok = 0;
  for (uint32_t i = 0;; ++i) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 10000;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(addr), "r"(parity)
        : "memory");
    if (ok) return;
    if (i > (1u << 20)) __trap();  // ~10 s even when every poll sleeps; a protocol bug: fail loudly rather than hang the GPU
  }
}
__device__ __forceinline__ void ConsumerBarSync(int count) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(count) : "memory");
}
__device__ __forceinline__ void SMbarArrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void CpAsyncMbarArriveNoinc(uint32_t addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}

// Item geometry shared by producer and consumers (must agree exactly).
struct DecodeItem {
  int b, hk, mt, split;
  int q_start, lq, lk, rows_total, row0, kb, ke, n_tiles, n_splits;
  bool live;
};

__device__ __forceinline__ DecodeItem MakeDecodeItem(const PagedDecodeParams& p, int item, int split_tokens,
                                                     int max_splits, int m_tiles, int rows) {
  DecodeItem it;
  it.split = item % max_splits;
  int rest = item / max_splits;
  it.mt = rest % m_tiles;
  rest /= m_tiles;
  it.hk = rest % p.num_heads_kv;
  it.b = rest / p.num_heads_kv;
  const int group = p.num_heads_q / p.num_heads_kv;
  it.q_start = p.cu_seqlens_q[it.b];
  it.lq = p.cu_seqlens_q[it.b + 1] - it.q_start;
  it.lk = p.seqlens_k[it.b];
  it.rows_total = it.lq * group;
  it.row0 = it.mt * rows;
  it.n_splits = NumSplits(it.lk, split_tokens);
  it.live = it.row0 < it.rows_total && it.split < it.n_splits;
  it.kb = it.split * split_tokens;
  it.ke = min(it.lk, it.kb + split_tokens);
  if (p.causal) {
    const int last_tok = (min(it.rows_total, it.row0 + rows) - 1) / group;
    it.ke = min(it.ke, last_tok + it.lk - it.lq + 1);
  }
  it.n_tiles = it.ke > it.kb ? (it.ke - it.kb + 63) / 64 : 0;
  return it;
}

template <typename T, int D, int kPW, int kS>
__global__ void __launch_bounds__(StreamDecodeTraits<D, kPW, kS>::kThreads, 1)
    PagedDecodeStreamKernel(const PagedDecodeParams p, int split_tokens, int max_splits, int m_tiles, int n_items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Tr = StreamDecodeTraits<D, kPW, kS>;
  constexpr int kBN = Tr::kBN, kRowBytes = Tr::kRowBytes, kStages = Tr::kStages, kRows = Tr::kRows;
  constexpr int kDB = D / 8, kKD = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_base = ptx::SmemAddr(smem);
  const uint32_t bar_base = smem_base + Tr::kBarOffset;
  auto full_bar = [&](int st) { return bar_base + st * 8; };
  auto empty_bar = [&](int st) { return bar_base + (kStages + st) * 8; };
  auto stage_addr = [&](int st) { return smem_base + st * Tr::kStageBytes; };  // K rows, V rows
  auto q_addr = [&](int qb) { return smem_base + Tr::kQOffset + qb * kRows * kRowBytes; };
  auto q_empty_bar = [&](int qb) { return bar_base + (2 * kStages + qb) * 8; };
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = p.num_heads_q / p.num_heads_kv;
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      SMbarInit(full_bar(st), 32 * kPW);                      // each producer lane's cp.async arrive
      SMbarInit(empty_bar(st), 32 * Tr::kConsumerWarps);     // every consumer thread
    }
    SMbarInit(q_empty_bar(0), 32 * Tr::kConsumerWarps);
    SMbarInit(q_empty_bar(1), 32 * Tr::kConsumerWarps);
    ptx::FenceMbarInitCluster();
  }
  __syncthreads();
  // The combine kernel (programmatic dependent launch) may start its prologue now; it waits for
  // this grid's completion before reading the partials.
  ptx::LaunchDependents();

  if (warp >= Tr::kConsumerWarps) {  // ---- producer warps ----
    const char* kc = static_cast<const char*>(p.k_cache);
    const char* vc = static_cast<const char*>(p.v_cache);
    const char* qg = static_cast<const char*>(p.q);
    const int64_t blk_b = p.kv_block_stride * 2, row_b = p.kv_row_stride * 2, head_b = p.kv_head_stride * 2;
    constexpr int kChunks = D / 8;              // 16-byte chunks per row
    constexpr int kRowsPerInst = 32 / kChunks;  // rows one warp-wide cp.async covers
    constexpr int kRowsPerWarp = kBN / kPW;     // this warp's rows of each tile
    constexpr int kH = (kRowsPerWarp + 31) / 32, kRowsPerH = kRowsPerWarp < 32 ? kRowsPerWarp : 32;
    static_assert(kRowsPerH % kRowsPerInst == 0 && kRows % kRowsPerInst == 0, "producer row mapping");
    const int pw = warp - Tr::kConsumerWarps;
    const int chunk = lane % kChunks, rsub = lane / kChunks;
    int it_g = 0;    // tiles issued by this CTA (stage / phase counter, continuous across items)
    int n_live = 0;  // items with tiles so far (Q buffer parity and phase)
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
      const DecodeItem w = MakeDecodeItem(p, item, split_tokens, max_splits, m_tiles, kRows);
      if (!w.live || w.n_tiles == 0) continue;
      const int qb = n_live & 1;
      if (pw == 0 && n_live >= 2) SMbarWait(q_empty_bar(qb), ((n_live >> 1) - 1) & 1);  // consumers read Q(n - 2)
      ++n_live;
      const int32_t* table = p.block_table + int64_t(w.b) * p.max_blocks_per_seq;
      const int64_t hoff = int64_t(w.hk) * head_b;
      // Byte offset of row r of a tile (r = this warp's row lane + 32 h); -1 past the split end.
      auto lookup = [&](int tile, int h) {
        const int r = pw * kRowsPerWarp + lane + 32 * h;
        const int key = w.kb + tile * kBN + r;
        if (lane + 32 * h >= kRowsPerWarp || key >= w.ke) return int64_t(-1);
        const int page = key / p.page_size;
        return int64_t(__ldg(table + page)) * blk_b + int64_t(key - page * p.page_size) * row_b + hoff;
      };
      int64_t off[kH], nxt[kH];
#pragma unroll
      for (int h = 0; h < kH; ++h) off[h] = lookup(0, h);
      for (int tile = 0; tile < w.n_tiles; ++tile, ++it_g) {
#pragma unroll
        for (int h = 0; h < kH; ++h) nxt[h] = tile + 1 < w.n_tiles ? lookup(tile + 1, h) : int64_t(-1);
        const int st = it_g % kStages;
        if (it_g >= kStages) SMbarWait(empty_bar(st), ((it_g / kStages) - 1) & 1);
        const uint32_t sK = stage_addr(st), sV = sK + Tr::kKBytes, sQ = q_addr(qb);
        // Row offsets live in the lanes (off[h] of lane r % 32); rows past the split end are
        // zero-filled (P is exactly 0 there, and 0 * stale NaN would be NaN).
#pragma unroll
        for (int h = 0; h < kH; ++h) {
#pragma unroll 4
          for (int i = 0; i < kRowsPerH / kRowsPerInst; ++i) {
            const int r = i * kRowsPerInst + rsub;
            const int64_t o = __shfl_sync(0xffffffffu, off[h], r);
            const bool ok = o >= 0;
            const uint32_t dst = (pw * kRowsPerWarp + 32 * h + r) * kRowBytes + chunk * 16;
            ptx::CpAsync16(sK + dst, ok ? kc + o + chunk * 16 : kc, ok);
            ptx::CpAsync16(sV + dst, ok ? vc + o + chunk * 16 : vc, ok);
          }
        }
        if (tile == 0 && pw == 0) {  // the item's packed query rows: row r -> token r / group, head hk * group + r % group
#pragma unroll
          for (int i = 0; i < kRows / kRowsPerInst; ++i) {
            const int r = i * kRowsPerInst + rsub, pr = w.row0 + r;
            const bool ok = pr < w.rows_total;
            const char* src = ok ? qg + ((int64_t(w.q_start) + pr / group) * p.q_row_stride +
                                         int64_t(w.hk * group + pr % group) * p.q_head_stride) * 2 + chunk * 16
                                 : qg;
            ptx::CpAsync16(sQ + r * kRowBytes + chunk * 16, src, ok);
          }
        }
        CpAsyncMbarArriveNoinc(full_bar(st));  // fires when this lane's copies so far have landed
#pragma unroll
        for (int h = 0; h < kH; ++h) off[h] = nxt[h];
      }
    }
    ptx::CpAsyncWait<0>();
    return;
  }

  // ---- consumer warps ----
  const int g = lane / 4, t = lane % 4;
  const float scale_log2 = p.softmax_scale * kLog2e;
  float* ws_o = static_cast<float*>(p.workspace);
  float* ws_lse = ws_o + int64_t(p.total_q) * p.num_heads_q * max_splits * D;
  const int64_t lse_stride = p.lse_head_stride ? p.lse_head_stride : int64_t(p.total_q);
  int it_g = 0, n_live = 0;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    const DecodeItem w = MakeDecodeItem(p, item, split_tokens, max_splits, m_tiles, kRows);
    if (!w.live) continue;
    const bool single = w.n_splits == 1;
    if (w.n_tiles == 0) {  // no visible key in this split for these rows: l = 0
      for (int idx = tid; idx < kRows * (D / 4); idx += 32 * Tr::kConsumerWarps) {
        const int r = idx / (D / 4), c = (idx % (D / 4)) * 4, pr = w.row0 + r;
        if (pr >= w.rows_total) continue;
        const int tok = w.q_start + pr / group, h = w.hk * group + pr % group;
        if (single) {
          T* out = static_cast<T*>(p.o) + int64_t(tok) * p.o_row_stride + int64_t(h) * p.o_head_stride + c;
          *reinterpret_cast<uint2*>(out) = make_uint2(Pack2<T>(0.f, 0.f), Pack2<T>(0.f, 0.f));
          if (p.lse != nullptr && c == 0) p.lse[int64_t(h) * lse_stride + tok] = -INFINITY;
        } else {
          const int64_t slot = (int64_t(tok) * p.num_heads_q + h) * max_splits + w.split;
          *reinterpret_cast<float4*>(ws_o + slot * D + c) = make_float4(0.f, 0.f, 0.f, 0.f);
          if (c == 0) ws_lse[slot] = -INFINITY;
        }
      }
      continue;
    }

    float acc_o[kDB][4];
#pragma unroll
    for (int j = 0; j < kDB; ++j) acc_o[j][0] = acc_o[j][1] = acc_o[j][2] = acc_o[j][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    uint32_t q_frag[kKD][4];
    int limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int pr = w.row0 + g + 8 * r;
      limit[r] = p.causal ? pr / group + w.lk - w.lq : w.lk - 1;
    }
    int st = 0;
    for (int tile = 0; tile < w.n_tiles; ++tile, ++it_g) {
      st = it_g % kStages;
      SMbarWait(full_bar(st), (it_g / kStages) & 1);
      const uint32_t sK = stage_addr(st) + warp * 16 * kRowBytes;  // this warp's 16 keys
      const uint32_t sV = stage_addr(st) + Tr::kKBytes + warp * 16 * kRowBytes;
      if (tile == 0) {
        const int qb = n_live & 1;
        const uint32_t sQ = q_addr(qb);
#pragma unroll
        for (int kk = 0; kk < kKD; ++kk)
          ptx::LdMatrixX4(sQ + (lane % 16) * kRowBytes + (2 * kk + lane / 16) * 16, q_frag[kk][0], q_frag[kk][1],
                     q_frag[kk][2], q_frag[kk][3]);
        SMbarArrive(q_empty_bar(qb));  // Q is in registers: its buffer may take item n + 2's rows
        ++n_live;
      }
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < kKD; ++kk) {
        uint32_t b0, b1, b2, b3;
        ptx::LdMatrixX4(sK + ((lane % 8) + (lane / 16) * 8) * kRowBytes + (2 * kk + (lane / 8) % 2) * 16, b0, b1, b2, b3);
        Mma16816<T>(s[0], q_frag[kk], b0, b1);
        Mma16816<T>(s[1], q_frag[kk], b2, b3);
      }
      const int key0 = w.kb + tile * kBN + warp * 16;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + j * 8 + 2 * t + (e & 1);
          if (key >= w.ke || key > limit[e >> 1]) s[j][e] = -INFINITY;
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
        ptx::LdMatrixX4Trans(sV + ((lane % 8) + ((lane / 8) % 2) * 8) * kRowBytes + (2 * dp + lane / 16) * 16, b0, b1, b2, b3);
        Mma16816<T>(acc_o[2 * dp], a, b0, b1);
        Mma16816<T>(acc_o[2 * dp + 1], a, b2, b3);
      }
      if (tile + 1 < w.n_tiles) SMbarArrive(empty_bar(st));
    }
    // Merge the 4 warps in a fixed order, in the last tile's stage (K and V rows -> fp32 O,
    // Q rows -> m and l); the stage is released afterwards.
    ConsumerBarSync(32 * Tr::kConsumerWarps);  // every warp is done reading the stage
    float* sO = reinterpret_cast<float*>(smem + st * Tr::kStageBytes);                 // (4, 16, kOStride)
    float* sM = reinterpret_cast<float*>(smem + Tr::kMLOffset);                          // (4, 16)
    float* sL = sM + Tr::kConsumerWarps * kRows;                                      // (4, 16)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(row_sum[r]);
      if (t == 0) {
        sM[warp * 16 + g + 8 * r] = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
        sL[warp * 16 + g + 8 * r] = sum;
      }
    }
    float* myO = sO + warp * kRows * Tr::kOStride;
#pragma unroll
    for (int j = 0; j < kDB; ++j) {
      *reinterpret_cast<float2*>(myO + g * Tr::kOStride + j * 8 + 2 * t) = make_float2(acc_o[j][0], acc_o[j][1]);
      *reinterpret_cast<float2*>(myO + (g + 8) * Tr::kOStride + j * 8 + 2 * t) = make_float2(acc_o[j][2], acc_o[j][3]);
    }
    ConsumerBarSync(32 * Tr::kConsumerWarps);
    constexpr int kVec = 4;
    for (int idx = tid; idx < kRows * (D / kVec); idx += 32 * Tr::kConsumerWarps) {
      const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
      const int pr = w.row0 + r;
      if (pr >= w.rows_total) continue;
      float mw[Tr::kConsumerWarps], m = -INFINITY;
#pragma unroll
      for (int k = 0; k < Tr::kConsumerWarps; ++k) {
        mw[k] = sM[k * 16 + r];
        m = fmaxf(m, mw[k]);
      }
      float l = 0.0f, o[kVec] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < Tr::kConsumerWarps; ++k) {
        const float f = mw[k] == -INFINITY ? 0.0f : exp2f(mw[k] - m);
        l += f * sL[k * 16 + r];
        const float4 ow = *reinterpret_cast<const float4*>(sO + (k * kRows + r) * Tr::kOStride + c);
        o[0] += f * ow.x; o[1] += f * ow.y; o[2] += f * ow.z; o[3] += f * ow.w;
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float lse = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
      const int tok = w.q_start + pr / group, h = w.hk * group + pr % group;
      if (single) {
        T* out = static_cast<T*>(p.o) + int64_t(tok) * p.o_row_stride + int64_t(h) * p.o_head_stride + c;
        uint2 packed;
        packed.x = Pack2<T>(o[0] * inv, o[1] * inv);
        packed.y = Pack2<T>(o[2] * inv, o[3] * inv);
        *reinterpret_cast<uint2*>(out) = packed;
        if (p.lse != nullptr && c == 0) p.lse[int64_t(h) * lse_stride + tok] = lse;
      } else {
        const int64_t slot = (int64_t(tok) * p.num_heads_q + h) * max_splits + w.split;
        *reinterpret_cast<float4*>(ws_o + slot * D + c) = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
        if (c == 0) ws_lse[slot] = lse;
      }
    }
    ConsumerBarSync(32 * Tr::kConsumerWarps);  // everyone done reading sO before the stage is refilled
    SMbarArrive(empty_bar(st));
  }
#else
  __trap();  // built without sm_90: the launcher never selects this kernel there
#endif
}

template <typename T, int D, int kPW = kDecodeProducerWarps, int kS = 5>
Status LaunchPagedDecodeStream(const PagedDecodeParams& p, int split_tokens, cudaStream_t stream) {
  using Tr = StreamDecodeTraits<D, kPW, kS>;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int max_splits = NumSplits(p.max_seqlen_k, split_tokens);
  const int m_tiles = (p.max_seqlen_q * group + Tr::kRows - 1) / Tr::kRows;
  if (p.batch == 0 || max_splits == 0 || m_tiles == 0) return Status::Ok();
  if (max_splits > 40 * 1024) return InvalidArgument("run_paged_decode: too many splits (raise split_tokens)");
  const int64_t n_items64 = int64_t(p.batch) * p.num_heads_kv * m_tiles * max_splits;
  if (n_items64 > (int64_t(1) << 30)) return InvalidArgument("run_paged_decode: too many work items");
  const int n_items = int(n_items64);
  auto kernel = PagedDecodeStreamKernel<T, D, kPW, kS>;
  FQ_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  int dev = 0, sms = 0, per_sm = 0;
  FQ_CUDA_RETURN(cudaGetDevice(&dev));
  FQ_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FQ_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, Tr::kSmemBytes));
  const int grid = std::max(1, std::min(n_items, sms * std::max(per_sm, 1)));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, split_tokens, max_splits, m_tiles, n_items);
  FQ_CUDA_RETURN_LAUNCH();
  if (max_splits > 1) FQ_RETURN_IF_ERROR((LaunchCombine<T, D>(p, split_tokens, max_splits, /*pdl=*/true, stream)));
  return Status::Ok();
}

}  // namespace flashq::attention::detail
