// The batch-invariant GEMM of our own (sm_90a) for weights that need no dequantization: Y[M][N] = X[M][K] · Wᵀ with W
// as the checkpoint stores it ([N][K] row-major, no repacking), for every M.
//   - 16-bit weights (In = __nv_bfloat16 or __half, Out = In): RunW16Invariant.
//   - W8A8 (In = E4M3 bytes, Out 16-bit): RunW8A8Invariant; Y = (X · Wᵀ) * (x_scale[m] * w_scale[n]), one rounding
//     (row-wise or tensor-wise activation scales, per-channel or per-tensor weight scales).
//
// Bits: every output is one fp32 chain over K's chunks (k16 for 16-bit inputs, k32 for E4M3) in increasing k order,
// wgmma m64nTk16/k32 with A = 64 weight rows and B = T tokens, both K-major in shared memory, or with the roles traded
// (A = 64 tokens, B = 112 or 224 weight rows: the same bits, bench/gemm/mma_probe.cu --swap); the chain's first chunk
// overwrites the accumulator, and the scales (W8A8) multiply it once at the end. E4M3 chains are not promoted to a
// separate fp32 sum every few chunks (Hopper's fast FP8 accumulation; the promotion's cost is in docs/perf/gemm.md).
// Narrow layers with long rows split K once, at a point fixed by K and N (InvariantSplitPanel), into two such chains
// added in order (p0 + p1). The tile (T tokens, C warpgroups of 64 weight rows, B blocks per SM; or 64 C tokens by Wn
// weight rows) only decides which outputs a block computes and how deep its ring is, never how, so a row's bits depend
// on K, N and its own inputs alone, whatever M and whatever tile the dispatch picks for M (InvariantTileFor). The GPU
// tests compare every M with single-row calls, and every tile.
//
// Why not the W4A16 kernels' split plans: a plan of many splits fixes a sum of partials for every M, and a large-M
// kernel must then keep several accumulator sets or write partials; one chain (or two, handed over on chip) lets the
// large-M path be a plain Hopper GEMM. Small M loses the splits' parallelism, so each block streams its weight rows
// through a deep TMA ring instead (the bytes in flight, not the warps, carry the bandwidth), and the one split gives
// narrow layers, whose N / 64 weight tiles would leave half the SMs idle, a block per SM.
//
// Block: C consumer warpgroups (64 weight rows each, or 64 tokens each) and one producer warpgroup whose first thread
// issues the copies. A stage is 128 bytes of K (256 for T <= 32): per 128 bytes one TMA box of the block's weight rows
// and one of its T token rows, each a 128B-swizzled panel, into an S-slot ring with full / empty mbarriers. Tails:
// boxes past K, N or M are zero-filled by TMA (the same zeros for every tile, so the bits stay tile-independent);
// outputs past N or M are not stored. A split layer runs clusters of two blocks, one per part: the second leaves its
// fp32 tile in its ring after the main loop, the first reads it over distributed shared memory and adds it to its own.
// Epilogue: once every warpgroup is done with the ring, each transposes its tile into its own padded buffer there and
// stores token rows in pieces of 16 bytes.
// Limits (the launchers check them): K * sizeof(In) % 16 == 0 and N % 8 == 0 (TMA strides and 16-byte output
// pieces), 16-byte aligned x, w and y.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx/bulk_copy.cuh"
#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/wgmma.cuh"

namespace flashq::gemm::detail {

template <int kT, int kC, int kB, int kWn>
struct InvariantCfg {
  static_assert(kT == 8 || kT == 16 || kT == 32 || kT == 64 || kT == 128 || kT == 256, "wgmma n");
  static_assert(kC == 1 || kC == 2, "consumer warpgroups");
  static_assert(kB == 1 || kB == 2, "blocks per SM");
  // kWn = 0: weight rows are wgmma's A (64 per warpgroup) and the kT tokens its B. kWn > 0: the tokens are A (64 per
  // warpgroup, kT = 64 kC) and kWn weight rows are B, so that a weight tile need not be a multiple of 64 rows.
  static constexpr bool kTokensA = kWn > 0;
  static_assert(!kTokensA || (kT == 64 * kC && kWn % 16 == 0 && kWn <= 256), "tokens-as-A tile");
  static constexpr int kConsumers = kC * 128;
  static constexpr int kThreads = kConsumers + 128;  // + the producer warpgroup
  static constexpr int kRows = kTokensA ? kWn : kC * 64;  // weight rows per block
  static constexpr int kN = kTokensA ? kWn : kT;          // the wgmma n
  static constexpr int kAcc = kN / 2;                     // fp32 accumulators per consumer thread
  // A stage is kPanels 128-byte panels of K (one TMA box each per operand): two for narrow tiles, whose few wgmma per
  // panel would otherwise leave the consumers' per-stage waits and arrivals setting the streaming rate.
  static constexpr int kPanels = kN <= 32 ? 2 : 1;
  static constexpr int kWBytes = kPanels * kRows * 128;  // one stage of the block's weight rows
  static constexpr int kXBytes = kPanels * kT * 128;     // ... and of its tokens
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024: panels stay swizzle-aligned
  static_assert(kWBytes % 1024 == 0 && kXBytes % 1024 == 0, "swizzled panels");
  // Epilogue: each warpgroup's outputs as [kEpiTokens][kLd] 16-bit values in the ring, which is free by then.
  static constexpr int kEpiTokens = kTokensA ? 64 : kT, kEpiRows = kTokensA ? kWn : 64;
  static constexpr int kLd = kEpiRows + 8;  // row stride in 16-bit elements: conflict-free transposed writes
  static constexpr int kOutBytes = kC * kEpiTokens * kLd * 2;
  // Ring depth: as many stages as fit kB blocks per SM, at most 16. At small M a lone block (one of only N / 64 on
  // the GPU) must stream its weight rows at ~60 GB/s; its bytes in flight (up to 16 x 9 KB at 8 tokens) are what
  // carries that over the memory latency. Two blocks per SM halve the ring and let one block's epilogue and waits
  // overlap the other's math.
  static constexpr int kSmemLimit = (kB == 1 ? 227 : 113) * 1024 - 1024;  // less the barriers and alignment slack
  static constexpr int kStagesFit = kSmemLimit / kStageBytes;
  static constexpr int kStages = kStagesFit < 16 ? kStagesFit : 16;
  static_assert(kStages >= 2, "shared memory");
  static constexpr int kRingBytes = kStages * kStageBytes;
  static_assert(kOutBytes <= kRingBytes, "epilogue buffers");
  // A split block hands its fp32 tile to its partner through the ring, which is free after the main loop.
  static_assert(kAcc * kConsumers * 4 <= kRingBytes, "split exchange");
  static constexpr int kBarOffset = kRingBytes;
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + slack for 1024-byte alignment
  // setmaxnreg: the producer keeps 40, the consumers share the rest of the block's share of 64K (at most 232).
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerFit = (65536 / kB - 128 * kProducerRegs) / kConsumers / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerFit < 232 ? kConsumerFit : 232;
};

// wmap: W [N][K], boxes of 128 bytes of K x kRows rows; xmap: X [M][K], boxes of 128 bytes of K x kT rows; both 128B
// swizzle, zero fill. xs, ws: W8A8's activation and per-column weight scales (null for 16-bit inputs); token m's
// activation scale is xs[m * xs_stride] (stride 0: one tensor-wise scale). split_panel > 0: K is split there (in
// 128-byte panels, an even number) into two chains, computed by the two blocks of a cluster (blockIdx.y = 2 weight
// tile + part) and added in part order by the first.
template <typename In, typename Out, int kT, int kC, int kB, int kWn>
__global__ void __launch_bounds__(InvariantCfg<kT, kC, kB, kWn>::kThreads, kB)
    InvariantGemmKernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, Out* y,
                        const float* xs, int xs_stride, const float* ws, int M, int N, int K,
                        int split_panel) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = InvariantCfg<kT, kC, kB, kWn>;
  constexpr int S = C::kStages;
  constexpr bool kFp8 = std::is_same_v<In, uint8_t>;
  constexpr int kPanelK = 128 / sizeof(In);  // K elements per panel
  constexpr int kStageK = C::kPanels * kPanelK;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sbase = (raw + 1023) & ~1023u;  // swizzled panels need 1024-byte alignment
  unsigned char* smem = smem_raw + (sbase - raw);
  const uint32_t bar0 = sbase + C::kBarOffset;
  auto full_bar = [&](int slot) { return bar0 + 8 * slot; };
  auto empty_bar = [&](int slot) { return bar0 + 8 * (S + slot); };
  const int tid = threadIdx.x;
  // The token tiles of one weight tile are neighbours in the launch order, so that a wave reads each weight tile from
  // memory once and its other token tiles find it in L2.
  const bool split = split_panel > 0;
  const int part = split ? int(blockIdx.y & 1) : 0;  // the cluster rank
  const int m0 = blockIdx.x * kT, n0 = (split ? blockIdx.y >> 1 : blockIdx.y) * C::kRows;
  // This block's stages: its part's K range (split_panel is even, so two-panel stages never straddle it).
  const int nk_all = (K + kStageK - 1) / kStageK, split_stage = split_panel / C::kPanels;
  const int kt0 = part == 1 ? split_stage : 0, nk = (split && part == 0 ? split_stage : nk_all) - kt0;

  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      ptx::MbarInit(full_bar(i), 1);               // the producer's expect_tx, then the copies' bytes
      ptx::MbarInit(empty_bar(i), C::kConsumers);  // every consumer thread done with the stage
    }
    ptx::FenceMbarInitCluster();
  }
  __syncthreads();

  if (tid >= C::kConsumers) {
    // ---- producer: one thread issues both boxes of every stage, each slot refilled once the consumers release it ----
    ptx::SetMaxNRegDec<C::kProducerRegs>();
    if (tid == C::kConsumers) {
      ptx::GridDependencyWait();  // X may be the previous kernel's output
      for (int kt = 0; kt < nk; ++kt) {
        const int slot = kt % S, k = (kt0 + kt) * kStageK;
        if (kt >= S) ptx::MbarWaitAsmLoop(empty_bar(slot), ((kt / S) - 1) & 1);
        const uint32_t base = sbase + slot * C::kStageBytes;
        ptx::MbarArriveExpectTx(full_bar(slot), C::kStageBytes);
#pragma unroll
        for (int p = 0; p < C::kPanels; ++p) {  // boxes wholly past K are zeros and still count their bytes
          ptx::TmaLoad2d(base + p * C::kRows * 128, &wmap, k + p * kPanelK, n0, full_bar(slot));
          ptx::TmaLoad2d(base + C::kWBytes + p * kT * 128, &xmap, k + p * kPanelK, m0, full_bar(slot));
        }
      }
    }
    if (split) {  // the consumers' two cluster barriers (below)
      ptx::ClusterSync();
      ptx::ClusterSyncExit();
    }
    return;
  }

  // ---- consumers: warpgroup wg owns weight rows n0 + 64 wg .. + 63 (tokens as A: tokens m0 + 64 wg .. + 63) ----
  ptx::SetMaxNRegInc<C::kConsumerRegs>();
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  float acc[C::kAcc];
#pragma unroll
  for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < nk; ++kt) {
    const int slot = kt % S;
    ptx::MbarWaitAsmLoop(full_bar(slot), (kt / S) & 1);
    const uint32_t stage = sbase + slot * C::kStageBytes;
    ptx::WgmmaFence();
#pragma unroll
    for (int p = 0; p < C::kPanels; ++p) {
      const uint32_t w = stage + p * C::kRows * 128, x = stage + C::kWBytes + p * kT * 128;
      const uint32_t a = C::kTokensA ? x + wg * 64 * 128 : w + wg * 64 * 128, b = C::kTokensA ? w : x;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 4 chunks of 32 bytes of K per panel
        const uint64_t da = ptx::SwizzledDesc(a + kk * 32), db = ptx::SwizzledDesc(b + kk * 32);
        const bool accumulate = kt + p + kk > 0;  // a part's chain starts at its first chunk
        if constexpr (kFp8) ptx::WgmmaE4m3<C::kN>::SS(acc, da, db, accumulate);
        else ptx::Wgmma<C::kN, std::is_same_v<In, __nv_bfloat16>>::SS(acc, da, db, accumulate);
      }
    }
    ptx::WgmmaCommit();
    ptx::WgmmaWait<1>();  // the previous stage's chunks are done: release its slot
    if (kt > 0) ptx::MbarArrive(empty_bar((kt - 1) % S));
  }
  ptx::WgmmaWait<0>();
  ptx::LaunchDependents();
  if (split) {
    // Part 1 leaves its chain's tile in its ring (once both warpgroups' wgmma have read it), part 0 adds it to its
    // own: p0 + p1, the same sum for every tile and every M.
    const uint32_t xch = sbase + tid * 16;  // this thread's float4 q at xch + q * kConsumers * 16
    if (part == 1) {
      ptx::NamedBarSync(3, C::kConsumers);
      float4* mine = reinterpret_cast<float4*>(smem) + tid;
#pragma unroll
      for (int q = 0; q < C::kAcc / 4; ++q)
        mine[q * C::kConsumers] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    }
    ptx::ClusterSync();
    if (part == 0) {
#pragma unroll
      for (int q = 0; q < C::kAcc / 4; ++q) {
        const float4 r = ptx::LdClusterF4(xch + q * C::kConsumers * 16, 1);
        acc[4 * q] = __fadd_rn(acc[4 * q], r.x);
        acc[4 * q + 1] = __fadd_rn(acc[4 * q + 1], r.y);
        acc[4 * q + 2] = __fadd_rn(acc[4 * q + 2], r.z);
        acc[4 * q + 3] = __fadd_rn(acc[4 * q + 3], r.w);
      }
    }
    ptx::ClusterSyncExit();  // part 1 stays until part 0 has read its tile
    if (part == 1) return;
  }
  // The epilogue reads the scales and writes y: both after the previous kernel (the producer's wait covered only the
  // copies). By now it has finished, so this returns at once.
  ptx::GridDependencyWait();
  if (!split) ptx::NamedBarSync(3, C::kConsumers);  // every warpgroup's wgmma is done with the ring (a split's were
                                                    // at the cluster barrier)

  // ---- epilogue: acc[4 j + e] is A row 16 warp + lane / 4 + 8 (e >= 2), B row 8 j + 2 (lane % 4) + (e & 1) ----
  // This warpgroup's outputs: tokens mw .. + kEpiTokens - 1 by weight rows nw .. + kEpiRows - 1.
  Out* out = reinterpret_cast<Out*>(smem) + wg * C::kEpiTokens * C::kLd;
  const int r0 = warp * 16 + lane / 4, c0 = 2 * (lane % 4);
  const int mw = m0 + (C::kTokensA ? wg * 64 : 0), nw = n0 + (C::kTokensA ? 0 : wg * 64);
  // The A rows' scales (2 per thread); the B rows' are read per output.
  float ascale[2] = {1.0f, 1.0f};
  if constexpr (kFp8) {
    for (int h = 0; h < 2; ++h) {
      const int i = r0 + 8 * h;
      if constexpr (C::kTokensA) ascale[h] = mw + i < M ? xs[(mw + i) * xs_stride] : 0.0f;
      else ascale[h] = nw + i < N ? ws[nw + i] : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < C::kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ai = r0 + (e >= 2 ? 8 : 0), bi = 8 * j + c0 + (e & 1);
      const int tok = C::kTokensA ? ai : bi, row = C::kTokensA ? bi : ai;
      float v = acc[4 * j + e];
      if constexpr (kFp8) {  // v * (x_scale * w_scale), whichever operand the token is
        const float bscale = C::kTokensA ? (nw + bi < N ? ws[nw + bi] : 0.0f)
                                         : (mw + bi < M ? xs[(mw + bi) * xs_stride] : 0.0f);
        const float xscale = C::kTokensA ? ascale[e >= 2] : bscale, wscale = C::kTokensA ? bscale : ascale[e >= 2];
        v = __fmul_rn(v, __fmul_rn(xscale, wscale));
      }
      Out o;
      if constexpr (std::is_same_v<Out, __nv_bfloat16>) o = __float2bfloat16_rn(v);
      else o = __float2half_rn(v);
      out[tok * C::kLd + row] = o;
    }
  ptx::NamedBarSync(1 + wg, 128);
  const int tw = tid % 128;
  constexpr int kPieces = C::kEpiRows / 8;  // 16-byte pieces per token row
#pragma unroll 4
  for (int q = tw; q < C::kEpiTokens * kPieces; q += 128) {
    const int r = q / kPieces, piece = q % kPieces, m = mw + r, n = nw + piece * 8;
    if (m < M && n < N)
      *reinterpret_cast<uint4*>(y + size_t(m) * N + n) = *reinterpret_cast<const uint4*>(out + r * C::kLd + piece * 8);
  }
#endif
}

}  // namespace flashq::gemm::detail
