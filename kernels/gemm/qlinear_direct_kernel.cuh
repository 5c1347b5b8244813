// Small-M kernel (M <= 16): one block holds one 32-column strip and ALL of K, one warp per plan
// warp range (2 * splits warps, 64..512 threads), so there is no split-K across blocks (no
// workspace, ticket or second pass) and no shared memory or barrier in the main loop. Each warp
// keeps kDepth k32 steps of its weights, X chunks and scale blocks in flight in REGISTERS
// (ld.global.nc straight into the fragment words: the packed layout already gives each lane its
// own 16 bytes), so a step costs one load per operand, the dequantization and the mmas. The
// arithmetic per warp is StepMma/Flush on the same warp range as QLinearKernel, and the block
// sums the warps in QLinearKernel's order ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...),
// so each output is bitwise the one the 32-token kernel computes for M > 16.
// int4 on 8-split plans runs strip pairs instead (2-block clusters that share X through L1, kPair). Programmatic
// dependent launch on sm_90 (weights prefetched before griddepcontrol.wait). Arithmetic and layouts:
// qlinear_fragment.cuh.
// Limits: M per launch <= kSmallMMaxRows.
// Measured: bench/results/gemm-nvidia-h200.md (design and bounds in docs/perf/gemm.md).
#pragma once

#include <type_traits>

#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/loads.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/qlinear_fragment.cuh"

namespace flashq::gemm::detail {

constexpr int kDirectMaxThreads = 64 * kMaxSplits;

// The small-M kernels' block sum: each warp's accumulators to shared memory `red`, then the warp ranges of the strip
// added in QLinearKernel's order ((w0 + w1) [* fp8 scale] + (w2 + w3) [* scale] + ...) and Y stored. fsv: the fp8
// channel scales of the outputs o = threadIdx.x + it * blockDim.x (unused for int4).
template <typename T, int NT, bool kFp8, int kOutIter>
__device__ __forceinline__ void BlockSum(float* red, const QLinearParams& p, int strip, int warp, int lane,
                                         const float (&acc)[NT][2][4], const float (&fsv)[kOutIter]) {
  constexpr int kNA = NT * 8;  // accumulators per lane
  StoreAcc<NT>(red, warp, lane, acc);
  __syncthreads();
  T* y = static_cast<T*>(p.y);
  // Output o (accumulator (nt, u, e) of lane l) of the block's sum; fs: the fp8 channel scale of its column.
  auto out = [&](int o, float fs) {
    const int i = o >> 5, l = o & 31;
    const int e = i & 3, u = (i >> 2) & 1, nt = i >> 3;
    const int row = nt * 8 + 2 * (l & 3) + (e & 1);
    const int cs = 16 * u + 8 * (e >> 1) + (l >> 2);  // column inside the strip
    const int col = strip * kWarpN + cs;
    // Rounded adds and multiplies (no fma contraction): QLinearKernel rounds each split's sum
    // to fp32 in memory before it adds the next.
    // Unrolled over kMaxSplits, so that all the shared-memory loads issue before the adds (H200: int4
    // M <= 16 1-4% faster than the loop over p.splits).
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q)
      if (q < p.splits) {
        float v = __fadd_rn(red[2 * q * kNA * 32 + o], red[(2 * q + 1) * kNA * 32 + o]);
        if constexpr (kFp8) v = __fmul_rn(v, fs);
        sum = q == 0 ? v : __fadd_rn(sum, v);
      }
    if (row < p.M && col < p.N) y[size_t(row) * p.N + col] = T(sum);
  };
  if constexpr (kFp8) {
#pragma unroll
    for (int it = 0; it < kOutIter; ++it) {
      const int o = threadIdx.x + it * blockDim.x;
      if (o < kNA * 32) out(o, fsv[it]);
    }
  } else {
    for (int o = threadIdx.x; o < kNA * 32; o += blockDim.x) out(o, 1.0f);
  }
}

// kPair's sum (QLinearDirectKernel, 8-split plans: 512 threads): warp 2r + s of a block holds warp range r of the
// block's half and strip s. Each thread adds the pairs of ranges of kIt outputs; rank 0 adds them up in BlockSum's order
// and hands the sums to rank 1 (`hand`, completing on its mbarrier hbar), which adds its own pairs to them in order and
// stores both strips.
template <typename T, int NT>
__device__ __forceinline__ void PairSum(float* red, float* hand, uint32_t hbar, const QLinearParams& p, int rank,
                                        int warp, int lane, const float (&acc)[NT][2][4]) {
  constexpr int kNA = NT * 8, kPairs = kMaxSplits / 2, kIt = 2 * kNA * 32 / kDirectMaxThreads;
  StoreAcc<NT>(red, warp, lane, acc);
  __syncthreads();
  float v[kIt][kPairs];
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int idx = threadIdx.x + it * kDirectMaxThreads, s = idx / (kNA * 32), o = idx % (kNA * 32);
#pragma unroll
    for (int q = 0; q < kPairs; ++q)  // pair q: the block's ranges 2q and 2q + 1 of strip s, warps 4q + s and 4q + 2 + s
      v[it][q] = __fadd_rn(red[(4 * q + s) * kNA * 32 + o], red[(4 * q + 2 + s) * kNA * 32 + o]);
  }
  if (rank == 0) {
    const uint32_t rhand = ptx::MapaShared(static_cast<uint32_t>(__cvta_generic_to_shared(hand)), 1);
    const uint32_t rbar = ptx::MapaShared(hbar, 1);
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      float sum = v[it][0];
#pragma unroll
      for (int q = 1; q < kPairs; ++q) sum = __fadd_rn(sum, v[it][q]);
      ptx::StAsyncF32(rhand + uint32_t(threadIdx.x + it * kDirectMaxThreads) * 4u, sum, rbar);
    }
    return;
  }
  ptx::MbarWaitAsmLoop(hbar, 0);
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const int idx = threadIdx.x + it * kDirectMaxThreads, s = idx / (kNA * 32), o = idx % (kNA * 32);
    float sum = hand[idx];
#pragma unroll
    for (int q = 0; q < kPairs; ++q) sum = __fadd_rn(sum, v[it][q]);
    const int i = o >> 5, l = o & 31;
    const int e = i & 3, u = (i >> 2) & 1, nt = i >> 3;
    const int row = nt * 8 + 2 * (l & 3) + (e & 1);
    const int col = (int(blockIdx.x & ~1u) + s) * kWarpN + 16 * u + 8 * (e >> 1) + (l >> 2);
    if (row < p.M && col < p.N) y[size_t(row) * p.N + col] = T(sum);
  }
}

// fp8: the channel scales of the outputs o = threadIdx.x + it * blockDim.x that BlockSum writes (it < kOutIter).
template <typename T, int NT, int kOutIter>
__device__ __forceinline__ void Fp8OutScales(const QLinearParams& p, int strip, float (&fsv)[kOutIter]) {
#pragma unroll
  for (int it = 0; it < kOutIter; ++it) {
    // Output o is accumulator (nt, u, e) = (o >> 8, (o >> 7) & 1, (o >> 5) & 3) of lane o & 31 (see `out`): its
    // column is 8 * (2u + (e >> 1)) + lane / 4 of the strip. fp16 weights were w * 2^-8.
    const int o = threadIdx.x + it * blockDim.x;
    const int cg = 2 * ((o >> 7) & 1) + ((o >> 6) & 1);
    if (o < NT * 8 * 32)
      fsv[it] = __ldg(p.fscales + (size_t(strip) * 8 + ((o & 31) >> 2)) * 4 + cg) * (std::is_same_v<T, __half> ? 256.0f : 1.0f);
  }
}

constexpr int kDirectMaxDepth = 8;  // the deepest ring of QLinearDirectKernel (DirectCfg::kDepth)
template <bool kFp8, int NT>
struct DirectCfg {
  static constexpr int kWChunks = kFp8 ? 2 : 1;  // uint4 of weights per lane per step
  static constexpr int kSub = kFp8 ? 2 : kSubSteps;
  // Steps in flight per warp, in registers: (kWChunks + NT) * 4 words each.
  static constexpr int kDepth = kWChunks + NT > 2 ? 4 : kDirectMaxDepth;
  static_assert(kDepth % kSub == 0 && kSubSteps % kSub == 0, "ring slots follow the flush units");
};

// kPre: the weight steps of the ring requested before griddepcontrol.wait (kDirectMaxDepth: all of them).
// kPair (sm_90, int4 with stage flush, 8-split plans): a 2-block cluster runs strips 2c and 2c + 1, block
// rank q the first (q = 0) or second half of both strips' warp ranges, so that the two warps of a range (one per strip,
// neighbours in the block) read the same X and one of them finds it in L1: half the L2 reads of X. Rank 0 adds its
// pairs of warp ranges, (w0 + w1) + (w2 + w3) + ..., and hands that over to rank 1 (st.async into its shared memory),
// which adds its own pairs to it in order and stores both strips: the sum and its order are BlockSum's. The blocks
// arrive at the cluster barrier at once and wait after the prologue's loads, where the warps wait for data anyway.
// H200, 14336 x 4096: M = 16 13.12 -> 11.94 µs, M = 13 12.17 -> 11.80, M = 9 unchanged, M = 4 10.18 -> 9.83,
// M = 8 10.69 -> 10.34; 4096² (where the staged kernel takes M <= 8) M = 16 5.43 -> 5.18, M = 12 5.17 -> 5.07, but M = 9
// 4.91 -> 5.02. In a first form (the hand-over behind a cluster barrier after the main loop) the 2- and 4-split
// plans (4096 x 14336, 8192²) lost 0.6-1.3 µs; they keep one-strip blocks
// (docs/perf/experiments.md).
template <typename T, int NT, bool kFp8, bool kStageFlush, int kPre, bool kPair = false>
__global__ void __launch_bounds__(kDirectMaxThreads, 1) QLinearDirectKernel(const QLinearParams p) {
  static_assert(!(kPair && kFp8), "strip pairs are built for int4");
  // The pairs' clusters and mbarriers exist from sm_90 on, where alone UsePairs launches them; compiled for an older
  // architecture, a kPair instance is the one-strip kernel behind a trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kPaired = false;
  if constexpr (kPair) __trap();
#else
  constexpr bool kPaired = kPair;
#endif
  using C = DirectCfg<kFp8, NT>;
  constexpr int kSub = C::kSub, kD = kFp8 || kStageFlush ? C::kDepth : 4;  // a scale block per step costs registers
  constexpr int kRefill = kD >= 2 * kSubSteps ? kSubSteps : 1;
  // Where each slot is refilled on its own, the load pointers stay put for a whole pass of the ring
  // and slot r loads at a constant offset from them (H200: int4 M = 16 up to 3.5% faster than moving
  // them at every load); stage refills move them at every load (there the offsets made M = 1 slower).
  constexpr bool kSlotAddr = kRefill == 1;
  // Scale blocks in flight: one per flush unit of the ring (stage flush), else one per step.
  constexpr int kSzSlots = kFp8 ? 1 : kStageFlush ? kD / kSub : kD;
  extern __shared__ float red[];  // [warp][NT * 8][32] accumulators, for the block's sum
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rank = kPaired ? int(blockIdx.x & 1) : 0;  // == %cluster_ctarank: the cluster is (2, 1, 1)
  const int strip = kPaired ? int(blockIdx.x & ~1u) + (warp & 1) : int(blockIdx.x);
  const int range = kPaired ? rank * int(blockDim.x >> 6) + (warp >> 1) : warp;  // the warp range of the plan
  const int spw = p.steps_per_warp;
  const int j0 = range * spw;                // == (split * kWarpsK + kw) * spw of QLinearKernel
  const int nvalid = min(spw, p.nk32 - j0);  // real k32 steps of this warp (may be <= 0)
  // Steps [0, nfast) need no predicate: inside the warp's weights and inside K for every lane.
  const int nfast = max(0, min(nvalid, p.K / kStepK - j0));

  // ---- producer state: pointers advance one k32 step per load ----
  const uint4* wp = static_cast<const uint4*>(p.qw) + (size_t(strip) * p.nk32 + j0) * (C::kWChunks * 32) + lane;
  // X chunks: token rows 8nt + g (rows past M read row M-1: a broadcast, their outputs are never
  // stored), k 8t..8t+7 of the step.
  const int xk0 = j0 * kStepK + 8 * t;
  const T* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xp[nt] = static_cast<const T*>(p.x) + size_t(min(nt * 8 + g, p.M - 1)) * p.K + xk0;
  const char* szp = nullptr;  // 96-byte scale block of the group of the step loaded last
  const size_t szstride = size_t(p.strips) * kSzBlockBytes;  // from one group's block to the next
  int gnext = 0, cnext = 0;   // next group start on the load side and on the compute side (relative to j0)
  if constexpr (!kFp8) {
    const int grp0 = j0 / p.gsteps;
    szp = static_cast<const char*>(p.sz) + (size_t(grp0) * p.strips + strip) * kSzBlockBytes;
    gnext = cnext = (grp0 + 1) * p.gsteps - j0;
  }

  uint4 wb[kD][C::kWChunks];
  uint4 xb[kD][NT];
  uint2 sbs[kSzSlots];
  uint32_t sbz[kSzSlots];
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  // Weights of step jn into ring slot r (zeros past the warp's steps) and, where a group starts,
  // its scale block into scale slot r / kSub (stage flush) or r.
  auto load_w = [&](int jn, int r, auto fast) {
    const bool valid = fast || jn < nvalid;
#pragma unroll
    for (int c = 0; c < C::kWChunks; ++c)
      wb[r][c] = valid ? ptx::LdStream(wp + ((kSlotAddr ? r : 0) * C::kWChunks + c) * 32) : zero4;
    if (!kSlotAddr) wp += C::kWChunks * 32;
    if constexpr (!kFp8) {
      if (!kStageFlush || r % kSub == 0) {
        const int sr = kStageFlush ? r / kSub : r;
        if (jn == gnext) {
          szp += szstride;
          gnext += p.gsteps;
        }
        if ((fast || jn < nvalid) && (jn == 0 || jn + p.gsteps == gnext)) {
          sbs[sr] = __ldg(reinterpret_cast<const uint2*>(szp) + g);
          sbz[sr] = __ldg(reinterpret_cast<const uint32_t*>(szp + kSzZeros) + g);
        }
      }
    }
  };
  // X of step jn into ring slot r (zeros past K).
  auto load_x = [&](int jn, int r, auto fast) {
    const bool kin = fast || xk0 + jn * kStepK < p.K;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      xb[r][nt] = kin ? ptx::LdCached16(xp[nt] + (kSlotAddr ? r : 0) * kStepK) : zero4;
      if (!kSlotAddr) xp[nt] += kStepK;
    }
  };
  // Slot addressing: moves the load pointers on by a pass of the ring.
  auto next_pass = [&] {
    if constexpr (kSlotAddr) {
      wp += kD * C::kWChunks * 32;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xp[nt] += kD * kStepK;
    }
  };

  float acc[NT][2][4];
  float c[NT][2][4];  // int4: the current flush unit's partial
  ZeroAcc<NT>(acc);
  float scl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint32_t nzm[4] = {0u, 0u, 0u, 0u};
  // fp8: the block's sum writes outputs o = threadIdx.x + it * blockDim.x (it < kOutIter: blocks have 64 threads
  // or more); their channel scales load with the first weights rather than after the main loop.
  constexpr int kOutIter = kFp8 ? NT * 8 * 32 / 64 : 1;
  float fsv[kOutIter];
  if constexpr (kFp8) Fp8OutScales<T, NT>(p, strip, fsv);

  // int4 lets the next kernel launch at once, as QLinearKernel does (H200: int4 M = 1 4-8% faster than
  // with the trigger after the main loop). fp8 triggers after its main loop: with the early trigger W8A16
  // at 4096 x 14336, M = 1 took 18.8 instead of 16.8 µs, past its 1.6x bar (docs/perf/experiments.md).
  constexpr bool kEarlyTrigger = !kFp8;
  if constexpr (kEarlyTrigger) ptx::LaunchDependents();
  // kPair: rank 1's hand-over mbarrier (after the accumulators and rank 0's sums in shared memory), published to rank 0
  // by the cluster barrier's arrive here and its wait after the prologue's loads, where the warps wait for data anyway.
  constexpr int kNA = NT * 8;  // accumulators per lane
  float* const hand = red + (blockDim.x >> 5) * kNA * 32;  // [2 strips][kNA * 32]: rank 0's sums, in rank 1
  const uint32_t hbar = static_cast<uint32_t>(__cvta_generic_to_shared(hand + 2 * kNA * 32));
  if constexpr (kPaired) {
    if (rank == 1 && threadIdx.x == 0) {
      ptx::MbarInit(hbar, 1);
      ptx::MbarArriveExpectTx(hbar, 2 * kNA * 32 * sizeof(float));
      ptx::FenceMbarInitCluster();
    }
    ptx::ClusterArriveRelaxed();
  }
  // ---- prologue: steps 0 .. kD-1. Weights and scales do not depend on the previous kernel: with
  // a programmatic launch they stream in while it finishes; X only after the wait. An SM's requests return roughly in
  // the order it made them, so the weight steps requested before X also land before it: with short warp ranges only
  // kPre of them, the rest after X (H200, 4096² M = 16: W4A16 5.51 -> 5.34 µs, W8A16 7.32 -> 7.04; with 28-32 steps per
  // warp the whole ring first is 0.3-1.3 µs faster; docs/perf/experiments.md). ----
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw && r < kPre) load_w(r, r, std::false_type{});
  ptx::GridDependencyWait();
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw) load_x(r, r, std::false_type{});
#pragma unroll
  for (int r = 0; r < kD; ++r)
    if (r < spw && r >= kPre) load_w(r, r, std::false_type{});
  next_pass();
  if constexpr (kPaired) ptx::ClusterWait();

  // ---- main loop: step j computes from slot j % kD, then refills it with step j + kD. A pass of the
  // ring is `steady` where every step it computes and loads lies in [0, nfast): no bounds checks. ----
  auto pass = [&](int i, auto steady) {
#pragma unroll
    for (int r = 0; r < kD; ++r) {
      const int j = i + r;
      if (!steady && r % kSubSteps == 0 && j >= spw) break;  // spw is a multiple of kSubSteps
      if (!kFp8 && (!kStageFlush || r % kSub == 0)) {
        const int sr = kStageFlush ? r / kSub : r;
        if ((steady || j < nvalid) && (j == 0 || j == cnext)) GroupRegs<T>(sbs[sr], sbz[sr], scl, nzm);
        if (j == cnext) cnext += p.gsteps;
      }
      uint32_t wv[4 * C::kWChunks];
#pragma unroll
      for (int cc = 0; cc < C::kWChunks; ++cc) {
        wv[4 * cc] = wb[r][cc].x; wv[4 * cc + 1] = wb[r][cc].y; wv[4 * cc + 2] = wb[r][cc].z; wv[4 * cc + 3] = wb[r][cc].w;
      }
      StepMma<T, NT, kFp8>(wv, xb[r], nzm, !kStageFlush || r % kSub == 0, c, acc);
      if (!kFp8 && (!kStageFlush || r % kSub == kSub - 1)) Flush<NT>(scl, c, acc);
      // Refill kRefill slots at once: a whole stage (2 KB of int4 weights, contiguous per warp)
      // when the ring holds two or more stages, else each slot as soon as it is consumed.
      if (r % kRefill == kRefill - 1) {
        const int jn0 = j - (kRefill - 1) + kD;
        if (steady || jn0 + kRefill <= nfast) {
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_w(jn0 + q, r - (kRefill - 1) + q, std::true_type{});
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_x(jn0 + q, r - (kRefill - 1) + q, std::true_type{});
        } else if (jn0 < spw) {
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_w(jn0 + q, r - (kRefill - 1) + q, std::false_type{});
#pragma unroll
          for (int q = 0; q < kRefill; ++q) load_x(jn0 + q, r - (kRefill - 1) + q, std::false_type{});
        }
      }
    }
    next_pass();
  };
  // Steady passes first, where they paid on the H200 (docs/perf/experiments.md): int4 with stage flush, two token
  // tiles on every plan (8 splits: 14336 x 4096 M = 16 12.02 -> 11.28 µs, M = 12 11.83 -> 11.04, 4096² M = 16 5.18 ->
  // 5.12), one tile on plans of fewer than kMaxSplits
  // splits (4096 x 14336 and 8192² M = 1-8 2.5-5% faster; on 8-split plans, one 512-thread block per SM, 1-4% slower at
  // 14336 x 4096). fp8 lost 0-3% in both forms, and the step-flush instances spilled registers.
  int i = 0;
  if constexpr (!kFp8 && kStageFlush) {
    if (NT > 1 || p.splits < kMaxSplits)
      for (; i + 2 * kD <= nfast; i += kD) pass(i, std::true_type{});
  }
  for (; i < spw; i += kD) pass(i, std::false_type{});

  // ---- sum the warps in QLinearKernel's order ----
  if constexpr (!kEarlyTrigger) ptx::LaunchDependents();  // the next kernel's blocks may start their weight prefetch
  if constexpr (kPaired) {
    PairSum<T, NT>(red, hand, hbar, p, rank, warp, lane, acc);
  } else {
    BlockSum<T, NT, kFp8>(red, p, strip, warp, lane, acc, fsv);
  }
}

// QLinearDirectKernel, as strip pairs where UsePairs allows them (int4 with stage flush).
template <typename T, int NT, bool kFp8, bool kStageFlush>
cudaError_t LaunchQLinearDirect(const QLinearParams& p, const LaunchShape& s, const GemmTuning& t, const DeviceInfo& d,
                                cudaStream_t stream) {
  constexpr bool kCanPair = !kFp8 && kStageFlush;
  const bool pair = kCanPair && UsePairs(s, t, d);
  cudaLaunchConfig_t cfg = {};
  const int strips = (p.N + kWarpN - 1) / kWarpN;
  cfg.gridDim = dim3(pair ? (strips + 1) & ~1 : strips);  // pairs: the packed strips are a multiple of kWarpsN
  cfg.blockDim = dim3(32 * kWarpsK * p.splits);
  // The warps' accumulators; pairs: then rank 0's sums of both strips and an mbarrier.
  cfg.dynamicSmemBytes = (size_t(kWarpsK) * p.splits + (pair ? 2 : 0)) * NT * 8 * 32 * sizeof(float) + (pair ? 8 : 0);
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  AddPdl(&cfg, t, d);
  if (pair) {
    if (t.counts) t.counts->strip_pairs.fetch_add(1, std::memory_order_relaxed);
    cudaLaunchAttribute& a = at[cfg.numAttrs++];
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = 2;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
  }
  // Short warp ranges (two stages or fewer: 4096²) request 2 weight steps before the wait and the rest of the ring
  // after X; longer ones the whole ring first (see the kernel's prologue).
  const bool short_ranges = p.steps_per_warp <= 2 * kSubSteps;
  if constexpr (kCanPair) {
    if (pair)
      return short_ranges ? cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, 2, true>, p)
                          : cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, kDirectMaxDepth, true>, p);
  }
  if (short_ranges) return cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, 2>, p);
  return cudaLaunchKernelEx(&cfg, QLinearDirectKernel<T, NT, kFp8, kStageFlush, kDirectMaxDepth>, p);
}

}  // namespace flashq::gemm::detail
