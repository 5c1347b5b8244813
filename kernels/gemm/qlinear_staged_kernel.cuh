// Small-M W4A16 for 8-split plans on sm_90, M <= 8 (one 8-token tile): QLinearDirectKernel's blocks, warp ranges,
// arithmetic and sum, with the strip's weights and X brought into shared memory by bulk copies, so that each warp
// dequantizes its first stage before X has arrived. Its fp8 form (W8A16, 4096²) is further below.
//
// Why: an 8-split plan runs one 512-thread block per SM (4096² on the H200), whose 16 warps leave the shared memory
// idle. Every step's dequantization, about two thirds of a step's instructions, depends only on the weights, which
// stream in before griddepcontrol.wait; X only after it. QLinearDirectKernel keeps both in one register ring, so its
// warps dequantize only once X is there, and the whole issue-bound compute sits after X on the call's critical path
// (a timing probe of the 4096² call: 0.8 µs launch, wait and exit, 1.7 µs of compute alone;
// docs/perf/gemm.md). Here each warp's lane 0 requests the warp's own weights by bulk
// copies, a stage per mbarrier, and after the wait the warp's lanes copy its columns of X (16 bytes per copy); the
// warp dequantizes stage 0 into registers, then waits for X. No thread issues another warp's copies, and no block
// barrier comes before the sum: the first form of this kernel, with thread 0 issuing all of the block's copies, ran
// 1.9 µs slower than the direct kernel. This form took 4096² M = 4 from 4.87 to 4.62 µs and M = 8
// from 5.14 to 4.85 against the direct kernel (docs/perf/experiments.md).
//
// Only stage 0's weights are requested before griddepcontrol.wait; lane 0 requests the other stages after the warp's
// X copies. An SM's requests come back roughly in the order it made them, so X, requested last, had landed only with
// the last weights (1.5-1.8 µs after the wait at 4096² M = 4, a %globaltimer probe) and held up all of the compute
// that needs it. 4096²: M = 1 4.20 -> 4.02 µs, M = 4 4.63 -> 4.08, M = 8 4.89 -> 4.47 (H200).
// Measured: docs/perf/experiments.md (the staged kernel's lines).
// Launches of at most GemmTuning::staged_dequant_first_rows rows dequantize before griddepcontrol.wait (see the kernel).
//
// Bits: the same DequantPair values, the same mma chains per flush unit from zero (Mma0), Flush's fma, and the same
// block sum as QLinearDirectKernel; weight steps past the strip's K and X columns past K read zeros, as that kernel
// loads them. So row i of Y is bitwise the small-M kernel's for any M (GPU test W4A16StagedKernelKeepsTheBits).
// Limits (StagedApplies in dispatch.cc): int4 with stage flush, M <= kStagedMaxRows, plans of kMaxSplits splits
// with at most kStagedMaxStages stages per warp range, K % 8 == 0 (16-byte rows of X), and the weights plus X within
// the block's shared memory.
#pragma once

#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/loads.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/qlinear_direct_kernel.cuh"
#include "kernels/gemm/qlinear_fragment.cuh"

namespace flashq::gemm::detail {

// Shared memory: the strip's weight steps [0, warps * spw) as in global memory (512 bytes each), then X rows 0..M-1
// of warps * spw * 32 columns each (columns past K zero), 64 bytes apart beyond 128-byte multiples so that the two
// rows of a quarter warp's 16-byte reads fall in different banks; then each warp's mbarriers (X, weight stage 0, 1,
// ...). A warp copies, waits for and reads only its own steps and columns: no block barrier before the sum.
// dequant_first: the order of a launch (see the kernel).
struct StagedLayout {
  uint32_t w_bytes = 0, x_stride = 0, bars = 0, total = 0;
  bool dequant_first = false;
};
constexpr uint32_t kStagedBarBytes = 8u * (1 + kStagedMaxStages);  // a warp's mbarriers
inline StagedLayout StagedLayoutFor(const QLinearParams& p, const GemmTuning& t) {
  StagedLayout l;
  const uint32_t warps = uint32_t(kWarpsK) * p.splits, steps = warps * p.steps_per_warp;
  l.w_bytes = steps * 512u;
  l.x_stride = steps * kStepK * 2u + 64u;
  l.bars = l.w_bytes + uint32_t(p.M) * l.x_stride;
  l.total = l.bars + warps * kStagedBarBytes;
  l.dequant_first = p.M <= t.staged_dequant_first_rows;
  return l;
}


template <typename T>
__global__ void __launch_bounds__(kDirectMaxThreads, 1) QLinearStagedKernel(const QLinearParams p, const StagedLayout l) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NT = 1;  // one 8-token tile (kStagedMaxRows)
  extern __shared__ __align__(128) uint4 staged_smem[];
  ptx::LaunchDependents();  // as the int4 small-M kernel: the next kernel may start its weight prefetch at once
  const int lane = threadIdx.x & 31;
  // The warp index through a shuffle: ptxas then knows that it is the same in every lane, and keeps the copies'
  // addresses in uniform registers (no loop over the lanes around each bulk copy and barrier init).
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x >> 5), 0);
  const int g = lane >> 2, t = lane & 3;
  const int strip = blockIdx.x;
  const int spw = p.steps_per_warp, nst = spw / kSubSteps;
  const int j0 = warp * spw;
  const int nvalid = min(spw, p.nk32 - j0);  // real k32 steps of this warp (may be <= 0)
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(staged_smem));
  const uint32_t wbase = base + uint32_t(j0) * 512u;           // the warp's weight steps
  const uint32_t xs0 = base + l.w_bytes + uint32_t(j0) * 64u;  // its columns of X row 0
  const uint32_t bar_x = base + l.bars + uint32_t(warp) * kStagedBarBytes;
  auto bar_w = [&](int s) { return bar_x + 8u * (1 + s); };

  // Scale blocks of the stages where a group starts (stage flush: groups are whole stages), bit s of `fresh`: first,
  // as their loads are the longest wait before stage 0.
  uint2 sbs[kStagedMaxStages];
  uint32_t sbz[kStagedMaxStages];
  uint32_t fresh = 0;
  {
    const int grp = j0 / p.gsteps;
    int gnext = (grp + 1) * p.gsteps - j0;  // the next group start, relative to j0
    const char* szp = static_cast<const char*>(p.sz) + (size_t(grp) * p.strips + strip) * kSzBlockBytes;
#pragma unroll
    for (int s = 0; s < kStagedMaxStages; ++s) {
      const int j = kSubSteps * s;
      if (s < nst && j < nvalid) {
        const bool start = j == gnext;
        if (start) {
          szp += size_t(p.strips) * kSzBlockBytes;
          gnext += p.gsteps;
        }
        if (start || j == 0) {
          sbs[s] = __ldg(reinterpret_cast<const uint2*>(szp) + g);
          sbz[s] = __ldg(reinterpret_cast<const uint32_t*>(szp + kSzZeros) + g);
          fresh |= 1u << s;
        }
      }
    }
  }

  // Zeros where QLinearDirectKernel loads zeros: the warp's steps past nk32, its X columns past K (chunks of 8).
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  for (int i = max(nvalid, 0) * 32 + lane; i < spw * 32; i += 32) staged_smem[(wbase - base) / 16 + i] = zero4;
  const int xk = max(0, min(spw * kStepK, p.K - j0 * kStepK));  // the warp's columns of X inside K
  if (xk < spw * kStepK)
    for (int m = 0; m < p.M; ++m)
      for (int c = xk / 8 + lane; c < spw * 4; c += 32) staged_smem[(xs0 - base + m * l.x_stride) / 16 + c] = zero4;

  // Lane 0: the warp's barriers (X: an arrival per lane), then stage 0 of its weights; a stage per barrier (a stage
  // past nk32 completes with no bytes).
  const char* wsrc = static_cast<const char*>(p.qw) + (size_t(strip) * p.nk32 + j0) * 512;
  auto copy_stages = [&](int s0, int s1) {  // lane 0: stages [s0, s1) of the warp's weights
#pragma unroll
    for (int s = 0; s < kStagedMaxStages; ++s) {
      if (s >= s0 && s < s1 && s < nst) {
        const uint32_t bytes = uint32_t(max(0, min(kSubSteps, nvalid - kSubSteps * s))) * 512u;
        ptx::MbarArriveExpectTx(bar_w(s), bytes);
        if (bytes) ptx::BulkCopy(wbase + uint32_t(s) * 2048u, wsrc + s * 2048, bytes, bar_w(s));
      }
    }
  };
  if (lane == 0) {
    ptx::MbarInit(bar_x, 32);
#pragma unroll
    for (int s = 0; s < kStagedMaxStages; ++s) ptx::MbarInit(bar_w(s), 1);
    ptx::FenceMbarInitCluster();
    copy_stages(0, 1);
  }
  __syncwarp();  // every lane sees the barriers and reads the zeros of every lane

  // The wait for the previous kernel, then X: rows 0..M-1 of the warp's columns, 16 bytes per lane and copy, each
  // lane's copies arriving on the X barrier (many small copies from all lanes issue faster than a bulk copy per row
  // from one), then the other stages of the weights.
  auto wait_and_copy_x = [&] {
    ptx::GridDependencyWait();
    const T* xsrc = static_cast<const T*>(p.x) + j0 * kStepK;
    for (int m = 0; m < p.M; ++m)
      for (int c = lane; c < xk / 8; c += 32)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(xs0 + uint32_t(m) * l.x_stride + uint32_t(c) * 16u),
                     "l"(xsrc + size_t(m) * p.K + c * 8)
                     : "memory");
    ptx::CpAsyncMbarArrive(bar_x);
    if (lane == 0) copy_stages(1, kStagedMaxStages);  // behind X (see the header)
  };
  // Stage 0 is dequantized into registers before X is waited for. With one row (dequant_first), X arrives soon after
  // the wait, and the dequantization goes before the wait, overlapping the previous kernel's last blocks; with more,
  // X takes longer from L2 (every block reads all of it), and the wait and copies go first, so that the
  // dequantization overlaps X's arrival (H200, 4096²: dequantization first 4.09 -> 4.02 µs at M = 1, but
  // 4.03 -> 4.18 at M = 2).
  if (!l.dequant_first) wait_and_copy_x();

  float acc[NT][2][4], c[NT][2][4];
  ZeroAcc<NT>(acc);
  float scl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint32_t nzm[4] = {0u, 0u, 0u, 0u};
  // Lane (g, t) reads its weight words at step j, and X row 8nt + g (rows past M read row M - 1) at k 8t..8t+7.
  const uint32_t wrow = wbase + uint32_t(lane) * 16u;
  uint32_t xrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xrow[nt] = xs0 + uint32_t(min(nt * 8 + g, p.M - 1)) * l.x_stride + uint32_t(8 * t) * 2u;

  // Stage 0: A fragments before X. The wait for X takes its address from every fragment (times a runtime zero), so
  // that ptxas cannot sink the dequantization past it.
  ptx::MbarWaitAsmLoop(bar_w(0), 0);
  if (fresh & 1u) GroupRegs<T>(sbs[0], sbz[0], scl, nzm);
  uint32_t a[kSubSteps][2][2][4];
  uint32_t dep = 0;
#pragma unroll
  for (int r = 0; r < kSubSteps; ++r) {
    const uint4 w = ptx::LdShared16(wrow + uint32_t(r) * 512u);
    const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        a[r][ks][u][0] = DequantPair<T>(wv[2 * u], 2 * ks, nzm[2 * u]);
        a[r][ks][u][1] = DequantPair<T>(wv[2 * u + 1], 2 * ks, nzm[2 * u + 1]);
        a[r][ks][u][2] = DequantPair<T>(wv[2 * u], 2 * ks + 1, nzm[2 * u]);
        a[r][ks][u][3] = DequantPair<T>(wv[2 * u + 1], 2 * ks + 1, nzm[2 * u + 1]);
        dep ^= a[r][ks][u][0] ^ a[r][ks][u][1] ^ a[r][ks][u][2] ^ a[r][ks][u][3];
      }
  }
  const uint32_t dep0 = dep & (uint32_t(p.M) >> 16);  // 0 (M <= kMaxRowsPerLaunch), but only known at run time
  if (l.dequant_first) {
    // ptxas sinks arithmetic below griddepcontrol.wait, even when the wait names it as an operand, but not below a
    // shared-memory store that needs it: one that never happens.
    if (dep0) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(bar_x), "r"(dep) : "memory");
    wait_and_copy_x();
  }
  ptx::MbarWaitAsmLoop(bar_x + dep0, 0);
#pragma unroll
  for (int r = 0; r < kSubSteps; ++r) {
    uint4 xv[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xv[nt] = ptx::LdShared16(xrow[nt] + uint32_t(r) * (kStepK * 2u));
    // StepMma's mma order: k16 half ks, then 16-column half u, then token tile.
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t b0 = ks ? xv[nt].z : xv[nt].x, b1 = ks ? xv[nt].w : xv[nt].y;
          if (ks == 0 && r == 0) Mma0<T>(c[nt][u], a[r][ks][u], b0, b1);
          else Mma<T>(c[nt][u], a[r][ks][u], b0, b1);
        }
  }
  Flush<NT>(scl, c, acc);

  // The other stages: StepMma as QLinearDirectKernel runs it (unrolled: the scale registers are indexed by constants).
#pragma unroll
  for (int s = 1; s < kStagedMaxStages; ++s) {
    if (s >= nst) break;
    ptx::MbarWaitAsmLoop(bar_w(s), 0);
    if (fresh & (1u << s)) GroupRegs<T>(sbs[s], sbz[s], scl, nzm);
#pragma unroll
    for (int r = 0; r < kSubSteps; ++r) {
      const int j = kSubSteps * s + r;
      const uint4 w = ptx::LdShared16(wrow + uint32_t(j) * 512u);
      const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
      uint4 xv[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xv[nt] = ptx::LdShared16(xrow[nt] + uint32_t(j) * (kStepK * 2u));
      StepMma<T, NT, false>(wv, xv, nzm, r == 0, c, acc);
    }
    Flush<NT>(scl, c, acc);
  }

  __syncthreads();  // every warp is done with its weights: their space takes the block's sum
  const float unused[1] = {1.0f};
  BlockSum<T, NT, false>(reinterpret_cast<float*>(staged_smem), p, strip, warp, lane, acc, unused);
#endif
}

// ---------------------------------------------------------------------------------------------
// The fp8 form (W8A16, M <= kStagedMaxRows, 8-split plans whose 16 warp ranges are kStagedFp8Steps k32 steps each, all
// inside the weights: K in (4064, 4096]). The strip's weights come into shared memory by bulk copies of kFp8StageSteps
// steps, one mbarrier each, issued by each warp's lane 0 for its own range: stage 0 before griddepcontrol.wait,
// stage 1 after the warp has requested its X. X goes straight into registers, all 8 steps at once (the weights no
// longer take the register ring), so no request of the call waits for a ring slot to be consumed, as the later steps
// of QLinearDirectKernel's 4-step fp8 ring do. H200, 4096²: M = 1 5.94 -> 5.42 µs, M = 4 6.01 -> 5.57, M = 8 6.12 ->
// 5.93. Two token tiles (X in 64 registers) ran 0.1-0.25 µs slower than QLinearDirectKernel at M = 12-16, and
// 2-step copies, no copy before the wait, or X requested a stage or two ahead of its use were slower at every M
// (docs/perf/experiments.md).
// Bits: StepMma over the range's steps in order, from zero accumulators, with zero X past K, then BlockSum:
// QLinearDirectKernel's arithmetic, so row i of Y is bitwise the small-M kernel's for any M (GPU test
// W8A16StagedKernelKeepsTheBits).
// ---------------------------------------------------------------------------------------------
constexpr int kFp8StageSteps = 4;        // k32 steps per bulk copy
constexpr uint32_t kFp8StepBytes = 1024;  // a step of a strip's fp8 weights: 2 chunks x 32 lanes x 16 bytes
// Shared memory: the strip's weights (the block sum's accumulators take the same space after them), then each warp's
// mbarriers, from byte kStagedFp8Bars.
constexpr uint32_t kStagedFp8Bars = kWarpsK * kMaxSplits * kStagedFp8Steps * kFp8StepBytes;
constexpr uint32_t kStagedFp8Bytes = kStagedFp8Bars + kWarpsK * kMaxSplits * 8u * (kStagedFp8Steps / kFp8StageSteps);
static_assert(kWarpsK * kMaxSplits * 8 * 32 * sizeof(float) <= kStagedFp8Bars, "the block sum fits in the weights' space");

template <typename T>
__global__ void __launch_bounds__(kDirectMaxThreads, 1) QLinearStagedFp8Kernel(const QLinearParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NT = 1;  // one 8-token tile (kStagedMaxRows)
  constexpr int kStages = kStagedFp8Steps / kFp8StageSteps;
  constexpr uint32_t kStageBytes = kFp8StageSteps * kFp8StepBytes;
  extern __shared__ __align__(128) uint4 staged_smem[];
  const int lane = threadIdx.x & 31;
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x >> 5), 0);  // uniform registers (see QLinearStagedKernel)
  const int g = lane >> 2, t = lane & 3;
  const int strip = blockIdx.x;
  const int j0 = warp * kStagedFp8Steps;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(staged_smem));
  const uint32_t wbase = base + uint32_t(j0) * kFp8StepBytes;  // the warp's weight steps
  const uint32_t bar0 = base + kStagedFp8Bars + uint32_t(warp) * (8u * kStages);
  constexpr int kOutIter = NT * 8 * 32 / 64;
  float fsv[kOutIter];
  Fp8OutScales<T, NT>(p, strip, fsv);

  const char* wsrc = static_cast<const char*>(p.qw) + (size_t(strip) * p.nk32 + j0) * kFp8StepBytes;
  auto copy_stage = [&](int s) {  // lane 0: stage s of the warp's weights
    ptx::MbarArriveExpectTx(bar0 + 8u * s, kStageBytes);
    ptx::BulkCopy(wbase + uint32_t(s) * kStageBytes, wsrc + s * kStageBytes, kStageBytes, bar0 + 8u * s);
  };
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) ptx::MbarInit(bar0 + 8u * s, 1);
    ptx::FenceMbarInitCluster();
    copy_stage(0);
  }
  __syncwarp();  // every lane sees the barriers

  // After the wait: X, token rows 8nt + g (rows past M read row M - 1: their outputs are never stored), k 8t..8t+7 of
  // each step, zeros past K; then the other stages of the weights, behind X.
  ptx::GridDependencyWait();
  const int xk0 = j0 * kStepK + 8 * t;
  uint4 xb[kStagedFp8Steps][NT];
#pragma unroll
  for (int r = 0; r < kStagedFp8Steps; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      xb[r][nt] = xk0 + r * kStepK < p.K
                      ? ptx::LdCached16(static_cast<const T*>(p.x) + size_t(min(nt * 8 + g, p.M - 1)) * p.K + xk0 + r * kStepK)
                      : make_uint4(0u, 0u, 0u, 0u);
  if (lane == 0) {
#pragma unroll
    for (int s = 1; s < kStages; ++s) copy_stage(s);
  }

  float acc[NT][2][4];
  ZeroAcc<NT>(acc);
  const uint32_t nzm[4] = {0u, 0u, 0u, 0u};  // unused by fp8
  float c[NT][2][4];                          // unused by fp8
  const uint32_t wrow = wbase + uint32_t(lane) * 16u;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    ptx::MbarWaitAsmLoop(bar0 + 8u * s, 0);
#pragma unroll
    for (int r = 0; r < kFp8StageSteps; ++r) {
      const int j = kFp8StageSteps * s + r;
      const uint4 w0 = ptx::LdShared16(wrow + uint32_t(j) * kFp8StepBytes), w1 = ptx::LdShared16(wrow + uint32_t(j) * kFp8StepBytes + 512u);
      const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      StepMma<T, NT, true>(wv, xb[j], nzm, false, c, acc);
    }
  }

  ptx::LaunchDependents();  // as QLinearDirectKernel's fp8 path: after the main loop
  __syncthreads();     // every warp is done with its weights: their space takes the block's sum
  BlockSum<T, NT, true>(reinterpret_cast<float*>(staged_smem), p, strip, warp, lane, acc, fsv);
#endif
}

// Launches staged kernel kKernel with `bytes` of shared memory, once its limit is raised to the device's opt-in
// maximum (once per kernel and device, not per launch); cudaErrorNotSupported, with nothing launched, where the block's
// shared memory cannot hold `bytes`.
template <auto kKernel, typename... Args>
cudaError_t LaunchStagedKernel(const QLinearParams& p, uint32_t bytes, const GemmTuning& t, const DeviceInfo& d,
                               cudaStream_t stream, const Args&... args) {
  static std::atomic<int> optin[kMaxDevices] = {};  // the opt-in bytes + 1, once set
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= kMaxDevices) return cudaErrorNotSupported;
  int most = optin[dev].load(std::memory_order_acquire) - 1;
  if (most < 0) {
    cudaError_t e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
    if (e != cudaSuccess) return e;
    optin[dev].store(most + 1, std::memory_order_release);
  }
  if (bytes > uint32_t(most)) return cudaErrorNotSupported;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.N + kWarpN - 1) / kWarpN);
  cfg.blockDim = dim3(32 * kWarpsK * p.splits);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[1];
  cfg.attrs = at;
  AddPdl(&cfg, t, d);
  if (t.counts) t.counts->staged.fetch_add(1, std::memory_order_relaxed);
  return cudaLaunchKernelEx(&cfg, kKernel, args...);
}

// A launch that StagedApplies (dispatch.h) takes: cudaErrorNotSupported (nothing launched) where the block's shared
// memory cannot hold it; the caller then takes QLinearDirectKernel.
template <typename T, bool kFp8>
cudaError_t LaunchQLinearStaged(const QLinearParams& p, const GemmTuning& t, const DeviceInfo& d, cudaStream_t stream) {
  if constexpr (kFp8) {
    return LaunchStagedKernel<QLinearStagedFp8Kernel<T>>(p, kStagedFp8Bytes, t, d, stream, p);
  } else {
    static_assert(kStagedMaxRows <= 8, "the staged kernel runs one 8-token tile");
    const StagedLayout l = StagedLayoutFor(p, t);
    return LaunchStagedKernel<QLinearStagedKernel<T>>(p, l.total, t, d, stream, p, l);
  }
}

}  // namespace flashq::gemm::detail
