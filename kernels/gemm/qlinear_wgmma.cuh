// EXPERIMENT (opt-in, FLASHQ_GEMM_WGMMA=1; not faster than QLinearKernel, see
// bench/results/gemm-nvidia-h200-2026-11-24-wgmma-b-smem.md): sm_90a wgmma kernel for W4A16 with
// M > 16 (groups of a multiple of 4 k32 steps), bitwise equal to QLinearKernel / QLinearDirectKernel.
//
// Roles: A = 64 tokens of X in registers (the m16n8k16 A-fragment layout per warp, loaded from a
// shared-memory copy of X), B = W dequantized into shared memory (K-major, no swizzle: core matrix
// = 8 columns x 8 k in 128 B). Each k16 chunk of the mma.sync kernels (channels 8t + 4ks + 0..3 of
// a k32 step) is one wgmma k16 chunk here, chained in the same order from a fresh accumulator over
// one k128 flush unit (the probe: wgmma m64nNk16 gives chained mma.sync's bits, and the k order
// inside a chunk is free; bench/results/gemm-probe-h200-2026-11-24.md). Flush, zero-filled steps
// and scale registers are those of StepMma/Flush.
// Block: 64 tokens x 256 columns x one split (its two warp ranges in turn; the first range's
// accumulators wait in shared memory and the block stores r0 + r1). Warpgroups 0 and 1 copy
// (cp.async) and dequantize half stages (2 k32 steps) into a 3-deep ring handed over by mbarriers;
// warpgroups 2 and 3 run the wgmma chains (128 columns each), the flush and the epilogue; splits
// finish through the fp32 workspace and FinishSplitK, as QLinearKernel's. -DFLASHQ_WG_TIMELINE
// prints a per-half clock64 timeline of block (0, 0, 0) and per-split globaltimer phases of tile 0.
#pragma once

#include "kernels/gemm/qlinear_kernel.cuh"

namespace flashq::gemm::detail {

struct WgCfg {
  static constexpr int kThreads = 512;   // warpgroups 0 and 1: producers; 2 and 3: consumers
  static constexpr int kProducers = 256, kConsumers = 256;
  static constexpr int kProducerRegs = 56, kConsumerRegs = 200;  // setmaxnreg: 256 x (56 + 200) = 64K
  static constexpr int kRows = 64;       // tokens per tile (wgmma M)
  static constexpr int kWgCols = 128;    // columns per consumer (wgmma N)
  static constexpr int kCols = 256;      // columns per tile: 8 strips
  static constexpr int kStrips = kCols / kWarpN;
  static constexpr int kSteps = 2;       // k32 steps per half stage
  static constexpr int kDepth = 3;       // half stages in flight between producer and consumers
  static constexpr int kPrefetch = 3;    // raw weights loaded this many half stages ahead (ring of kPrefetch + 1)
  static constexpr int kXBytes = kSteps * kRows * 64;          // X [step][row][t] x 16 B
  static constexpr int kChunkBytes = (kCols / 8) * 256;        // one k16 chunk of B: [n8 group][k half][8][16 B]
  static constexpr int kWbBytes = 2 * kSteps * kChunkBytes;    // one dequantized half stage
  static constexpr int kSlotBytes = kXBytes + kWbBytes;        // consumer-visible slot: X, B
  static constexpr int kRawW = kStrips * kSteps * 512;         // raw int4 [strip][step][lane] x 16 B
  static constexpr int kRawBytes = kRawW + kStrips * 96;       // + the stage's scale blocks
  static constexpr int kRawOff = kDepth * kSlotBytes;
  static constexpr int kScOff = kRawOff + (kPrefetch + 1) * kRawBytes;  // fp32 column scales [2 stages][kCols]
  static constexpr int kStashOff = kScOff + 2 * kCols * 4;     // the first range's accumulators [64][kConsumers]
  static constexpr int kBarOff = kStashOff + 64 * kConsumers * 4;  // full[kDepth], empty[kDepth]
  static constexpr int kFlagOff = kBarOff + 2 * kDepth * 8;     // the two split-K finish flags
  static constexpr size_t kBytes = size_t(kFlagOff) + 2 * 4;
  static_assert(kBytes <= 227 * 1024, "one block per SM");
  static_assert(kCols % kBlockN == 0, "the workspace counters are sized for kBlockN-column tiles");
};

// wgmma m64n128k16, A from registers, B K-major from shared memory (tnsp-b = 0); scale_d = 0 starts from zero.
#define FLASHQ_WGMMA_RS_N128_KB(TY)                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
template <typename T>
__device__ __forceinline__ void WgmmaN128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<T, __half>) FLASHQ_WGMMA_RS_N128_KB("f16");
  else FLASHQ_WGMMA_RS_N128_KB("bf16");
}
#undef FLASHQ_WGMMA_RS_N128_KB

// Shared-memory matrix descriptor, no swizzle: lbo = bytes between the two k halves of a chunk,
// sbo = bytes between n8 groups.
__device__ __forceinline__ uint64_t NoSwizzleDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) | (uint64_t((sbo >> 4) & 0x3FFF) << 32);
}
__device__ __forceinline__ void StShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void MbarInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t addr, int parity) {
  uint32_t ok = 0;
  while (!ok) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void MbarArrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <typename T>
__global__ void __launch_bounds__(WgCfg::kThreads, 1) QLinearWgmmaKernel(const QLinearParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgCfg;
  extern __shared__ __align__(1024) uint8_t wsm[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.z * C::kRows;
  const int strip0 = blockIdx.x * C::kStrips;
  const int nh = p.steps_per_warp / C::kSteps;  // half stages per warp range (even: whole stages)
  const int nht = 2 * nh;                       // the block's halves: its split's two ranges, contiguous in K
  const int s0 = 2 * blockIdx.y * p.steps_per_warp;  // the block's first k32 step
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(wsm));
  float* sc = reinterpret_cast<float*>(wsm + C::kScOff);
  const uint32_t bars = sbase + C::kBarOff;
  auto full = [&](int sl) { return bars + sl * 8; };
  auto empty = [&](int sl) { return bars + (C::kDepth + sl) * 8; };
  if (tid == 0) {
    for (int sl = 0; sl < C::kDepth; ++sl) {
      MbarInit(full(sl), 2 * C::kProducers);  // each producer thread: its X copies landed, and its B stores
      MbarInit(empty(sl), C::kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#ifdef FLASHQ_WG_TIMELINE
  __shared__ uint32_t tl[6 * 64];
  const long long t0 = clock64();
  auto gtime = [] {
    uint64_t v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
  };
  const uint64_t g0 = gtime();
#endif
  __syncthreads();

  if (tid < C::kProducers) {
    // ================= producer warpgroups: copies, dequantization =================
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    // Raw weights: chunks tid + 256q (q < 2) of [strip][step][lane]; zeros past the packed steps and strips.
    const int wsl = tid >> 6, wst = (tid >> 5) & 1;  // strip of chunk tid (q adds 4 strips), step
    const uint4* wsrc = static_cast<const uint4*>(p.qw) + (size_t(strip0 + wsl) * p.nk32 + s0 + wst) * 32 + lane;
    const size_t wq_stride = size_t(4) * p.nk32 * 32;  // 4 strips
    int wj = s0 + wst;
    // Scale blocks: threads < 48 (8 strips x 6 chunks) at even halves.
    const bool sz_thread = tid < C::kStrips * 6 && strip0 + tid / 6 < p.strips;
    const uint4* szsrc = static_cast<const uint4*>(p.sz) + (size_t(s0 / p.gsteps) * p.strips + strip0 + tid / 6) * 6 + tid % 6;
    int ipos = s0 % p.gsteps;
    int wH = 0;
    auto issue_w = [&]() {
      const uint32_t raw = sbase + C::kRawOff + uint32_t((wH % (C::kPrefetch + 1)) * C::kRawBytes);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const bool valid = wj < p.nk32 && strip0 + wsl + 4 * q < p.strips;
        CpAsync16IfZfill(raw + (tid + 256 * q) * 16, valid ? wsrc + q * wq_stride : p.qw, true, !valid);
      }
      if (wH % 2 == 0) {
        CpAsync16If(raw + C::kRawW + tid * 16, szsrc, sz_thread && wj - wst < p.nk32);
        ipos += 2 * C::kSteps;
        if (ipos == p.gsteps) {
          ipos = 0;
          szsrc += size_t(p.strips) * 6;
        }
      }
      wsrc += C::kSteps * 32;
      wj += C::kSteps;
      ++wH;
    };
    // X: chunks tid + 256q of [step][row][t]: step q, row tid >> 2; zeros past M and K.
    const int xrow = tid >> 2;
    int xk = s0 * kStepK + 8 * (tid & 3);
    const T* xsrc = static_cast<const T*>(p.x) + size_t(m0 + xrow) * p.K + xk;
    auto issue_x = [&](int H) {
      const uint32_t slot = sbase + uint32_t((H % C::kDepth) * C::kSlotBytes);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const bool valid = m0 + xrow < p.M && xk + q * kStepK < p.K;
        CpAsync16IfZfill(slot + (tid + 256 * q) * 16, valid ? xsrc + q * kStepK : p.x, true, !valid);
      }
      xk += C::kSteps * kStepK;
      xsrc += C::kSteps * kStepK;
    };
    // Dequantization of half H: warp w takes strip w (both steps). The group registers
    // start each range at zero and reload at every valid stage (they keep the last group's values on
    // the zero-filled stages past the weights, as in the mma.sync kernels); the stage's fp32 column
    // scales go to sc[stage % 2].
    float scl[4] = {};
    uint32_t nzm[4] = {};
    auto dequant = [&](int H) {
      const uint32_t raw = sbase + C::kRawOff + uint32_t((H % (C::kPrefetch + 1)) * C::kRawBytes);
      const uint32_t wb = sbase + uint32_t((H % C::kDepth) * C::kSlotBytes) + C::kXBytes;
      if (H % 2 == 0) {
        if (H == 0 || H == nh) {
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            scl[s] = 0.0f;
            nzm[s] = 0u;
          }
        }
        if (s0 + H * C::kSteps < p.nk32) {
          const uint32_t blk = raw + C::kRawW + warp * 96;
          uint2 sv;
          asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(sv.x), "=r"(sv.y) : "r"(blk + 8 * g) : "memory");
          uint32_t z;
          asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(z) : "r"(blk + 64 + 4 * g) : "memory");
          GroupRegs<T>(sv, z, scl, nzm);
        }
        if (t == 0) {
#pragma unroll
          for (int s = 0; s < 4; ++s) sc[((H / 2) % 2) * C::kCols + warp * kWarpN + 8 * s + g] = scl[s];
        }
      }
#pragma unroll
      for (int st = 0; st < C::kSteps; ++st) {
          const int sl = warp;
          const uint4 v = LdShared128(raw + ((sl * C::kSteps + st) * 32 + lane) * 16);
          const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int pr = 0; pr < 4; ++pr) {
              // pair pr = channels 8t + 2pr, +1: k16 chunk 2st + pr / 2, k half pr % 2, bytes 4t of row (column) g.
              const int kc = 2 * st + (pr >> 1);
              StShared32(wb + kc * C::kChunkBytes + ((4 * sl + s) * 2 + (pr & 1)) * 128 + g * 16 + t * 4,
                         DequantPair<T>(wv[s], pr, nzm[s]));
            }
        }
    };

    // cp.async groups: ({}, W(i)) for i < kPrefetch, then per half H: X(H), W(H + kPrefetch); so W(H)
    // always has exactly 2 kPrefetch - 1 younger groups when half H is dequantized.
    for (int i = 0; i < C::kPrefetch; ++i) {
      CpAsyncCommit();
      if (i < nht) issue_w();
      CpAsyncCommit();
    }
    GridDependencyWait();
    for (int H = 0; H < nht; ++H) {
      const int sl = H % C::kDepth;
      if (H >= C::kDepth) MbarWait(empty(sl), ((H / C::kDepth) - 1) & 1);
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 0 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[0 * 64 + H] = uint32_t(clock64() - t0);
#endif
      issue_x(H);
      CpAsyncMbarArrive(full(sl));
      CpAsyncCommit();
      CpAsyncWait<2 * C::kPrefetch - 1>();
      NamedBarSync(1, C::kProducers);  // W(H) of every producer thread has landed; W(H - 1) is dequantized
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 0 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[1 * 64 + H] = uint32_t(clock64() - t0);
#endif
      if (H + C::kPrefetch < nht) issue_w();
      CpAsyncCommit();
      dequant(H);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      MbarArrive(full(sl));
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 0 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[2 * 64 + H] = uint32_t(clock64() - t0);
#endif
    }
    CpAsyncWait<0>();
#ifdef FLASHQ_WG_TIMELINE
    NamedBarSync(4, C::kProducers + 32);
#endif
    return;
  }

  // ================= consumer warpgroups: wgmma, flush, epilogue =================
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  const int cw = warp - 8, wg = cw >> 2, wq = cw & 3, ctid = tid - C::kProducers;
  // acc[4j + e], c[4j + e]: token 16 wq + g + 8 (e >> 1), column 128 wg + 8j + 2t + (e & 1) of the tile.
  float acc[64], c[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  float* stash = reinterpret_cast<float*>(wsm + C::kStashOff);
  const uint32_t xfrag = sbase + uint32_t(((16 * wq + g) * 4 + t) * 16);  // row 16 wq + g, chunk t of step 0
  const uint64_t desc0 = NoSwizzleDesc(sbase + C::kXBytes + wg * (C::kWgCols / 8) * 256, 128, 256);
  for (int H = 0; H < nht; ++H) {
    const int sl = H % C::kDepth;
    MbarWait(full(sl), (H / C::kDepth) & 1);
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 8 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[3 * 64 + H] = uint32_t(clock64() - t0);
#endif
    const uint32_t slot = uint32_t(sl * C::kSlotBytes);
    uint32_t a[2 * C::kSteps][4];
#pragma unroll
    for (int st = 0; st < C::kSteps; ++st) {
      const uint4 xa = LdShared128(xfrag + slot + st * C::kRows * 64);
      const uint4 xb = LdShared128(xfrag + slot + st * C::kRows * 64 + 8 * 64);
      a[2 * st][0] = xa.x; a[2 * st][1] = xb.x; a[2 * st][2] = xa.y; a[2 * st][3] = xb.y;
      a[2 * st + 1][0] = xa.z; a[2 * st + 1][1] = xb.z; a[2 * st + 1][2] = xa.w; a[2 * st + 1][3] = xb.w;
    }
    const uint64_t desc = desc0 + uint64_t(slot >> 4);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kc = 0; kc < 2 * C::kSteps; ++kc)
      WgmmaN128<T>(c, a[kc], desc + uint64_t(kc * (C::kChunkBytes >> 4)), ((H & 1) == 0 && kc == 0) ? 0 : 1);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 8 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[4 * 64 + H] = uint32_t(clock64() - t0);
#endif
    if (H & 1) {
      const float* s = sc + ((H >> 1) & 1) * C::kCols + wg * C::kWgCols + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float2 f = *reinterpret_cast<const float2*>(s + 8 * j);
        acc[4 * j] = fmaf(f.x, c[4 * j], acc[4 * j]);
        acc[4 * j + 1] = fmaf(f.y, c[4 * j + 1], acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(f.x, c[4 * j + 2], acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(f.y, c[4 * j + 3], acc[4 * j + 3]);
      }
      if (H == nh - 1) {  // the first range is done: park it, start the second from zero
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          stash[i * C::kConsumers + ctid] = acc[i];
          acc[i] = 0.0f;
        }
      }
    }
    MbarArrive(empty(sl));
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 8 && lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && H < 64) tl[5 * 64 + H] = uint32_t(clock64() - t0);
#endif
  }
  LaunchDependents();
#ifdef FLASHQ_WG_TIMELINE
  if (warp == 8) {
    NamedBarSync(4, C::kProducers + 32);
    if (lane == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
      for (int H = 0; H < nht && H < 64; ++H)
        printf("TL H=%d P: empty %u wlanded %u full %u | C: full %u mma %u empty %u\n", H, tl[H], tl[64 + H], tl[128 + H],
               tl[192 + H], tl[256 + H], tl[320 + H]);
  }
#endif

  // ---- the split's sum r0 + r1 (QLinearKernel's (kw 0) + (kw 1)): y, or the fp32 workspace ----
  const int n0 = blockIdx.x * C::kCols;
  T* y = static_cast<T*>(p.y);
  float* part = p.partial + size_t(blockIdx.y) * p.M * p.N;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = m0 + 16 * wq + g + 8 * rh, col = n0 + wg * C::kWgCols + 8 * j + 2 * t;
      if (row >= p.M || col >= p.N) continue;
      const int i = 4 * j + 2 * rh;
      const float v0 = stash[i * C::kConsumers + ctid] + acc[i], v1 = stash[(i + 1) * C::kConsumers + ctid] + acc[i + 1];
      const size_t o = size_t(row) * p.N + col;
      const bool two = col + 1 < p.N;
      if (p.splits == 1) {
        y[o] = T(v0);
        if (two) y[o + 1] = T(v1);
      } else if (two && (p.N & 1) == 0) {
        *reinterpret_cast<float2*>(part + o) = make_float2(v0, v1);
      } else {
        part[o] = v0;
        if (two) part[o + 1] = v1;
      }
    }
#ifdef FLASHQ_WG_TIMELINE
  const uint64_t g1 = gtime();
#endif
  if (p.splits == 1) return;
  __threadfence();
  // The tile's two kBlockN halves finish as two tickets (the workspace counters are per kBlockN tile).
  FinishSplitK<T, C::kRows, 128, 2>(p, n0 + wg * kBlockN, m0, blockIdx.z * (2 * gridDim.x) + 2 * blockIdx.x + wg, ctid & 127,
                                    [&] { NamedBarSync(2 + wg, 128); }, reinterpret_cast<int*>(wsm + C::kFlagOff) + wg);
#ifdef FLASHQ_WG_TIMELINE
  if (ctid == 0 && blockIdx.x == 0 && blockIdx.z == 0)
    printf("TG split %d sm-start %llu loop+stores %llu finish %llu (ns)\n", int(blockIdx.y), (unsigned long long)(g0 % 1000000),
           (unsigned long long)(g1 - g0), (unsigned long long)(gtime() - g1));
#endif
#else
  __trap();  // dispatched on sm_90 only, which this build must then include as sm_90a
#endif
}

template <typename T>
cudaError_t LaunchQLinearWgmma(const QLinearParams& p, cudaStream_t stream) {
  using C = WgCfg;
  auto* kernel = QLinearWgmmaKernel<T>;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kBytes));
  if (attr != cudaSuccess) return attr;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.N + C::kCols - 1) / C::kCols, p.splits, (p.M + C::kRows - 1) / C::kRows);
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kBytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[1];
  cfg.attrs = at;
  AddPdl(&cfg);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// Opt-in bench knob FLASHQ_GEMM_WGMMA=1: the experiment serves M > kSmallMMaxRows on sm_90.
inline bool UseWgmma() {
  static const bool on = [] {
    const char* e = std::getenv("FLASHQ_GEMM_WGMMA");
    return e && e[0] == '1';
  }();
  return on && DeviceMajor() == 9;
}

}  // namespace flashq::gemm::detail
