// W4A16 for M > 16 on sm_90a (EXPERIMENT, off by default; bench/results/gemm-nvidia-h200-2026-11-25-wgmma-tma.md):
// QLinearKernel's arithmetic (plan warp ranges, k32 steps, g128 flush units, fixed-order split sums) with the k16
// chunks on wgmma m64n64k16 instead of mma.sync m16n8k16.
//
// Bits: wgmma with A from registers in the m16n8k16 A-fragment layout gives the very bits of chained mma.sync over
// the same k16 chunks, in any k order inside a chunk (bench/results/gemm-probe-h200-2026-11-24.md). So each warp builds
// StepMma's A fragments (DequantPair of the same packed words and zero points) for its 16-column half u of a strip, a
// flush unit (one 4-step stage) starts from zero (scale-d = 0) and is folded into the fp32 sum with Flush's fma, the
// split's two warp ranges are added as w0 + w1, and the splits in order 0..S-1: row i of Y is bitwise the small-M
// kernel's (30 / 30 GPU tests with it on).
//
// Block: 4 warpgroups, warpgroup h = strips 2h, 2h+1 of the block's 8 (256 columns; warp w of the group: rows 16w..
// of the m64 wgmma = strip 2h + w / 2, half w % 2), one 64-token tile (the wgmma N) and one split, whose two warp
// ranges the block walks in turn (the first range's sums park in shared memory). Per 4-step stage thread 0 issues
// two TMA boxes (X [64 rows][128 channels] as in memory; the 8 strips' weights, 2 KB each) and a bulk copy of the
// scale blocks where a group starts, into a 3-slot ring with full / empty mbarriers. X is then permuted by all
// threads (a 4 x 4 word transpose among 4 lanes) into one of 3 buffers of two 128B-swizzled 64-channel panels, so
// that k16 chunk ks of a step holds channels 8t + 4ks + {0..3} where the A fragment of thread t expects them (the
// packed weights' k order, see qlinear_kernel.cuh). No block barrier in the loop: a warpgroup waits for the permuted
// X of its stage (every warp's part), and after its first wgmmas permutes its part of the next stage. It waits for
// its wgmmas at the end of each stage before it folds them: ptxas serializes every wgmma (C7514) if an accumulator
// is read while another chain is open. Split sums: the S split blocks of a tile form a cluster and each sums every
// S-th float4 of the tile over ranks 0..S-1 through distributed shared memory.
// Measured (H200, M = 64): 1.1-2.7x slower than QLinearKernel. Per stage ~2.5 µs against ~0.7 µs of tensor work: the
// permute alone ~0.8 µs on each warpgroup's chain, the chains ~1 µs; clusters of 4 and 8 full-SM blocks do not fit
// one wave (15 clusters of 8 at most). FLASHQ_WG_TIMELINE prints per-warp phase times of one stage;
// FLASHQ_WG_NO_PERMUTE skips the permute (timing only, wrong results).
// Limits: sm_90a, int4 with groups of a multiple of 4 k32 steps (kStageFlush), M per launch <= kMaxRowsPerLaunch.
#pragma once

#include <cuda.h>

#include "kernels/gemm/qlinear_kernel.cuh"

namespace flashq::gemm::detail {

struct WgCfg {
  static constexpr int kThreads = 512;                                // 4 warpgroups of 64 columns (2 strips)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kStrips = 8;
  static constexpr int kCols = kStrips * kWarpN;
  static constexpr int kRows = 64;                                   // token tile = wgmma N
  static constexpr int kXRowBytes = kSubSteps * kStepK * 2;          // a stage of one X row as it is in memory
  static constexpr int kXBytes = kRows * kXRowBytes;                 // natural X of a stage [row][256 B]
  static constexpr int kWBytes = kStrips * kSubSteps * 32 * 16;      // [strip][step][lane] 16 B
  static constexpr int kSzBytes = kStrips * kSzBlockBytes;           // one group's scale blocks
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSzBytes + 127) / 128 * 128;
  static constexpr int kStages = 3;                                  // copy ring
  static constexpr int kPerms = 3;                                   // permuted X buffers (see the pipeline)
  static constexpr int kPermBytes = kXBytes;                         // two 128B-swizzled panels
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kParkBytes = kThreads * 32 * 4;               // the first range's 32 sums per thread
  static constexpr int kPermOffset = 0;                              // 1024-aligned
  static constexpr int kRingOffset = kPerms * kPermBytes;
  static constexpr int kParkOffset = kRingOffset + kRingBytes;
  static constexpr int kBarOffset = kParkOffset + kParkBytes;        // full[kStages], empty[kStages], permuted[kPerms]
  static constexpr int kTileLd = kCols + 4;                          // fp32 split tile row stride (banks)
  static constexpr int kSmemBytes = kBarOffset + (2 * kStages + kPerms) * 8;  // the dynamic shared memory starts 1024-aligned
  static constexpr int kPasses = kRows * kSubSteps * 4 / kThreads;   // X chunks per thread in the permute pass
  static_assert(kRows * kTileLd * 4 <= kParkOffset, "the split tile reuses the buffers");
  static_assert(kSmemBytes + 1024 <= 228 * 1024, "shared memory");
};

// wgmma m64n64k16, A from registers, B K-major from shared memory (tnsp-b = 0), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void WgmmaRsK(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FQ_WGMMA_RS(TY)                                                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                             \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                   \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
               "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),             \
                 "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),             \
                 "+f"(d[30]), "+f"(d[31])                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<T, __half>) FQ_WGMMA_RS("f16");
  else FQ_WGMMA_RS("bf16");
#undef FQ_WGMMA_RS
#endif
}
__device__ __forceinline__ void WgFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// A register may change here: keeps the compiler from moving accesses across an asynchronous wgmma.
__device__ __forceinline__ void KeepReg(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
__device__ __forceinline__ void KeepReg(float& x) { asm volatile("" : "+f"(x)::"memory"); }
// Shared-memory matrix descriptor, 128B swizzle (SBO = 8 rows of 128 B).
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// mbarrier and bulk copies (async proxy: the wgmma reads need no proxy fence after them).
__device__ __forceinline__ void WgMbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void WgMbarExpect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void WgMbarWait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void WgMbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `bytes` (a multiple of 16) from global to shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void BulkCopy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// A 2D tensor-map box at (c0, c1) into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void FenceProxyAsyncShared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// xmap: X [M][K] in boxes of 128 channels x 64 rows; wmap: the packed weights [strips][nk32 x 512 B] in boxes of the
// block's strips x 2 KB (4 k32 steps). Both zero-fill outside the tensor.
template <typename T>
__global__ void __launch_bounds__(WgCfg::kThreads, 1)
    QLinearWgmmaKernel(const QLinearParams p, const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgCfg;
  constexpr int S = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw;  // 1024-aligned: no static shared memory (checked below)
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t ring = sbase + C::kRingOffset, bar0 = sbase + C::kBarOffset;
  auto full_bar = [&](int slot) { return bar0 + 8 * slot; };
  auto empty_bar = [&](int slot) { return bar0 + 8 * (S + slot); };
  auto perm_bar = [&](int buf) { return bar0 + 8 * (2 * S + buf); };
  float* park = reinterpret_cast<float*>(smem + C::kParkOffset);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mtile = blockIdx.x, split = blockIdx.y, cblock = blockIdx.z;
  const int m0 = mtile * C::kRows, strip0 = cblock * C::kStrips;
  const int spw = p.steps_per_warp, nst = spw / kSubSteps, ntot = kWarpsK * nst;
  const int jb = split * kWarpsK * spw;  // the split's first k32 step; range r starts at jb + r * spw
  const int nvalid0 = min(spw, p.nk32 - jb), nvalid1 = min(spw, p.nk32 - jb - spw);  // real steps per range (may be <= 0)

  // Where a stage is, kept incrementally (no divisions in the loop): range r, stage i inside it, first k32 step j,
  // group g of step j and j's position in it.
  struct Cursor {
    int r, i, j, g, gpos;
  };
  auto range_start = [&](Cursor& c, int r) {
    c.r = r;
    c.i = 0;
    c.j = jb + r * spw;
    c.g = c.j / p.gsteps;
    c.gpos = c.j - c.g * p.gsteps;
  };
  auto advance = [&](Cursor& c) {
    if (++c.i == nst) return range_start(c, c.r + 1);
    c.j += kSubSteps;
    c.gpos += kSubSteps;
    if (c.gpos == p.gsteps) {
      c.gpos = 0;
      ++c.g;
    }
  };
  // Steps of the stage that hold weights (0..4), and whether it loads a group's scale blocks: where a real step
  // starts a group and at each range's first step (QLinearKernel's rule).
  auto real_steps = [&](const Cursor& c) { return max(0, min(kSubSteps, (c.r ? nvalid1 : nvalid0) - c.i * kSubSteps)); };
  auto group_start = [&](const Cursor& c) { return real_steps(c) > 0 && (c.i == 0 || c.gpos == 0); };

  // ---- copies: thread 0 issues a stage's weights (one box), scale blocks (one bulk copy, where a group starts) and X
  // (one box), completing on the slot's mbarrier ----
  const int nstrips = min(C::kStrips, p.strips - strip0);
  if (tid == 0) {
    if (sbase & 1023) __trap();  // the swizzled X panels need 1024-byte alignment
    for (int i = 0; i < S; ++i) {
      WgMbarInit(full_bar(i), 1);            // thread 0's expect_tx, then the copies' bytes
      WgMbarInit(empty_bar(i), C::kWarps);   // every warp done with the stage's weights and scales
    }
    for (int i = 0; i < C::kPerms; ++i) WgMbarInit(perm_bar(i), C::kWarps);  // every warp's part of the permuted X
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  Cursor pc;  // producer: the stage issued next
  range_start(pc, 0);
  auto issue_w = [&](int slot) {
    if (tid != 0) return;
    const uint32_t base = ring + slot * C::kStageBytes, bar = full_bar(slot);
    const bool gs = group_start(pc);
    WgMbarExpect(bar, uint32_t(C::kWBytes + C::kXBytes + (gs ? nstrips * kSzBlockBytes : 0)));
    TmaLoad2d(base + C::kXBytes, &wmap, pc.j * 64, strip0, bar);
    if (gs)
      BulkCopy(base + C::kXBytes + C::kWBytes, static_cast<const char*>(p.sz) + (size_t(pc.g) * p.strips + strip0) * kSzBlockBytes,
               nstrips * kSzBlockBytes, bar);
  };
  auto issue_x = [&](int slot) {
    if (tid == 0) TmaLoad2d(ring + slot * C::kStageBytes, &xmap, pc.j * kStepK, m0, full_bar(slot));
    advance(pc);
  };

  // ---- X permute pass (all threads, per stage): natural [row][step][t: channels 8t..8t+7] -> permuted
  // buffer, panel s / 2, row r, 16-byte chunk ((s % 2) * 4 + q) ^ (r % 8) = words t of channels 8t + 2q, +1.
  // Thread (row xr0 + 32 pass, step xs, chunk xt): a 4 x 4 word transpose among the 4 lanes of (row, step). ----
  const int xt = lane & 3, xs = (lane >> 2) & 3, xr0 = (lane >> 4) + 2 * warp;
#ifdef FLASHQ_WG_TIMELINE
  bool tl_on = false;
  unsigned long long tl_p = 0;
  auto now = [] { unsigned long long x; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(x)); return x; };
#endif
  auto permute = [&](int slot, int buf) {
    const unsigned char* src = smem + C::kRingOffset + slot * C::kStageBytes;
    unsigned char* dst = smem + C::kPermOffset + buf * C::kPermBytes;
#pragma unroll
    for (int pass = 0; pass < C::kPasses; ++pass) {
      const int r = xr0 + (C::kThreads / 16) * pass;
      const uint4 v = *reinterpret_cast<const uint4*>(src + r * C::kXRowBytes + xs * 64 + xt * 16);
      uint32_t o0 = 0u, o1 = 0u, o2 = 0u, o3 = 0u;
#pragma unroll
      for (int d = 0; d < 4; ++d) {  // lane xt gets word xt of lane xt ^ d's chunk, which it sends as its word (xt ^ d) ^ d
        const int q = xt ^ d;          // selects, not branches: the shuffles stay convergent
        const uint32_t send = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
        const uint32_t recv = d == 0 ? send : __shfl_xor_sync(0xffffffffu, send, d);
        o0 = q == 0 ? recv : o0;
        o1 = q == 1 ? recv : o1;
        o2 = q == 2 ? recv : o2;
        o3 = q == 3 ? recv : o3;
      }
      *reinterpret_cast<uint4*>(dst + (xs / 2) * (C::kRows * 128) + r * 128 + ((((xs % 2) * 4 + xt) ^ (r & 7)) * 16)) =
          make_uint4(o0, o1, o2, o3);
    }
#ifdef FLASHQ_WG_TIMELINE
    if (tl_on) tl_p = now();
#endif
    FenceProxyAsyncShared();  // generic-proxy writes -> the wgmmas' (async proxy) reads
    __syncwarp();
    if (lane == 0) WgMbarArrive(perm_bar(buf));
  };

  // ---- math: warp w of warpgroup h: strip 2h + w / 2 of the block, half u = w % 2 ----
  const int h = warp >> 2, wi = warp & 3;
  const int bs = 2 * h + (wi >> 1), u = wi & 1;
  float acc[32], c[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = c[i] = 0.0f;
  float scl[2] = {0.0f, 0.0f};
  uint32_t nzm[2] = {0u, 0u};
  uint32_t a[2][2][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) (&a[0][0][0])[i] = 0u;
  auto keep_a = [&](int b) {
#pragma unroll
    for (int i = 0; i < 8; ++i) KeepReg((&a[b][0][0])[i]);
  };
  Cursor cc;  // consumer: the stage computed next
  range_start(cc, 0);
  auto compute = [&](int slot, int buf, auto after_first) {
    const unsigned char* sb = smem + C::kRingOffset + slot * C::kStageBytes;
    if (group_start(cc)) {
      const unsigned char* blk = sb + C::kXBytes + C::kWBytes + bs * kSzBlockBytes;
      float sc4[4];
      uint32_t nz4[4];
      GroupRegs<T>(reinterpret_cast<const uint2*>(blk)[g], reinterpret_cast<const uint32_t*>(blk + kSzZeros)[g], sc4, nz4);
      scl[0] = u ? sc4[2] : sc4[0];
      scl[1] = u ? sc4[3] : sc4[1];
      nzm[0] = u ? nz4[2] : nz4[0];
      nzm[1] = u ? nz4[3] : nz4[1];
    }
    const int rs = real_steps(cc);
    const uint64_t desc0 = SwizzledDesc(sbase + C::kPermOffset + buf * C::kPermBytes);
    const unsigned char* wsm = sb + C::kXBytes + bs * (kSubSteps * 512) + lane * 16 + u * 8;
#pragma unroll
    for (int s = 0; s < kSubSteps; ++s) {
      // Steps past the weights are zero words, as in the other kernels (the same mma operands).
      const uint2 wq = s < rs ? *reinterpret_cast<const uint2*>(wsm + s * 512) : make_uint2(0u, 0u);
      const int b = s & 1;
      if (s >= 2) {  // step s - 2's wgmmas read a[b]
        WgWait<1>();
        keep_a(b);
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {  // StepMma's A fragments of half u
        a[b][ks][0] = DequantPair<T>(wq.x, 2 * ks, nzm[0]);
        a[b][ks][1] = DequantPair<T>(wq.y, 2 * ks, nzm[1]);
        a[b][ks][2] = DequantPair<T>(wq.x, 2 * ks + 1, nzm[0]);
        a[b][ks][3] = DequantPair<T>(wq.y, 2 * ks + 1, nzm[1]);
      }
      WgFence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)  // the flush unit starts from zero (Mma0)
        WgmmaRsK<T>(c, a[b][ks], desc0 + uint64_t(((s / 2) * (C::kRows * 128) + (s % 2) * 64 + ks * 32) >> 4), s > 0 || ks > 0);
      WgCommit();
      if (s == 0) after_first();
    }
    __syncwarp();
    if (lane == 0) WgMbarArrive(empty_bar(slot));  // the stage's weights and scales are in registers
    WgWait<0>();
    keep_a(0);
    keep_a(1);
#pragma unroll
    for (int i = 0; i < 32; ++i) KeepReg(c[i]);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = fmaf(scl[(i >> 1) & 1], c[i], acc[i]);  // Flush
    if (cc.i == nst - 1 && cc.r == 0) {  // end of the first range: park its sums, start the second from zero
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        park[i * C::kThreads + tid] = acc[i];
        acc[i] = 0.0f;
      }
    }
    advance(cc);
  };

  // ---- pipeline, no block barrier: stage st waits for its permuted X (every warp's part), computes; after its first
  // wgmmas, thread 0 refills the slot of stage st - 1 (once every warp is done with it) with stage st + S - 1, and
  // every thread permutes its part of stage st + 1's X into buffer (st + 1) % 3, which stage st - 2 read: every warp
  // is past stage st - 2, since each permuted its part of stage st (this stage's wait) after computing stage st - 1. ----
  LaunchDependents();
  {
    Cursor save = pc;
    for (int st = 0; st < S && st < ntot; ++st) {
      issue_w(st);
      advance(pc);
    }
    pc = save;
  }
  GridDependencyWait();  // X comes from the previous kernel; Y may still be read by it
  for (int st = 0; st < S && st < ntot; ++st) issue_x(st);
  WgMbarWait(full_bar(0), 0);
  permute(0, 0);
  int slot = 0, buf = 0;
#ifdef FLASHQ_WG_TIMELINE
  unsigned long long tl[6] = {};
#endif
  for (int st = 0; st < ntot; ++st) {
#ifdef FLASHQ_WG_TIMELINE
    if (st == 5) tl[0] = now();
#endif
    WgMbarWait(perm_bar(buf), (st / C::kPerms) & 1);
#ifdef FLASHQ_WG_TIMELINE
    if (st == 5) tl[1] = now();
#endif
    compute(slot, buf, [&] {
#ifdef FLASHQ_WG_TIMELINE
      if (st == 5) tl[2] = now();
#endif
      if (tid == 0 && st > 0 && st + S - 1 < ntot) {
        const int ws = slot == 0 ? S - 1 : slot - 1;
        WgMbarWait(empty_bar(ws), ((st - 1) / S) & 1);
        issue_w(ws);
        issue_x(ws);
      }
      if (st + 1 < ntot) {
        const int ns = slot + 1 == S ? 0 : slot + 1;
        WgMbarWait(full_bar(ns), ((st + 1) / S) & 1);
#ifdef FLASHQ_WG_TIMELINE
        if (st == 5) tl[3] = now();
        tl_on = st == 5;
#endif
#ifdef FLASHQ_WG_NO_PERMUTE
        __syncwarp();
        if (lane == 0) WgMbarArrive(perm_bar(buf + 1 == C::kPerms ? 0 : buf + 1));
#else
        permute(ns, buf + 1 == C::kPerms ? 0 : buf + 1);
#endif
#ifdef FLASHQ_WG_TIMELINE
        if (st == 5) tl[4] = now();
#endif
      }
    });
#ifdef FLASHQ_WG_TIMELINE
    if (st == 5) {
      tl[5] = now();
      if (lane == 0 && blockIdx.x == 0 && blockIdx.z == 0 && blockIdx.y == 0)
        printf("TL warp %2d: permwait %.3f step0 %.3f issue+fullwait %.3f permute %.3f fence+arrive %.3f rest %.3f (us)\n", warp,
               (tl[1] - tl[0]) * 1e-3, (tl[2] - tl[1]) * 1e-3, (tl[3] - tl[2]) * 1e-3, (tl_p - tl[3]) * 1e-3, (tl[4] - tl_p) * 1e-3,
               (tl[5] - tl[4]) * 1e-3);
    }
#endif
    slot = slot + 1 == S ? 0 : slot + 1;
    buf = buf + 1 == C::kPerms ? 0 : buf + 1;
  }
  __syncthreads();  // the buffers are free: they hold the split's fp32 tile next

  // ---- the split's sum w0 + w1 into the tile [row][column], then the splits in order 0..S-1 ----
  float* tile = reinterpret_cast<float*>(smem);
  const int colw = bs * kWarpN + 16 * u + g;  // column inside the block of acc[i], i = 4j + e: + 8 (e >> 1)
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = 8 * (i >> 2) + 2 * t + (i & 1);
    tile[row * C::kTileLd + colw + 8 * ((i >> 1) & 1)] = park[i * C::kThreads + tid] + acc[i];
  }
  const bool cluster = p.splits > 1;
  if (cluster) ClusterSync();
  else __syncthreads();
  const int rows = min(C::kRows, p.M - m0);
  const int ncol0 = cblock * C::kCols;
  const uint32_t tbase = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  T* y = static_cast<T*>(p.y);
  const bool vec = (p.N & 3) == 0;
#pragma unroll 1
  for (int q = split + p.splits * tid; q < rows * (C::kCols / 4); q += p.splits * C::kThreads) {
    const int r = q / (C::kCols / 4), c4 = 4 * (q % (C::kCols / 4));
    const uint32_t addr = tbase + uint32_t(r * C::kTileLd + c4) * 4;
    float4 v[kMaxSplits];
#pragma unroll
    for (int sp = 0; sp < kMaxSplits; ++sp)
      if (sp < p.splits) v[sp] = cluster ? LdClusterF4(addr, sp) : *reinterpret_cast<const float4*>(tile + r * C::kTileLd + c4);
    float4 sum = v[0];
#pragma unroll
    for (int sp = 1; sp < kMaxSplits; ++sp)
      if (sp < p.splits) {
        sum.x += v[sp].x;
        sum.y += v[sp].y;
        sum.z += v[sp].z;
        sum.w += v[sp].w;
      }
    const int col = ncol0 + c4;
    if (col < p.N) {
      T* dst = y + size_t(m0 + r) * p.N + col;
      if (vec) {
        const T o[4] = {T(sum.x), T(sum.y), T(sum.z), T(sum.w)};
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(o);
      } else {
        dst[0] = T(sum.x);
        if (col + 1 < p.N) dst[1] = T(sum.y);
        if (col + 2 < p.N) dst[2] = T(sum.z);
        if (col + 3 < p.N) dst[3] = T(sum.w);
      }
    }
  }
  if (cluster) ClusterSyncExit();  // no block leaves while another still reads its tile
#else
  __trap();
#endif
}

// The wgmma path (experimental, off by default): int4 stage-flush launches of M > 16 rows on sm_90 with at most
// kMaxSplits splits. Bench knob FLASHQ_GEMM_WGMMA_MIN_M=n: the smallest M it takes (n > 16; unset: off).
inline bool UseWgmma(const QLinearParams& p) {
  static const int min_rows = [] {
    const char* e = std::getenv("FLASHQ_GEMM_WGMMA_MIN_M");
    const int v = e ? std::atoi(e) : 0;
    return v > kSmallMMaxRows ? v : 1 << 30;
  }();
  return p.M >= min_rows && p.splits <= kMaxSplits && DeviceMajor() >= 9;
}

// A 2D tensor map (dim0 contiguous, dim1 rows `stride1` bytes apart), boxes box0 x box1, no swizzle, zero fill;
// false where the driver lacks the encoder or rejects the layout.
inline bool EncodeMap2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t dim0, uint64_t dim1,
                        uint64_t stride1, uint32_t box0, uint32_t box1) {
  using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const EncodeFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<EncodeFn>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {dim0, dim1};
  const cuuint64_t strides[1] = {stride1};
  const cuuint32_t box[2] = {box0, box1};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// cudaErrorNotSupported (nothing launched) where the tensor maps cannot be made: the caller takes QLinearKernel.
template <typename T>
cudaError_t LaunchQLinearWgmma(const QLinearParams& p, cudaStream_t stream) {
  using C = WgCfg;
  CUtensorMap xmap, wmap;
  const auto xtype = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (!EncodeMap2d(&xmap, xtype, p.x, uint64_t(p.K), uint64_t(p.M), uint64_t(p.K) * 2, kSubSteps * kStepK, C::kRows) ||
      !EncodeMap2d(&wmap, CU_TENSOR_MAP_DATA_TYPE_UINT64, p.qw, uint64_t(p.nk32) * 64, uint64_t(p.strips), uint64_t(p.nk32) * 512,
                   kSubSteps * 64, C::kStrips))
    return cudaErrorNotSupported;
  auto* kernel = QLinearWgmmaKernel<T>;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.M + C::kRows - 1) / C::kRows, p.splits, (p.N + C::kCols - 1) / C::kCols);
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  if (p.splits > 1) {
    at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg.numAttrs].val.clusterDim.x = 1;
    at[cfg.numAttrs].val.clusterDim.y = p.splits;
    at[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  AddPdl(&cfg);
  return cudaLaunchKernelEx(&cfg, kernel, p, xmap, wmap);
}
}  // namespace flashq::gemm::detail
