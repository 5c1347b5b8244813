// W4A16 for M > 32 on sm_90a with plans of at most 4 splits, or of 8 splits at one token tile: QLinearKernel's
// arithmetic (plan warp ranges, k32 steps, g128 flush units, fixed-order split sums) with the k16 chunks on wgmma
// m64n64k16 instead of mma.sync m16n8k16. H200 (docs/perf/gemm.md): at M = 64 24% faster than QLinearKernel on 4096x14336, 8192² and 14336x4096; slower at M = 32, and
// with 8-split plans above one token tile, which keep QLinearKernel.
//
// Bits: wgmma with A from registers in the m16n8k16 A-fragment layout gives the very bits of chained mma.sync over
// the same k16 chunks, in any k order inside a chunk (checked by bench/gemm/mma_probe.cu). So each warp builds
// StepMma's A fragments (DequantPair of the same packed words and zero points) for its 16-column half u of a strip, a
// flush unit (one 4-step stage) starts from zero (scale-d = 0) and is folded into the fp32 sum with Flush's fma, the
// split's two warp ranges are added as w0 + w1, and the splits in order 0..S-1: row i of Y is bitwise the small-M
// kernel's (the GPU tests compare every M with single-row calls).
//
// X is first packed per 64-row tile and 4-step stage as the main kernel's shared-memory image: two 128B-swizzled
// 64-channel panels, k permuted so that k16 chunk ks of a step holds channels 8t + 4ks + {0..3} where the A fragment
// of thread t expects them (the packed weights' k order, see qlinear_fragment.cuh). With one token tile and a grid the
// device holds at once, the main kernel's blocks pack it themselves and wait for each other; otherwise PackXKernel
// runs before it.
// Block: 4 warpgroups, warpgroup h = strips 2h, 2h+1 of the block's 8 (256 columns; warp w of the group: rows 16w..
// of the m64 wgmma = strip 2h + w / 2, half w % 2), one 64-token tile (the wgmma N) and one split, whose two warp
// ranges the block walks in turn (the first range's sums park in shared memory). Per stage thread 0 issues one bulk
// copy of packed X, one TMA box of the 8 strips' weights (2 KB each) and, where a group starts, one bulk copy of the
// scale blocks into a 4-slot ring with full / empty mbarriers; no block barrier in the loop. A warpgroup waits for
// its wgmmas at the end of each stage before it folds them: ptxas serializes every wgmma (C7514) if an accumulator
// is read while another chain is open, so the 4 warpgroups keep the tensor cores busy between them.
// Split sums: 2-split plans through a 2-block cluster (distributed shared memory), larger plans through the
// workspace: each block sums a slice of the tile where the grid is resident, else the last block of the tile (acq_rel
// ticket) sums it; clusters of 4 and 8 full-SM blocks do not fit one wave.
// Where the time goes at M = 64 (docs/perf/gemm.md, "What bounds it"): without memory waits a
// stage takes about the probe's 0.7 µs; the packing of X, the split sum and the memory waits each cost several µs.
// Limits: sm_90a, int4 with groups of a multiple of 4 k32 steps (kStageFlush), M per launch <= kMaxRowsPerLaunch.
#pragma once

#include <cuda.h>

#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/wgmma.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/loads.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/qlinear_fragment.cuh"

namespace flashq::gemm::detail {

struct WgCfg {
  static constexpr int kThreads = 512;                                // 4 math warpgroups of 64 columns (2 strips)
  static constexpr int kProducerThreads = 128;                        // 1 producer warpgroup: packing and copies
  static constexpr int kBlockThreads = kThreads + kProducerThreads;
  // setmaxnreg moves registers inside the block's pool, 640 x 96 (what the launch bound allocates), not the SM's 64K:
  // 512 x 112 + 128 x 32.
  static constexpr int kPoolRegs = 65536 / kBlockThreads / 8 * 8 * kBlockThreads;
  static constexpr int kConsumerRegs = 112;
  static constexpr int kProducerRegs = (kPoolRegs - kThreads * kConsumerRegs) / kProducerThreads / 8 * 8;
  static_assert(kProducerRegs >= 24 && kThreads * kConsumerRegs + kProducerThreads * kProducerRegs <= kPoolRegs, "registers");
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kStrips = 8;
  static constexpr int kCols = kStrips * kWarpN;
  static constexpr int kRows = kWgmmaTileRows;                       // token tile = wgmma N
  static constexpr int kXBytes = kWgmmaXStageBytes;                  // a stage of packed X: two 128B-swizzled panels
  static constexpr int kWBytes = kStrips * kSubSteps * 32 * 16;      // [strip][step][lane] 16 B
  static constexpr int kSzBytes = kStrips * kSzBlockBytes;           // one group's scale blocks
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSzBytes + 1023) / 1024 * 1024;  // X panels 1024-aligned
  static constexpr int kStages = 4;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kParkBytes = kThreads * 32 * 4;               // the first range's 32 sums per thread
  static constexpr int kParkOffset = kRingBytes;
  static constexpr int kBarOffset = kParkOffset + kParkBytes;        // full[kStages], empty[kStages], packed
  static constexpr int kTileLd = kCols + 4;                          // fp32 split tile row stride (banks)
  static constexpr int kSmemBytes = kBarOffset + (2 * kStages + 1) * 8;  // the dynamic shared memory starts 1024-aligned
  static_assert(kRows * kTileLd * 4 <= kRingBytes, "the split tile reuses the ring");
  static_assert(kSmemBytes + 1024 <= 228 * 1024, "shared memory");
};

// Stages of packed X per 64-row tile: every warp range of the plan, K padded with zeros.
inline __host__ __device__ int PackedXStages(const QLinearParams& p) { return gemm::PackedXStages(p.splits, p.steps_per_warp); }

using ptx::SwizzledDesc;
// Thread 0 of a block of a resident grid: polls *ctr (acquire) until (value & mask) >= target or wait_ns have
// passed; returns the last value read.
__device__ __forceinline__ int WaitCount(const int* ctr, int mask, int target, uint32_t wait_ns) {
  int v;
  const uint64_t t0 = ptx::GlobalTimerNs();
  do {
    v = ptx::LdAcquireGpu(ctr);
  } while ((v & mask) < target && ptx::GlobalTimerNs() - t0 < wait_ns);
  return v;
}

// The spread split sum's word per tile: arrivals (bits 0-7) and blocks that gave up (8-15). Thread 0, after the
// block's partial is in the workspace: returns what the block sums, its slice `split` once all `splits` partials are
// in, or nothing (-1) when it has waited wait_ns (the grid was not resident after all, e.g. under an MPS SM limit) and
// gives up, so that its SM frees for the blocks still to come. A block that sees every partial in and some block given
// up sums the whole tile (splits); the last to arrive always sees every partial in, so nothing can hang, and a slice
// summed twice is written twice with the same bits. The arrival needs no round trip (a release reduction); the
// departure count (GridDeparture) zeroes the word.
__device__ __forceinline__ int SpreadTicket(int* ctr, int split, int splits, uint32_t wait_ns) {
  ptx::RedAddRelease(ctr, 1);  // releases this block's partial
  int v = WaitCount(ctr, 0xff, splits, wait_ns);
  if ((v & 0xff) < splits) v = ptx::AtomicAddAcqRel(ctr, 1 << 8);  // give up, unless every partial is in after all
  return (v & 0xff) < splits ? -1 : (v >> 8) != 0 ? splits : split;
}
// A block done waiting on `ctr` (count `n`) departs on ctr[1]: the result, taken at the block's end, says whether it
// was the last of the n, which then zeroes both words for the next call. The round trip overlaps the block's work.
__device__ __forceinline__ int GridDeparture(int* ctr) { return atomicAdd(ctr + 1, 1); }
__device__ __forceinline__ void GridReset(int* ctr, int departed, int n) {
  if (departed == n - 1) {
    ctr[0] = 0;
    ctr[1] = 0;
  }
}

// X [M][K] -> p.xpack [row tile][stage][panel][64 rows][128 B]: each stage the main kernel's shared-memory image,
// so that one bulk copy places it. Panel s / 2 row r holds step s of the stage in 16-byte chunks ((s % 2) * 4 + q) ^
// (r % 8) (128B swizzle), chunk q = words t = 0..3 of channels 8t + 2q, +1: k16 chunk ks holds channels 8t + 4ks +
// {0..3} where the A fragment of thread t expects them. One thread per (row, k32 step); rows >= M and channels >= K
// are zeros.
// Row m, k32 step jj into `image`, the 16 KB image of jj's stage (in p.xpack, or a ring slot of the main kernel).
template <typename T>
__device__ __forceinline__ void PackXInto(const QLinearParams& p, int m, int jj, uint4* image) {
  uint4 in[4];  // channels 32 jj + 8t .. +7
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int k = jj * kStepK + 8 * t;
    in[t] = m < p.M && k < p.K ? ptx::LdCached16(static_cast<const T*>(p.x) + size_t(m) * p.K + k) : make_uint4(0u, 0u, 0u, 0u);
  }
  const int r = m % WgCfg::kRows, s = jj % kSubSteps;
  uint4* dst = image + (s / 2) * (WgCfg::kRows * 8) + r * 8;
  dst[((s % 2) * 4 + 0) ^ (r & 7)] = make_uint4(in[0].x, in[1].x, in[2].x, in[3].x);
  dst[((s % 2) * 4 + 1) ^ (r & 7)] = make_uint4(in[0].y, in[1].y, in[2].y, in[3].y);
  dst[((s % 2) * 4 + 2) ^ (r & 7)] = make_uint4(in[0].z, in[1].z, in[2].z, in[3].z);
  dst[((s % 2) * 4 + 3) ^ (r & 7)] = make_uint4(in[0].w, in[1].w, in[2].w, in[3].w);
}
// Item i = (row m, k32 step jj) of the packing below, into p.xpack.
template <typename T>
__device__ __forceinline__ void PackXItem(const QLinearParams& p, int i, int nsteps) {
  const int jj = i % nsteps, m = i / nsteps;
  const size_t stage = size_t(m / WgCfg::kRows) * PackedXStages(p) + jj / kSubSteps;
  PackXInto<T>(p, m, jj, static_cast<uint4*>(p.xpack) + stage * 2 * (WgCfg::kRows * 8));
}
template <typename T>
__global__ void __launch_bounds__(256) PackXKernel(const QLinearParams p) {
  ptx::GridDependencyWait();  // X comes from the previous kernel
  ptx::LaunchDependents();    // the linear kernel may start its weight copies; it waits for this grid's end
  const int nsteps = PackedXStages(p) * kSubSteps;
  const int m_rows = (p.M + WgCfg::kRows - 1) / WgCfg::kRows * WgCfg::kRows;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m_rows * nsteps) PackXItem<T>(p, i, nsteps);
}

// wmap: the packed weights [strips][nk32 x 512 B] in boxes of the block's 8 strips x 2 KB (4 k32 steps), zero-filled
// outside the tensor. X comes packed by PackXKernel, or (p.xready) the blocks pack it below.
template <typename T>
__global__ void __launch_bounds__(WgCfg::kBlockThreads, 1) QLinearWgmmaKernel(const QLinearParams p, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgCfg;
  constexpr int S = C::kStages;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw;  // 1024-aligned by the declaration (checked below)
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t ring = sbase, bar0 = sbase + C::kBarOffset;
  auto full_bar = [&](int slot) { return bar0 + 8 * slot; };
  auto empty_bar = [&](int slot) { return bar0 + 8 * (S + slot); };
  const uint32_t packed_bar = bar0 + 8 * 2 * S;  // the math warps' share of packed X for the other blocks is stored
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

  // ---- copies: thread 0 issues a stage's packed X (one bulk copy of its shared-memory image), weights (one box)
  // and scale blocks (one bulk copy, where a group starts), completing on the slot's full mbarrier ----
  const int nstrips = min(C::kStrips, p.strips - strip0);
  if (tid == 0) {
    if (sbase & 1023) __trap();  // the swizzled X panels need 1024-byte alignment
    for (int i = 0; i < S; ++i) {
      ptx::MbarInit(full_bar(i), 1);            // the producer's expect_tx, then the copies' bytes
      ptx::MbarInit(empty_bar(i), C::kThreads);  // every math thread done with the stage
    }
    ptx::MbarInit(packed_bar, C::kThreads / 2);
    ptx::FenceMbarInitCluster();
  }
  __syncthreads();
  Cursor pc;  // producer: the stage issued next
  range_start(pc, 0);
  const char* xsrc = static_cast<const char*>(p.xpack) + size_t(mtile) * PackedXStages(p) * C::kXBytes;
  auto issue_w = [&](int slot, bool with_x) {
    const uint32_t base = ring + slot * C::kStageBytes, bar = full_bar(slot);
    const bool gs = group_start(pc);
    ptx::MbarArriveExpectTx(bar, uint32_t(C::kWBytes + (with_x ? C::kXBytes : 0) + (gs ? nstrips * kSzBlockBytes : 0)));
    ptx::TmaLoad2d(base + C::kXBytes, &wmap, pc.j * 64, strip0, bar);
    if (gs)
      ptx::BulkCopy(base + C::kXBytes + C::kWBytes, static_cast<const char*>(p.sz) + (size_t(pc.g) * p.strips + strip0) * kSzBlockBytes,
               nstrips * kSzBlockBytes, bar);
  };
  auto issue_x = [&](int slot) {
    ptx::BulkCopy(ring + slot * C::kStageBytes, xsrc + size_t(pc.j / kSubSteps) * C::kXBytes, C::kXBytes, full_bar(slot));
    advance(pc);
  };
  ptx::LaunchDependents();

  // One token tile, a grid the device holds at once (checked by the launcher): the blocks pack X themselves, in place of
  // PackXKernel and its grid boundary. The math warps, idle until their first stage arrives, pack it straight into ring
  // slot 0 (half of them, an item a thread), while the other half packs the block's share of the later stages for the
  // split's other column blocks: stage l >= 1 of a split's K range by column block l - 1, whose producer thread then
  // raises the stage's flag (p.xready[1 + stage]). The producer's thread 0 waits for a stage's flag only before its copy.
  // A block that has waited p.wait_ns for a flag (the grid was not resident after all) packs that stage itself: the same
  // bytes, so nothing can hang. The last block done with its copies (departures in p.xready[0]) zeroes the words.
  const int nsteps = PackedXStages(p) * kSubSteps, gs0 = split * ntot;  // the block's first stage of packed X
  auto pack_stage = [&](int gs, int first, int stride) {
    for (int q = first; q < C::kRows * kSubSteps; q += stride)
      PackXItem<T>(p, (q / kSubSteps) * nsteps + gs * kSubSteps + q % kSubSteps, nsteps);
    ptx::FenceProxyAsyncGlobal();  // these generic stores before the TMA reads
  };

  if (tid >= C::kThreads) {
    // ---- producer warpgroup: its thread 0 issues every copy: a stage's packed X (one bulk copy), weights (one box)
    // and, where a group starts, scale blocks, into a 4-slot ring with full / empty mbarriers, each slot refilled once
    // the math warps are done with it, so no math warp issues copies or waits for the others (H200 M = 64:
    // 4096 x 14336 28.1 -> 24.2 µs, 8192² 29.9 -> 26.0, 14336 x 4096 27.6 -> 25.1; with the stage flags below 23.9,
    // 25.5, 23.9; docs/perf/experiments.md). The other threads leave at once, so the math
    // warpgroups synchronise among themselves (math_sync; a block barrier there hung under racecheck). ----
    ptx::SetMaxNRegDec<C::kProducerRegs>();
    if (tid != C::kThreads) return;
    Cursor save = pc;
    for (int st = 0; st < S && st < ntot; ++st) {
      issue_w(st, st > 0 || !p.xready);
      advance(pc);
    }
    pc = save;
    ptx::GridDependencyWait();  // X (or PackXKernel's packed X) comes from the kernel before
    if (p.xready && 1 + cblock < ntot) {
      ptx::MbarWaitAsmLoop(packed_bar, 0);  // the math warps stored the block's share (one phase: they never wait for this thread)
      for (int l = 1 + cblock; l < ntot; l += gridDim.z) ptx::RedAddRelease(p.xready + 1 + gs0 + l, 1);  // releases the stages
    }
    auto issue_x_ready = [&](int st, int slot) {
      if (p.xready && st == 0) return advance(pc);  // the math warps pack it into slot 0
      if (p.xready) {
        if (WaitCount(p.xready + 1 + gs0 + st, ~0, 1, p.wait_ns) < 1) pack_stage(gs0 + st, 0, 1);
        ptx::FenceProxyAsyncGlobal();
      }
      issue_x(slot);
    };
    for (int st = 0; st < S && st < ntot; ++st) issue_x_ready(st, st);
    for (int st = S; st < ntot; ++st) {
      const int slot = st % S;
      ptx::MbarWaitAsmLoop(empty_bar(slot), (st / S - 1) & 1);  // the math warps are done with stage st - S
      issue_w(slot, true);
      issue_x_ready(st, slot);
    }
    if (p.xready && atomicAdd(p.xready, 1) == gridDim.y * gridDim.z - 1) {
      for (int i = 0; i <= PackedXStages(p); ++i) p.xready[i] = 0;
    }
    return;
  }
  ptx::SetMaxNRegInc<C::kConsumerRegs>();
  ptx::GridDependencyWait();  // X, the workspace and Y come from or may still be in use by the kernel before
  // The math warpgroups' block barrier (the producer warpgroup has left).
  auto math_sync = [] { asm volatile("bar.sync 2, %0;\n" ::"n"(C::kThreads) : "memory"); };
  // The packing of X (above), an item a thread: one L2 round trip (the producer's 128 threads, with 32 registers, took
  // two: H200 M = 40-64 0.4-0.8 µs faster on all four shapes),
  // and the first stage in the block's own slot waits for no other block (a further 0.2-0.6 µs; docs/perf/experiments.md).
  if (p.xready) {
    static_assert(C::kRows * kSubSteps == C::kThreads / 2, "a stage is an item for each of half the math threads");
    if (tid < C::kThreads / 2) {
      PackXInto<T>(p, tid / kSubSteps, gs0 * kSubSteps + tid % kSubSteps, reinterpret_cast<uint4*>(smem));
      ptx::FenceProxyAsync();  // these generic stores before the wgmma reads
    } else {
      for (int l = 1 + cblock; l < ntot; l += gridDim.z) pack_stage(gs0 + l, tid - C::kThreads / 2, C::kThreads / 2);
      if (1 + cblock < ntot) ptx::MbarArrive(packed_bar);  // the producer releases the stages
    }
    math_sync();
  }

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
    for (int i = 0; i < 8; ++i) ptx::RegFence((&a[b][0][0])[i]);
  };
  Cursor cc;  // consumer: the stage computed next
  range_start(cc, 0);
  // This thread's weights and scale block inside a stage.
  const uint32_t w_off = C::kXBytes + bs * (kSubSteps * 512) + lane * 16 + u * 8;
  const uint32_t sz_off = C::kXBytes + C::kWBytes + bs * kSzBlockBytes;
  auto compute = [&](int slot) {
    const unsigned char* sb = smem + slot * C::kStageBytes;
    // The stage's weight words first, all four steps: their loads then overlap the scale block's and the issue below.
    // Steps past the weights (past K or past the warp range) are zero words, as in the other kernels (the same mma
    // operands): the TMA box reads them as zeros outside the tensor.
    uint2 wq[kSubSteps];
#pragma unroll
    for (int s = 0; s < kSubSteps; ++s) wq[s] = *reinterpret_cast<const uint2*>(sb + w_off + s * 512);
    if (group_start(cc)) {  // GroupRegs for this warp's half: scales and zeros of columns 8 (2u + s) + g, s = 0, 1
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(sb + sz_off + 8 * g + 4 * u));
      const uint32_t z = *reinterpret_cast<const uint16_t*>(sb + sz_off + kSzZeros + 4 * g + 2 * u);
      scl[0] = f.x;
      scl[1] = f.y;
      nzm[0] = NegMagicZero<T>(z, 0);
      nzm[1] = NegMagicZero<T>(z, 1);
    }
    const uint64_t desc0 = SwizzledDesc(ring + slot * C::kStageBytes);
#pragma unroll
    for (int s = 0; s < kSubSteps; ++s) {
      const int b = s & 1;
      if (s >= 2) {  // step s - 2's wgmmas read a[b]
        ptx::WgmmaWait<1>();
        keep_a(b);
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {  // StepMma's A fragments of half u
        a[b][ks][0] = DequantPair<T>(wq[s].x, 2 * ks, nzm[0]);
        a[b][ks][1] = DequantPair<T>(wq[s].y, 2 * ks, nzm[1]);
        a[b][ks][2] = DequantPair<T>(wq[s].x, 2 * ks + 1, nzm[0]);
        a[b][ks][3] = DequantPair<T>(wq[s].y, 2 * ks + 1, nzm[1]);
      }
      ptx::WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)  // the flush unit starts from zero (Mma0)
        ptx::WgmmaRsK<T>(c, a[b][ks], desc0 + uint64_t(((s / 2) * (C::kRows * 128) + (s % 2) * 64 + ks * 32) >> 4), s > 0 || ks > 0);
      ptx::WgmmaCommit();
    }
    ptx::WgmmaWait<0>();
    // The stage's X is read and its weights and scale block are in registers. Every thread arrives for its own
    // shared-memory reads: with one arrival per warp after __syncwarp, compute-sanitizer racecheck reports the next
    // refill's bulk copy as racing with the other lanes' reads (H200: every thread arriving costs 0.5-0.8 µs at
    // M = 40-64 on the three large shapes).
    ptx::MbarArrive(empty_bar(slot));
    keep_a(0);
    keep_a(1);
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::RegFence(c[i]);
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

  // ---- pipeline, no block barrier: each math warp waits for its stage's copies and computes it ----
  int s_departed = -1;  // thread 0: GridDeparture's result, taken at the end (`finish`)
  int slot = 0;
  for (int st = 0; st < ntot; ++st) {
    ptx::MbarWaitAsmLoop(full_bar(slot), (st / S) & 1);
    compute(slot);
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  math_sync();  // the buffers are free: they hold the split's fp32 tile next

  // ---- the split's sum w0 + w1 into the tile [row][column] (S > 2: straight into the workspace as the split's
  // partial), then the splits in order 0..S-1 ----
  float* tile = reinterpret_cast<float*>(smem);
  const int colw = bs * kWarpN + 16 * u + g;  // column inside the block of acc[i], i = 4j + e: + 8 (e >> 1)
  const int rows = min(C::kRows, p.M - m0);
  const int ncol0 = cblock * C::kCols;
  const int splits = p.splits;
  const size_t stride = size_t(p.M) * p.N;
  if (splits > 2) {
    float* dst = p.partial + split * stride + size_t(m0) * p.N + ncol0 + colw;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int row = 8 * (i >> 2) + 2 * t + (i & 1), col = 8 * ((i >> 1) & 1);
      if (row < rows && ncol0 + colw + col < p.N) dst[size_t(row) * p.N + col] = park[i * C::kThreads + tid] + acc[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int row = 8 * (i >> 2) + 2 * t + (i & 1);
      tile[row * C::kTileLd + colw + 8 * ((i >> 1) & 1)] = park[i * C::kThreads + tid] + acc[i];
    }
  }
  // Split sums, the same fp32 sum in the same order (SumSplits) whichever way: S = 1 from this block's tile; S = 2 over
  // a 2-block cluster's tiles (distributed shared memory, each block every second float4); S > 2 through the workspace.
  // There a resident grid (p.xready: one token tile, the whole grid on the device at once) has each block sum its slice
  // of the tile once all S partials are in (SpreadTicket: H200 M = 64 14336 x 4096 with 8 splits 35.8 -> 27.9 µs,
  // 8192² 31.3 -> 30.0; through it the 2-split plan was 1 µs slower than its cluster), and otherwise the last block of
  // the tile (acq_rel ticket) adds them all.
  const uint32_t tbase = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  const bool vec = (p.N & 3) == 0;
  const bool cluster = splits == 2, spread = splits > 2 && p.xready != nullptr;
  int* const sctr = p.counters + 2 * cblock;  // a resident grid has one token tile: its spread words, 2 per column block
  auto finish = [&] {
    if (tid == 0) {
      if (spread) GridReset(sctr, s_departed, splits);
    }
  };
  const int qend = rows * (C::kCols / 4);  // the tile's groups of 4 columns
  int q0 = tid, q1 = qend, qstep = C::kThreads;
  if (cluster) {
    ptx::ClusterSync();
    q0 = split + 2 * tid;
    qstep = 2 * C::kThreads;
  } else {
    math_sync();  // the tile, or every thread's part of the partial before thread 0's ticket
  }
  if (splits > 2) {
    __shared__ int s_part;  // what this block sums: -1 nothing, splits the whole tile, else its slice
    int* ctr = spread ? sctr : p.counters + cblock * gridDim.x + mtile;
    if (tid == 0) {
      if (spread) {
        s_part = SpreadTicket(ctr, split, splits, p.wait_ns);
        s_departed = GridDeparture(ctr);
      } else {
        s_part = ptx::AtomicAddAcqRel(ctr, 1) == splits - 1 ? splits : -1;
        if (s_part == splits) *ctr = 0;
      }
    }
    math_sync();
    const int part = s_part;
    if (part < 0) return finish();
    if (part < splits) {
      const int per = (qend + splits - 1) / splits;
      q0 = part * per + tid;
      q1 = min(qend, (part + 1) * per);
    }
  }
  T* y = static_cast<T*>(p.y);
  auto load4 = [&](int sp, int r, int c4) -> float4 {
    if (cluster) return ptx::LdClusterF4(tbase + uint32_t(r * C::kTileLd + c4) * 4, sp);
    if (splits == 1) return *reinterpret_cast<const float4*>(tile + r * C::kTileLd + c4);
    const float* src = p.partial + sp * stride + size_t(m0 + r) * p.N + ncol0 + c4;
    if (vec) return __ldcg(reinterpret_cast<const float4*>(src));
    const int c = ncol0 + c4;
    return make_float4(__ldcg(src), c + 1 < p.N ? __ldcg(src + 1) : 0.0f, c + 2 < p.N ? __ldcg(src + 2) : 0.0f,
                       c + 3 < p.N ? __ldcg(src + 3) : 0.0f);
  };
  // Each thread sums every qstep-th group of 4 columns in [q0, q1). From the workspace, kB = 4 of them at a time with
  // all their loads issued before the adds (one L2 round trip per batch: 8192² M = 64 / 128 2-3% faster on the H200;
  // one at a time for 5-8 splits, for registers); from the cluster's tiles one at a time (batches of 4 were ~1.4%
  // slower there).
  auto sum_store = [&](auto batch, auto max_splits) {
    constexpr int kB = decltype(batch)::value, kS = decltype(max_splits)::value;
#pragma unroll 1
    for (int qb = q0; qb < q1; qb += kB * qstep) {
      float4 v[kB][kS];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int q = qb + b * qstep, r = q / (C::kCols / 4), c4 = 4 * (q % (C::kCols / 4));
        if (q < q1 && ncol0 + c4 < p.N)
#pragma unroll
          for (int sp = 0; sp < kS; ++sp)
            if (sp < splits) v[b][sp] = load4(sp, r, c4);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int q = qb + b * qstep, r = q / (C::kCols / 4), c4 = 4 * (q % (C::kCols / 4)), col = ncol0 + c4;
        if (q < q1 && col < p.N) StoreY4(y + size_t(m0 + r) * p.N + col, col, p.N, vec, SumSplits(v[b], splits));
      }
    }
  };
  using I1 = std::integral_constant<int, 1>;
  using I4 = std::integral_constant<int, 4>;
  if (splits > kWgmmaMaxSplits) sum_store(I1{}, std::integral_constant<int, kMaxSplits>{});
  else if (cluster || splits == 1) sum_store(I1{}, I4{});
  else sum_store(I4{}, I4{});
  if (cluster) ptx::ClusterSyncExit();  // no block leaves while another still reads its tile
  finish();
#else
  __trap();
#endif
}

// A launch that WgmmaApplies (dispatch.h) takes: cudaErrorNotSupported (nothing launched) where the tensor map cannot
// be made or an 8-split grid would not be resident: the caller takes QLinearKernel.
// The linear kernel alone (packing X itself) or PackXKernel and then the linear kernel, all with programmatic dependent
// launch.
template <typename T>
cudaError_t LaunchQLinearWgmma(const QLinearParams& args, const GemmTuning& t, const DeviceInfo& d, cudaStream_t stream) {
  using C = WgCfg;
  QLinearParams p = args;
  p.wait_ns = t.grid_wait_ns;
  CUtensorMap wmap;
  if (!EncodeMap2d(&wmap, CU_TENSOR_MAP_DATA_TYPE_UINT64, p.qw, uint64_t(p.nk32) * 64, uint64_t(p.strips), uint64_t(p.nk32) * 512,
                   kSubSteps * 64, C::kStrips))
    return cudaErrorNotSupported;
  auto* kernel = QLinearWgmmaKernel<T>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute at[3];
  // xready: the blocks pack X themselves and wait for each other, only where the device holds the whole grid at once
  // (a cooperative launch guarantees that too, but cost about 0.6 µs per call on the H200). resident: blocks the device
  // holds at once with 2-block clusters or without, + 1, asked once per device.
  static std::atomic<int> resident[2][kMaxDevices] = {};
  int dev = 0;
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  auto launch_main = [&](const QLinearParams& q) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((q.M + C::kRows - 1) / C::kRows, q.splits, (q.N + C::kCols - 1) / C::kCols);
    cfg.blockDim = dim3(C::kBlockThreads);
    cfg.dynamicSmemBytes = C::kSmemBytes;
    cfg.stream = stream;
    cfg.attrs = at;
    const bool cluster = q.splits == 2;
    if (cluster) {
      at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      at[cfg.numAttrs++].val.clusterDim = {1, 2, 1};
    }
    if (q.xready) {
      if (dev >= kMaxDevices) return cudaErrorNotSupported;
      std::atomic<int>& fits = resident[cluster][dev];
      int fit = fits.load(std::memory_order_relaxed) - 1;
      if (fit < 0) {
        if (cluster ? cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg) != cudaSuccess
                          : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, C::kBlockThreads, C::kSmemBytes) != cudaSuccess) {
          (void)cudaGetLastError();
          fit = 0;
        }
        fit *= cluster ? 2 : d.sms;
        fits.store(fit + 1, std::memory_order_relaxed);
      }
      if (long(fit) < long(cfg.gridDim.x) * cfg.gridDim.y * cfg.gridDim.z) return cudaErrorNotSupported;
    }
    AddPdl(&cfg, t, d);
    return cudaLaunchKernelEx(&cfg, kernel, q, wmap);
  };
  // One token tile: in-kernel packing where the grid fits (H200: 8192² M = 64 35.6 -> 31.4 µs), else PackXKernel.
  if (p.M <= C::kRows && p.xready) {
    e = launch_main(p);
    if (e != cudaErrorNotSupported) return e;
  }
  if (p.splits > kWgmmaMaxSplits) return cudaErrorNotSupported;  // their sum needs the whole grid resident
  QLinearParams q = p;
  q.xready = nullptr;
  cudaLaunchConfig_t pack = {};
  const long threads = long((p.M + C::kRows - 1) / C::kRows) * C::kRows * PackedXStages(p) * kSubSteps;
  pack.gridDim = dim3(unsigned((threads + 255) / 256));
  pack.blockDim = dim3(256);
  pack.stream = stream;
  pack.attrs = at;
  AddPdl(&pack, t, d);
  e = cudaLaunchKernelEx(&pack, PackXKernel<T>, p);
  if (e != cudaSuccess) return e;
  return launch_main(q);
}

}  // namespace flashq::gemm::detail
