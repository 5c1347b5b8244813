// QLinearKernel, the 32-token split-K kernel (M > 16): a block is 4 strips x 2 warp ranges with one block-wide
// cp.async pipeline (kStages deep, one barrier per stage, one copy of the X tile for the 4 N-warps); blocks split K
// further (grid.y = splits) and the last block of a tile (atomic ticket) sums the fp32 partials in order, or on sm_90
// a 2-split plan runs as a 2-block cluster that sums over distributed shared memory. Programmatic dependent launch on
// sm_90 (weights prefetched before griddepcontrol.wait). Arithmetic and layouts: qlinear_fragment.cuh.
// Limits: M per launch <= kMaxRowsPerLaunch.
// Measured: bench/results/gemm-nvidia-h200.md (design and bounds in docs/perf/gemm.md).
#pragma once

#include <type_traits>

#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/cp_async.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/gemm/device_info.cuh"
#include "kernels/gemm/qlinear_fragment.cuh"

namespace flashq::gemm::detail {

template <bool kFp8, int NT, bool kStageFlush, bool kMulti>
struct Cfg {
  static constexpr int kWarps = kThreads / 32;
  // k32 steps per warp per pipeline stage: int4 4 (one stage = one g128 group, half the
  // per-byte loop overhead of 2), fp8 2 (its stages are twice the bytes). Both divide the plan's
  // kSubSteps-granular warp ranges.
  static constexpr int kSub = kFp8 ? 2 : kSubSteps;
  static_assert(kSubSteps % kSub == 0, "a warp's K range must be whole stages");
  // Blocks per SM: bytes in flight per SM = blocks * (stages in flight) * weight bytes per stage.
  // (Measured on H200: ~2 blocks per SM with deep stages beat 3 with shallow ones.)
  static constexpr int kMinBlocks = 2;
  static constexpr int kWChunks = kFp8 ? 2 : 1;  // uint4 of weights per lane per k32 step
  static constexpr int kW = kWarps * kSub * kWChunks * 32;        // uint4 per stage [warp][ss][c][lane]
  static constexpr int kXRows = 8 * NT;                                // tokens per block
  static constexpr int kX = kWarpsK * kSub * kXRows * 4;          // uint4 per stage [kg][ss][row][4]
  static constexpr int kXPer = (kX + kThreads - 1) / kThreads;        // X chunks per thread per stage
  // Scales + zeros: one 96-byte block per warp per group change (at most once per stage with
  // the stage flush, once per k32 step without).
  static constexpr int kSZ = kFp8 ? 0 : kWarps * (kStageFlush ? 1 : kSub) * kSzChunks;
  static constexpr int kStage = kW + kX + kSZ;                         // uint4 per stage
  static constexpr int kStages = kFp8 ? 4 : 3;  // measured for NT = 4 (the only instantiation)
  // pair_done's K-warp sum runs in rounds of kRedNT token tiles: half the tile where that fits beside the stages.
  static constexpr size_t kPipe = size_t(kStages) * kStage * 16;
  static constexpr size_t kRedRound = size_t(kWarpsN) * 8 * 32 * 4;  // one token tile of the N-warps' accumulators
  static constexpr int kRedNT = (kPipe + kRedRound * (NT / 2)) * kMinBlocks <= 227 * 1024 - kMinBlocks * 2048 ? NT / 2 : 1;
  static constexpr size_t kBytes = kPipe + (kMulti ? kRedRound * kRedNT : 0);
  static_assert(kX % kThreads == 0 || kX < kThreads, "X tile chunks split evenly over the block");
  static_assert(kBytes >= size_t(kWarpsN) * NT * 8 * 32 * 4 + size_t(NT) * 8 * kBlockN * 4,
                "the K-warp reduction and the cluster tile reuse the pipeline buffer");
  static_assert(kBytes * kMinBlocks <= 227 * 1024 - kMinBlocks * 1024, "blocks per SM must fit in shared memory");
};

// Roles are swapped (Yᵀ = W · Xᵀ): the mma's A operand is 16 output columns of W (dequantized
// straight into the A fragment registers), its B operand is 8 tokens of X, so M <= 8 costs
// one n8 tile instead of a mostly empty m16 tile and no register shuffles are needed.
// kStageFlush (int4, groups of a multiple of kSub k32 steps): the fp32 scale is applied once
// per pipeline stage instead of once per k32 step; a property of the weights, not of M.
// p.cluster (sm_90 launches only): the split-K blocks of a tile form one cluster and reduce
// through distributed shared memory instead of the fp32 workspace and an atomic ticket.
template <typename T, int NT, bool kFp8, bool kStageFlush, bool kMulti>
__global__ void __launch_bounds__(kThreads, (Cfg<kFp8, NT, kStageFlush, kMulti>::kMinBlocks)) QLinearKernel(const QLinearParams p) {
  using C = Cfg<kFp8, NT, kStageFlush, kMulti>;
  constexpr int kXPer = C::kXPer;
  // 1024-byte aligned pipeline buffer: with the default alignment (16 bytes past the static s_last) the kernel
  // was 25-45% slower at M = 32-128, int4 and fp8 alike, on the H200 (docs/perf/experiments.md).
  extern __shared__ __align__(1024) uint4 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = warp / kWarpsN, nw = warp % kWarpsN;
  const int g = lane >> 2, t = lane & 3;
  // Grid (token tiles, splits, column blocks): the token tiles of one column block and split are
  // neighbours in launch order, so they run together and all but the first find the weights in L2.
  const int cblock = blockIdx.z, mtile = blockIdx.x;
  const int strip = cblock * kWarpsN + nw;
  const int npairs = kMulti ? p.pairs : 1;  // splits (warp range pairs) this block runs, one after another
  const int pair0 = blockIdx.y * npairs;     // the first of them
  const int m0 = mtile * C::kXRows;
  const int spw = p.steps_per_warp;
  const int nst = spw / C::kSub;  // pipeline stages per pair, the same for every warp of the block
  const int ntot = nst * npairs;
  auto j0_of = [&](int q) { return ((pair0 + q) * kWarpsK + kw) * spw; };  // first k32 step of pair q's range
  const int j0 = j0_of(0);
  int nvalid = min(spw, p.nk32 - j0);  // producer: this warp's real k32 steps in the pair it issues (may be <= 0)
  int nvalid_c = nvalid;               // consumer: the same for the pair it computes
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // ---- producer state (incremental: no divisions in the loop) ----
  auto wsrc_of = [&](int j) {  // the weights of this lane at k32 step j
    return static_cast<const uint4*>(p.qw) + (size_t(strip) * p.nk32 + j) * (C::kWChunks * 32) + lane;
  };
  const uint4* wsrc = wsrc_of(j0);
  const uint32_t wdst = uint32_t(((warp * C::kSub) * C::kWChunks) * 32 + lane) * 16;
  const uint4* szsrc = nullptr;
  int ipos = 0, cpos = 0;
  if constexpr (!kFp8) {
    const int grp0 = j0 / p.gsteps;
    ipos = cpos = j0 - grp0 * p.gsteps;
    szsrc = static_cast<const uint4*>(p.sz) + (size_t(grp0) * p.strips + strip) * kSzChunks + lane;
  }
  const size_t szstride = size_t(p.strips) * kSzChunks;
  constexpr int kSzPer = kStageFlush ? 1 : C::kSub;  // scale blocks per warp per stage
  const uint32_t szdst = uint32_t(C::kW + C::kX + warp * kSzPer * kSzChunks + lane) * 16;
  // X chunk q of this thread: row, k of stage 0, and whether it is copied at all.
  const T* xsrc[kXPer];
  int xk[kXPer];
  bool xcopy[kXPer];
#pragma unroll
  for (int q = 0; q < kXPer; ++q) {
    const int id = tid + q * kThreads;
    const int c = id & 3, r = id >> 2;
    const int row = r % C::kXRows, kgss = r / C::kXRows;
    const int ss = kgss % C::kSub, kg = kgss / C::kSub;
    xk[q] = ((pair0 * kWarpsK + kg) * spw + ss) * kStepK + 8 * c;
    xcopy[q] = id < C::kX && m0 + row < p.M;
    xsrc[q] = static_cast<const T*>(p.x) + size_t(xcopy[q] ? m0 + row : 0) * p.K + (xcopy[q] ? xk[q] : 0);
  }

  int jis = 0;  // next k32 step (inside this warp's range) to issue
  int wli = 0, wq = 0, xli = 0;  // stage inside the pair and pair of the next weights / X to issue
  // Weights and scale blocks of stage slot st (they do not depend on the previous kernel).
  auto issue_w = [&](int st) {
    if (kMulti && wli == nst) {  // next pair: its own warp range
      wli = 0;
      ++wq;
      const int jq = j0_of(wq);
      wsrc = wsrc_of(jq);
      jis = 0;
      nvalid = min(spw, p.nk32 - jq);
      if constexpr (!kFp8) {
        const int grp = jq / p.gsteps;
        ipos = jq - grp * p.gsteps;
        szsrc = static_cast<const uint4*>(p.sz) + (size_t(grp) * p.strips + strip) * kSzChunks + lane;
      }
    }
    if constexpr (kMulti) ++wli;
    const uint32_t sst = sbase + uint32_t(st) * (C::kStage * 16);
#pragma unroll
    for (int ss = 0; ss < C::kSub; ++ss) {
      const bool valid = jis + ss < nvalid;
#pragma unroll
      // Steps past the weights read zeros (not stale data): the small-M kernel does the same, so
      // both issue the very same mma operands (zeros of X meet these words).
      for (int c = 0; c < C::kWChunks; ++c)
        ptx::CpAsync16IfZfill(sst + wdst + uint32_t((ss * C::kWChunks + c) * 32 * 16),
                         valid ? wsrc + (ss * C::kWChunks + c) * 32 : p.qw, true, !valid);
      if constexpr (!kFp8) {
        if (!kStageFlush || ss == 0) {
          const bool newgrp = valid && (jis + ss == 0 || ipos == 0);
          ptx::CpAsync16If(sst + szdst + uint32_t((kStageFlush ? 0 : ss) * kSzBlockBytes), szsrc, newgrp && lane < kSzChunks);
          ipos += kStageFlush ? C::kSub : 1;
          if (ipos == p.gsteps) {
            ipos = 0;
            szsrc += szstride;
          }
        }
      }
    }
    wsrc += C::kSub * C::kWChunks * 32;
    jis += C::kSub;
  };
  // X of stage slot st.
  auto issue_x = [&](int st) {
    if (kMulti && xli == nst) {  // next pair: skip the other K-warps' ranges
      xli = 0;
#pragma unroll
      for (int q = 0; q < kXPer; ++q) {
        xk[q] += (kWarpsK - 1) * spw * kStepK;
        xsrc[q] += (kWarpsK - 1) * spw * kStepK;
      }
    }
    if constexpr (kMulti) ++xli;
    const uint32_t sst = sbase + uint32_t(st) * (C::kStage * 16);
#pragma unroll
    for (int q = 0; q < kXPer; ++q) {
      // Rows >= M are never stored, so their B columns may hold anything; the K tail must be
      // zeros (padded weights dequantize to -z), so it is zero-filled.
      const bool kin = xk[q] < p.K;
      ptx::CpAsync16IfZfill(sst + uint32_t(C::kW + tid + q * kThreads) * 16, kin ? xsrc[q] : p.x, xcopy[q], !kin);
      xk[q] += C::kSub * kStepK;
      xsrc[q] += C::kSub * kStepK;
    }
  };

  // acc[nt][u][e]: output column n = 32*strip + 16u + g + 8*(e >= 2), token 8nt + 2t + (e & 1).
  float acc[NT][2][4] = {};
  float scl[4] = {};     // int4: the group scales of columns 8s + g
  uint32_t nzm[4] = {};  // int4: -(magic + zero) of columns 8s + g, both halves

  auto compute = [&](int i, int st) {
    const uint4* sst = smem + size_t(st) * C::kStage;
    float c[NT][2][4];  // int4: this k32 step's (or stage's) partial, scaled into acc after it
#pragma unroll
    for (int ss = 0; ss < C::kSub; ++ss) {
      const int jj = i * C::kSub + ss;
      if (!kFp8 && (!kStageFlush || ss == 0)) {
        // Group change: new scales and zero points (only registers change, warp-uniform).
        if (jj < nvalid_c && (jj == 0 || cpos == 0))
          LoadGroup<T>(sst + C::kW + C::kX + (warp * kSzPer + (kStageFlush ? 0 : ss)) * kSzChunks, g, scl, nzm);
        cpos += kStageFlush ? C::kSub : 1;
        if (cpos == p.gsteps) cpos = 0;
      }
      const uint4* wsm = sst + ((warp * C::kSub + ss) * C::kWChunks) * 32 + lane;
      uint32_t wv[4 * C::kWChunks];
#pragma unroll
      for (int cc = 0; cc < C::kWChunks; ++cc) {
        const uint4 v = wsm[cc * 32];
        wv[4 * cc] = v.x; wv[4 * cc + 1] = v.y; wv[4 * cc + 2] = v.z; wv[4 * cc + 3] = v.w;
      }
      const uint4* xsm = sst + C::kW + ((kw * C::kSub + ss) * C::kXRows + g) * 4 + t;
      uint4 xv[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xv[nt] = xsm[nt * 8 * 4];
      StepMma<T, NT, kFp8>(wv, xv, nzm, !kStageFlush || ss == 0, c, acc);
      if (!kFp8 && (!kStageFlush || ss == C::kSub - 1)) Flush<NT>(scl, c, acc);
    }
  };

  // ---- main loop: kStages-deep cp.async pipeline, one barrier per stage ----
  // The next kernel may launch at once: its blocks take SM room as ours leave it and prefetch their
  // weights, and anything that touches our output or workspace waits in griddepcontrol.wait for this
  // grid to complete (H200: 2-9% faster at M = 32 and 64 than with the trigger after the main loop).
  ptx::LaunchDependents();
  // Prologue: the first stages' weights before griddepcontrol.wait (with a programmatic launch they
  // stream in while the previous kernel finishes), their X after it. The weights of all prologue
  // stages land in the first commit group, which only makes its wait stricter.
  constexpr int kNA = NT * 8;
  // fp8: the channel scales of columns 8s + g (fp16 weights were w * 2^-8).
  auto load_fs = [&](float (&fs)[4]) {
    const float4 u4 = __ldg(reinterpret_cast<const float4*>(p.fscales + (size_t(strip) * 8 + g) * 4));
    const float k = std::is_same_v<T, __half> ? 256.0f : 1.0f;
    fs[0] = u4.x * k; fs[1] = u4.y * k; fs[2] = u4.z * k; fs[3] = u4.w * k;
  };
  // A pair that is not the block's last: the 2 K-warps summed in order 0, 1 through a shared-memory area
  // of its own (the pipeline keeps streaming the next pair), in two halves of the token tiles, and the
  // pair's partial stored; both warps then start the next pair from zero. The final reduction below repeats
  // this exchange in one round, and the cluster path repeats the tail's in-order split sum: shared helpers for
  // both made QLinearKernel 1-7% slower (docs/perf/experiments.md).
  float* red2 = reinterpret_cast<float*>(smem + size_t(C::kStages) * C::kStage);
  auto pair_done = [&](int q) {
    constexpr int kH = C::kRedNT;
    auto slot = [&](int n, int u, int e) -> float& { return red2[((nw * kH + n) * 8 + u * 4 + e) * 32 + lane]; };
    float fs[4] = {};
    if constexpr (kFp8) load_fs(fs);
#pragma unroll
    for (int h = 0; h < NT / kH; ++h) {
      if (kw == 1) {
#pragma unroll
        for (int n = 0; n < kH; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) slot(n, u, e) = acc[h * kH + n][u][e];
      }
      __syncthreads();
      if (kw == 0) {
#pragma unroll
        for (int n = 0; n < kH; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = acc[h * kH + n][u][e] + slot(n, u, e);
              if constexpr (kFp8) v *= fs[2 * u + (e >> 1)];
              const int row = m0 + (h * kH + n) * 8 + 2 * t + (e & 1);
              const int col = strip * kWarpN + g + 16 * u + 8 * (e >> 1);
              if (row < p.M && col < p.N) p.partial[(size_t(pair0 + q) * p.M + row) * p.N + col] = v;
            }
      }
      __syncthreads();
    }
    ZeroAcc<NT>(acc);
  };
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s)
    if (s < ntot) issue_w(s);
  ptx::GridDependencyWait();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < ntot) issue_x(s);
    ptx::CpAsyncCommit();
  }
  int rd = 0, wr = C::kStages - 1;
  int cq = 0, cli = 0;  // pair and stage inside it being computed
  for (int i = 0; i < ntot; ++i) {
    ptx::CpAsyncWait<C::kStages - 2>();
    __syncthreads();
    if (i + C::kStages - 1 < ntot) {
      issue_w(wr);
      issue_x(wr);
    }
    ptx::CpAsyncCommit();
    compute(cli, rd);
    rd = rd + 1 == C::kStages ? 0 : rd + 1;
    wr = wr + 1 == C::kStages ? 0 : wr + 1;
    ++cli;
    if (kMulti && cli == nst && cq + 1 < npairs) {
      pair_done(cq);
      cli = 0;
      ++cq;
      const int jq = j0_of(cq);
      nvalid_c = min(spw, p.nk32 - jq);
      if constexpr (!kFp8) cpos = jq % p.gsteps;
    }
  }
  ptx::CpAsyncWait<0>();
  __syncthreads();
  const int split = pair0 + npairs - 1;  // the last pair's split: its partial is written below

  // ---- reduce the 2 K-warps in order 0, 1 ----
  float* red = reinterpret_cast<float*>(smem);
  float* ctile = red + kWarpsN * kNA * 32;  // cluster path: this block's fp32 tile [kXRows][kBlockN]
  if (kw == 1) StoreAcc<NT>(red, nw, lane, acc);
  __syncthreads();
  T* y = static_cast<T*>(p.y);
  if (kw == 0) {
    float fs[4] = {};
    if constexpr (kFp8) load_fs(fs);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = acc[nt][u][e] + red[(nw * kNA + (nt * 2 + u) * 4 + e) * 32 + lane];
          if constexpr (kFp8) v *= fs[2 * u + (e >> 1)];
          acc[nt][u][e] = v;
        }
    const int colw = strip * kWarpN + g;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + nt * 8 + 2 * t + (e & 1);
          const int col = colw + 16 * u + 8 * (e >> 1);
          if (p.cluster) {
            ctile[(nt * 8 + 2 * t + (e & 1)) * kBlockN + nw * kWarpN + 16 * u + 8 * (e >> 1) + g] = acc[nt][u][e];
          } else if (row < p.M && col < p.N) {
            if (p.splits == 1) y[size_t(row) * p.N + col] = T(acc[nt][u][e]);
            else p.partial[(size_t(split) * p.M + row) * p.N + col] = acc[nt][u][e];
          }
        }
  }
  if (p.splits == 1) return;
  const int ncol0 = cblock * kBlockN;
  const bool vec = (p.N & 3) == 0;
  auto store4 = [&](int row, int col, float4 sum) { StoreY4(y + size_t(row) * p.N + col, col, p.N, vec, sum); };
  if (p.cluster) {
    // The tile's S split blocks are one cluster (rank = split): after the barrier each block
    // sums every S-th group of 4 columns over ranks 0..S-1 in that order (the same fp32 sum as
    // the workspace path below), reading the other blocks' tiles through distributed shared memory.
    ptx::ClusterSync();
    const int rows = min(C::kXRows, p.M - m0);
    const uint32_t tbase = static_cast<uint32_t>(__cvta_generic_to_shared(ctile));
#pragma unroll 1
    for (int c = split + p.splits * tid; c < rows * (kBlockN / 4); c += p.splits * kThreads) {
      const int row = m0 + c / (kBlockN / 4), col = ncol0 + 4 * (c % (kBlockN / 4));
      float4 v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (q < p.splits) v[q] = ptx::LdClusterF4(tbase + uint32_t(c) * 16, q);
      float4 sum = v[0];
#pragma unroll
      for (int q = 1; q < 8; ++q)
        if (q < p.splits) {
          sum.x += v[q].x;
          sum.y += v[q].y;
          sum.z += v[q].z;
          sum.w += v[q].w;
        }
      if (col < p.N) store4(row, col, sum);
    }
    ptx::ClusterSyncExit();  // no block leaves while another still reads its tile
    return;
  }
  // Split-K: the last block of the tile (atomic ticket) sums splits 0..S-1 in that order. Thread 0's
  // ticket is one acq_rel atomic after the block barrier: its release publishes the block's partials (no
  // per-thread fence), its acquire orders the last block's loads after every other block's partials.
  __shared__ int s_last;
  const int tile = cblock * gridDim.x + mtile;
  __syncthreads();
  if (tid == 0) s_last = ptx::AtomicAddAcqRel(p.counters + tile, 1) == int(gridDim.y) - 1;
  __syncthreads();
  if (!s_last) return;
  // All 256 threads: 4 consecutive columns each (32 per row) x 8 rows per pass. The loads of two passes,
  // every split's, issue together, so the tail costs one L2 round trip per 16 rows.
  constexpr int kRowsPerPass = kThreads / 32, kPasses = 2;
  static_assert(C::kXRows % (kPasses * kRowsPerPass) == 0, "the tail's passes cover the token tile");
  const size_t stride = size_t(p.M) * p.N;
  const int col = ncol0 + 4 * (tid & 31);
  // The tail for N % 4 == 0 (float4 loads) or not (columns past N read as 0), chosen once.
  auto tail = [&](auto vec4) {
    auto load4 = [&](const float* src) {
      if constexpr (decltype(vec4)::value) return __ldcg(reinterpret_cast<const float4*>(src));
      else
        return make_float4(__ldcg(src), col + 1 < p.N ? __ldcg(src + 1) : 0.0f, col + 2 < p.N ? __ldcg(src + 2) : 0.0f,
                           col + 3 < p.N ? __ldcg(src + 3) : 0.0f);
    };
#pragma unroll 1
    for (int r0 = 0; r0 < C::kXRows; r0 += kPasses * kRowsPerPass) {
      float4 v[kPasses][kMaxSplits];
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int row = m0 + r0 + q * kRowsPerPass + (tid >> 5);
        const float* src = p.partial + size_t(min(row, p.M - 1)) * p.N + col;  // rows past M: loaded, not stored
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp)
          if (sp < p.splits) v[q][sp] = load4(src + sp * stride);
      }
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int row = m0 + r0 + q * kRowsPerPass + (tid >> 5);
        float4 sum = v[q][0];
#pragma unroll
        for (int sp = 1; sp < kMaxSplits; ++sp)
          if (sp < p.splits) {
            sum.x += v[q][sp].x;
            sum.y += v[q][sp].y;
            sum.z += v[q][sp].z;
            sum.w += v[q][sp].w;
          }
        if (row < p.M) store4(row, col, sum);
      }
    }
  };
  if (col < p.N) {
    if (vec) tail(std::true_type{});
    else tail(std::false_type{});
  }
  if (tid == 0) p.counters[tile] = 0;
}

template <typename T, int NT, bool kFp8, bool kStageFlush, bool kMulti>
cudaError_t LaunchQLinearNT(const QLinearParams& p0, const GemmTuning& t, const DeviceInfo& d, cudaStream_t stream) {
  using C = Cfg<kFp8, NT, kStageFlush, kMulti>;
  auto* kernel = QLinearKernel<T, NT, kFp8, kStageFlush, kMulti>;
  // The attribute belongs to the current device: set it on every launch (a static
  // once-only call left every GPU but the first without it: cudaErrorInvalidValue).
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kBytes));
  if (attr != cudaSuccess) return attr;
  QLinearParams p = p0;
  p.cluster = UseCluster(p.splits, t, d) ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.M + C::kXRows - 1) / C::kXRows, p.splits / p.pairs, (p.N + kBlockN - 1) / kBlockN);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = C::kBytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  if (p.cluster) {
    at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg.numAttrs].val.clusterDim.x = 1;
    at[cfg.numAttrs].val.clusterDim.y = p.splits;
    at[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  AddPdl(&cfg, t, d);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

}  // namespace flashq::gemm::detail
