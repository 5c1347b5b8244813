// W4A16 for M > 16 on sm_90a: the split-K plan of the other kernels (warp ranges of K, fixed-order
// reduction) with the k32 steps on wgmma instead of mma.sync.
//
// Bits: wgmma m64nNk16 with A from registers (the m16n8k16 A-fragment layout) gives exactly the bits of
// chained mma.sync m16n8k16 over the same k16 chunks (bench/results/gemm-probe-h200-2026-11-24.md:
// 0 of 2M outputs differ). So a warpgroup issues, per k32 step and per 16-column half u of its 4 strips,
// the very A fragments StepMma builds (DequantPair of the same packed words and zero points), starts
// every flush unit from zeroed accumulators (mma0), folds the unit into the fp32 sum with Flush's fma,
// and the warp ranges are summed in QLinearKernel's order: (w0 + w1) per split, then the splits in
// order. Row i of Y is bitwise the small-M kernel's (tests compare M = 1..128 with M = 300 and 4096).
//
// Block: 8 strips (256 columns) x one split x a tile of TM tokens (16, 32 or 64: the wgmma N); one wave
// of blocks for the four benchmark shapes. Warpgroup h takes strips 4h..4h+3 (warp w: strip w, rows
// 16w.. of each m64 wgmma; wgmma u covers columns 16u..16u+15 of every strip) and walks the split's two
// warp ranges in turn, parking the first range's sum in shared memory. Both warpgroups read the same X
// tile, so X crosses L2 once per 256 columns (at M = 64 the X tile is twice the bytes of 128 columns
// of int4 weights). Per 4-step stage thread 0 bulk-copies (mbarrier completion) the 8 strips' weights
// (2 KB each, contiguous), the scale blocks of groups that start in the stage, and the X tile, which
// PackXKernel laid out beforehand as the stage's shared-memory image: rows of 64-byte k32 steps in two
// 128B-swizzled 64-channel panels, the 4-byte units of each step permuted so that k16 chunk ks holds
// channels 8t + 4ks + {0..3} where the A fragment of thread t expects them (the packed weights' k order;
// see qlinear_kernel.cuh).
// Limits: sm_90a; int4 only (W8A16 keeps QLinearKernel for M > 16); M per launch <= kMaxRowsPerLaunch.
// Measured: bench/results/ (gemm-nvidia-h200-*.md), numbers in bench/gemm/NOTES.md.
#pragma once

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gemm/qlinear_kernel.cuh"

namespace flashq::gemm::detail {

template <int TM>
struct WgmmaCfg {
  static constexpr int kThreads = 512;                                // 4 warpgroups of 2 strips
  static constexpr int kXBytes = TM * kSubSteps * 64;                 // 4 k32 steps x TM rows x 64 B: 2 panels of 128 B rows
  static constexpr int kWBytes = kWgmmaStrips * kSubSteps * 32 * 16;  // 8 strips x 4 steps x 32 lanes x 16 B
  static constexpr int kSzSlot = kWgmmaStrips * 96;                   // one group's scale blocks of the 8 strips
  static constexpr int kSzBytes = kSubSteps * kSzSlot;                // at most one group start per step
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSzBytes + 1023) / 1024 * 1024;  // 1024: swizzle atoms
  static constexpr int kStages = 4;                                   // a power of two: slot and phase are bit fields
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kParkBytes = kThreads * (TM / 2) * 4;          // the first range's sums, TM / 2 floats per thread
  static constexpr int kBarOffset = kRingBytes + kParkBytes;
  static constexpr int kSmemBytes = kBarOffset + kStages * 8 + 1024;  // + alignment slack
  static constexpr int kCols = kWgmmaStrips * kWarpN;
  static_assert(TM == 16 || TM == 32 || TM == 64, "the wgmma N of the token tile");
  static_assert(kWgmmaStrips == 8 && kThreads == 512, "four warpgroups of 2 strips: warp = (strip, 16-column half)");
  static_assert(size_t(TM) * kCols * 4 <= size_t(kRingBytes), "StoreSplits' cluster tile reuses the ring");
  static_assert(kWBytes % (16 * kThreads) == 0 && kXBytes % (16 * kThreads) == 0 || TM == 16, "cp.async chunks per thread");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Stages of 4 k32 steps of the packed X per TM-row tile: every warp range of the plan, padded with zeros.
inline __host__ __device__ int PackedXStages(const QLinearParams& p) { return kWarpsK * p.splits * (p.steps_per_warp / kSubSteps); }

// X [M][K] -> xpack [m tile][stage][panel][TM rows][128 B]: each stage the wgmma kernel's shared-memory
// image (see the file comment). One thread per (row, k32 step); rows >= M and channels >= K are zeros.
template <int TM>
__global__ void __launch_bounds__(256) PackXKernel(const QLinearParams p) {
  GridDependencyWait();  // X comes from the previous kernel
  LaunchDependents();    // the linear kernel may start its weight copies; it waits for this grid's end
  const int nsteps = PackedXStages(p) * kSubSteps;
  const int m_rows = (p.M + TM - 1) / TM * TM;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m_rows * nsteps) return;
  const int jj = i % nsteps, m = i / nsteps;
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  uint4 in[4];  // channels 32 jj + 8t .. +7
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int k = jj * kStepK + 8 * t;
    in[t] = m < p.M && k < p.K ? LdCached16(static_cast<const uint16_t*>(p.x) + size_t(m) * p.K + k) : zero4;
  }
  const int mt = m / TM, r = m % TM, stage = jj / kSubSteps, s = jj % kSubSteps;
  uint4* dst = static_cast<uint4*>(p.xpack) + ((size_t(mt) * PackedXStages(p) + stage) * 2 + s / 2) * (TM * 8) + r * 8;
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // 16-byte chunk q of the step: k16 chunk q / 2, half q % 2
    auto w = [&](const uint4& v) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; };  // channels 8t + 2q, +1
    dst[((s % 2) * 4 + q) ^ (r & 7)] = make_uint4(w(in[0]), w(in[1]), w(in[2]), w(in[3]));
  }
}

#ifdef FLASHQ_GEMM_TIMELINE
__device__ __forceinline__ unsigned long long GlobalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define FQ_TL(i) if (tid == 0) tl[i] = GlobalNs()
#else
#define FQ_TL(i)
#endif

template <typename T, int TM, bool kStageFlush>
__global__ void __launch_bounds__(WgmmaCfg<TM>::kThreads, 1) QLinearWgmmaKernel(const QLinearParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgmmaCfg<TM>;
  constexpr int NT = TM / 8;  // 8-token tiles (StoreSplits' accumulator layout)
  constexpr int kD = TM / 2;  // wgmma accumulators per thread
  constexpr int S = C::kStages, kThr = C::kThreads;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#ifdef FLASHQ_GEMM_TIMELINE
  unsigned long long tl[8] = {};
  unsigned long long wait_ns = 0;
#endif
  FQ_TL(0);
  // Warp w: strip bs = w / 2 of the block, 16-column half u = w % 2 (rows 16 (w % 4).. of its warpgroup's m64).
  const int bs = warp >> 1, u = warp & 1;
  const int g = lane >> 2;
  const int strip0 = blockIdx.x * kWgmmaStrips;
  const int spw = p.steps_per_warp, nst = spw / kSubSteps;
  const int j0 = blockIdx.y * kWarpsK * spw;  // the split's first k32 step; range r starts at j0 + r * spw
  static_assert(kWarpsK == 2, "a split is two warp ranges");
  const int nvalid0 = min(spw, p.nk32 - j0), nvalid1 = min(spw, p.nk32 - j0 - spw);  // real k32 steps (may be <= 0)
  const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = ring_addr + C::kBarOffset;
  float* park = reinterpret_cast<float*>(smem + C::kRingBytes);
  if (tid == 0) {
    for (int st = 0; st < S; ++st) MbarInit(bar0 + 8 * st, kThr);
    FenceMbarInit();
  }
  __syncthreads();
  static_assert((S & (S - 1)) == 0, "ring slots");
  const int nstages = kWarpsK * nst;
  // Real steps of stage st (0..4): steps past a range's weights read zeros, as in the other kernels.
  auto real_steps = [&](int st) {
    const int jst = st * kSubSteps;
    return max(0, min(kSubSteps, jst < spw ? nvalid0 - jst : nvalid1 - (jst - spw)));
  };
  // Groups: a new group's scale blocks are loaded where a real step starts it (absolute step a multiple of
  // gsteps) and at each range's first real step (QLinearKernel's rule). Tracked incrementally, separately
  // for the copies (issued kStages ahead) and the math.
  const int grp0 = j0 / p.gsteps;
  struct GroupCursor {
    int next;  // absolute k32 step where the next group starts
    const char* sz;  // the 8 strips' scale blocks of the current group
  };
  GroupCursor gi{(grp0 + 1) * p.gsteps, static_cast<const char*>(p.sz) + (size_t(grp0) * p.strips + strip0) * 96};
  int gc_next = gi.next;
  const size_t sz_stride = size_t(p.strips) * 96;

  // Copies: 16-byte cp.async chunks from every thread, at pointers that advance by a stage.
  constexpr int kWPer = C::kWBytes / 16 / kThr;
  constexpr int kXPer = (C::kXBytes / 16 + kThr - 1) / kThr;
  const char* wsrc[kWPer];
  int wstep[kWPer];
#pragma unroll
  for (int i = 0; i < kWPer; ++i) {
    const int ch = tid + i * kThr;
    wstep[i] = (ch / 32) % kSubSteps;
    wsrc[i] = static_cast<const char*>(p.qw) + ((size_t(strip0 + ch / (kSubSteps * 32)) * p.nk32 + j0 + wstep[i]) * 32 + ch % 32) * 16;
  }
  const char* xsrc = static_cast<const char*>(p.xpack) + (size_t(blockIdx.z) * PackedXStages(p) + j0 / kSubSteps) * C::kXBytes + tid * 16;
  // Stage st into slot st % S: weights and scales (independent of the previous kernel) ...
  auto issue_w = [&](int st) {
    const uint32_t base = ring_addr + (st & (S - 1)) * C::kStageBytes;
    const int rs = real_steps(st);
#pragma unroll
    for (int i = 0; i < kWPer; ++i) {
      CpAsync16If(base + C::kXBytes + (tid + i * kThr) * 16, wsrc[i], wstep[i] < rs);
      wsrc[i] += kSubSteps * 512;
    }
#pragma unroll
    for (int s = 0; s < (kStageFlush ? 1 : kSubSteps); ++s) {
      const int j = st * kSubSteps + s;
      const bool boundary = j0 + j == gi.next;
      if (boundary) {
        gi.next += p.gsteps;
        gi.sz += sz_stride;
      }
      if (s < rs && (boundary || j == 0 || j == spw))
        CpAsync16If(base + C::kXBytes + C::kWBytes + s * C::kSzSlot + tid * 16, gi.sz + tid * 16, tid < C::kSzSlot / 16);
    }
  };
  // ... then X, and this thread's arrival on the slot's barrier once its copies so far have landed.
  auto issue_x = [&](int st) {
    const uint32_t base = ring_addr + (st & (S - 1)) * C::kStageBytes;
#pragma unroll
    for (int i = 0; i < kXPer; ++i)
      CpAsync16If(base + (tid + i * kThr) * 16, xsrc + size_t(st) * C::kXBytes + i * kThr * 16, tid + i * kThr < C::kXBytes / 16);
    CpAsyncMbarArrive(bar0 + 8 * (st & (S - 1)));
  };
  for (int st = 0; st < min(S, nstages); ++st) issue_w(st);
  FQ_TL(1);
  GridDependencyWait();  // X is PackXKernel's output
  FQ_TL(2);
  for (int st = 0; st < min(S, nstages); ++st) issue_x(st);

  float acc[NT][1][4];  // StoreSplits' layout (one 16-column half per warp): acc[nt][0][e] += scale * c[4 nt + e]
  float c[kD];          // the flush unit's partial: the m64 x TM wgmma accumulator
  float scl[2] = {0.0f, 0.0f};  // the group's scales and -(magic + zero) of this warp's columns g and g + 8
  uint32_t nzm[2] = {0u, 0u};
  uint32_t a[2][2][4];  // A fragments [buffer][ks]: wgmma reads them asynchronously
#pragma unroll
  for (int i = 0; i < 16; ++i) (&a[0][0][0])[i] = 0u;
#pragma unroll
  for (int i = 0; i < kD; ++i) c[i] = 0.0f;  // defined before the first wgmma (which ignores them)
  auto zero_acc = [&]() {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][0][e] = 0.0f;
  };
  // The A fragments stay live (in their own registers) until the wait that retires the wgmmas reading them:
  // if the compiler reused them, ptxas would serialize every wgmma (C7517/C7519).
  auto fence_a = [&](int b) {
#pragma unroll
    for (int i = 0; i < 8; ++i) RegFence((&a[b][0][0])[i]);
  };
  auto flush = [&]() {
    WgmmaWait<0>();
    fence_a(0);
    fence_a(1);
#pragma unroll
    for (int i = 0; i < kD; ++i) RegFence(c[i]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][0][e] = fmaf(scl[e >> 1], c[4 * nt + e], acc[nt][0][e]);
  };
  zero_acc();
  // wgmma descriptors: one base, constant offsets (X panel s / 2, step s % 2, k16 chunk ks) plus the slot's.
  const uint64_t desc0 = SmemDesc(ring_addr, 16, 1024);
  // This warp's weights (half u of its strip's 16 bytes per lane) and scale block inside a stage.
  const int w_off = C::kXBytes + bs * (kSubSteps * 512) + lane * 16 + u * 8;
  const int sz_off = C::kXBytes + C::kWBytes + bs * 96;

  for (int st = 0; st < nstages; ++st) {
    const int slot = st & (S - 1);
#ifdef FLASHQ_GEMM_TIMELINE
    const unsigned long long tw0 = GlobalNs();
#endif
    MbarWait(bar0 + 8 * slot, (st / S) & 1);
#ifdef FLASHQ_GEMM_TIMELINE
    wait_ns += GlobalNs() - tw0;
    if (st == 0) FQ_TL(3);
#endif
    FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    const unsigned char* sb = smem + slot * C::kStageBytes;
    const uint64_t dslot = desc0 + uint64_t((slot * C::kStageBytes) >> 4);
    const int rs = real_steps(st);
#pragma unroll
    for (int s = 0; s < kSubSteps; ++s) {
      const int j = st * kSubSteps + s;
      if (!kStageFlush || s == 0) {
        const bool boundary = j0 + j == gc_next;
        if (boundary) gc_next += p.gsteps;
        if (s < rs && (boundary || j == 0 || j == spw)) {
          const unsigned char* blk = sb + sz_off + s * C::kSzSlot;
          float sc4[4];
          uint32_t nz4[4];
          GroupRegs<T>(reinterpret_cast<const uint2*>(blk)[g], reinterpret_cast<const uint32_t*>(blk + 64)[g], sc4, nz4);
          scl[0] = u ? sc4[2] : sc4[0];
          scl[1] = u ? sc4[3] : sc4[1];
          nzm[0] = u ? nz4[2] : nz4[0];
          nzm[1] = u ? nz4[3] : nz4[1];
        }
      }
      const uint2 wq = s < rs ? *reinterpret_cast<const uint2*>(sb + w_off + s * 512) : make_uint2(0u, 0u);
      const int b = s & 1;
      if (kStageFlush && s >= 2) {  // step s - 2's wgmmas read a[b]: wait for them before it is rewritten
        WgmmaWait<1>();
        fence_a(b);
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {  // StepMma's A fragments of half u
        a[b][ks][0] = DequantPair<T>(wq.x, 2 * ks, nzm[0]);
        a[b][ks][1] = DequantPair<T>(wq.y, 2 * ks, nzm[1]);
        a[b][ks][2] = DequantPair<T>(wq.x, 2 * ks + 1, nzm[0]);
        a[b][ks][3] = DequantPair<T>(wq.y, 2 * ks + 1, nzm[1]);
      }
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        // A flush unit starts from zero (mma0): scale-d = 0 on its first k16 chunk (+0 and -0 partials give the
        // same fma into the fp32 sum, which starts at +0).
        const int acc_in = ks > 0 || (kStageFlush && s > 0) ? 1 : 0;
        const uint64_t desc = dslot + uint64_t(((s / 2) * (TM * 128) + (s % 2) * 64 + ks * 32) >> 4);
        Wgmma<TM, std::is_same_v<T, __nv_bfloat16>>::template RS<false>(c, a[b][ks], desc, acc_in);
      }
      WgmmaCommit();
      if (!kStageFlush || s == kSubSteps - 1) flush();
    }
    if (st == nst - 1) {  // end of the first range: park its sums, start the second from zero
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) park[(nt * 4 + e) * kThr + tid] = acc[nt][0][e];
      zero_acc();
    }
    __syncthreads();  // every warp is done with the slot (wgmmas waited, loads issued): refill it
    if (st + S < nstages) {
      issue_w(st + S);
      issue_x(st + S);
    }
  }
  // (w0 + w1): the first range's sum plus the second's, as QLinearKernel adds its two K-warps.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][0][e] = park[(nt * 4 + e) * kThr + tid] + acc[nt][0][e];
  FQ_TL(4);
  LaunchDependents();
  StoreSplits<T, NT, 1, C::kCols, 2>(p, acc, reinterpret_cast<float*>(smem), true, bs * kWarpN + 16 * u, int(blockIdx.z) * TM);
#ifdef FLASHQ_GEMM_TIMELINE
  FQ_TL(5);
  if (tid == 0 && (blockIdx.x == 0 || blockIdx.x == gridDim.x - 1) && (blockIdx.y == 0 || blockIdx.y == gridDim.y - 1))
    printf("TL blk(%d,%d) stages %d: prologue %.2f griddep %.2f first-data %.2f loop %.2f (waits %.2f) store+tail %.2f us; start %llu\n",
           blockIdx.x, blockIdx.y, nstages, (tl[1] - tl[0]) * 1e-3, (tl[2] - tl[1]) * 1e-3, (tl[3] - tl[2]) * 1e-3,
           (tl[4] - tl[3]) * 1e-3, wait_ns * 1e-3, (tl[5] - tl[4]) * 1e-3, tl[0] % 1000000000ull);
#endif
#else
  __trap();
#endif
}

template <typename T, int TM, bool kStageFlush>
cudaError_t LaunchQLinearWgmma(const QLinearParams& p, cudaStream_t stream) {
  using C = WgmmaCfg<TM>;
  const int m_tiles = (p.M + TM - 1) / TM;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t pack = {};
  const long threads = long(m_tiles) * TM * PackedXStages(p) * kSubSteps;
  pack.gridDim = dim3(unsigned((threads + 255) / 256));
  pack.blockDim = dim3(256);
  pack.stream = stream;
  pack.attrs = at;
  pack.numAttrs = 1;
  cudaError_t e = cudaLaunchKernelEx(&pack, PackXKernel<TM>, p);
  if (e != cudaSuccess) return e;
  auto* kernel = QLinearWgmmaKernel<T, TM, kStageFlush>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);  // per device
  if (e != cudaSuccess) return e;
  QLinearParams q = p;
  q.cluster = UseCluster(p.splits) ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.N + C::kCols - 1) / C::kCols, p.splits, m_tiles);
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  if (q.cluster) {
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = 1;
    at[1].val.clusterDim.y = p.splits;
    at[1].val.clusterDim.z = 1;
    cfg.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&cfg, kernel, q);
}


}  // namespace flashq::gemm::detail
