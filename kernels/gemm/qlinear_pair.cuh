// Small-M W4A16 at 9-16 rows (two 8-token tiles) for 8-split plans on sm_90: QLinearDirectKernel's blocks, warp
// ranges, arithmetic and sum, with X shared by the blocks of two neighbouring strips (a 2-block cluster).
//
// Why: at 9-16 rows every block reads all of X from L2 (14336 x 4096 M = 16: 458 KB a block, twice the weights), and
// those reads bound the call. With each warp's second token tile reading its first tile's rows (wrong results, half
// the L2 reads of X, the same instructions) the direct kernel took 14336 x 4096 M = 16 from 13.12 to 11.48 µs and
// 4096² from 5.36 to 4.93; 2-block clusters with a cluster barrier at the start cost 0.2-0.26 µs (H200,
// bench/results/gemm-nvidia-h200-2026-11-27-s25.md, calls 4 and 6).
//
// How: warp w of both blocks runs the same warp range, so it needs the same X. Each block copies one token tile
// (rows 8 * rank .. + 7) of a stage (kSubSteps k32 steps) of the warp's X with bulk copies multicast into the same
// slot of both blocks, so every X byte leaves L2 once per pair. A warp holds three slots: it waits for a slot's full
// barrier (both blocks' copies), reads X from shared memory, and releases the slot on the empty barriers of both
// blocks; lane 0 refills the slot with stage q + 3 once the partner warp has released it too. The weights stay in
// registers, two stages deep, loaded as QLinearDirectKernel loads them.
//
// Bits: the same StepMma and Flush per stage, in the same order, and the same BlockSum; rows past M read zeros (the
// direct kernel reads row M - 1 there: those outputs are never stored). So row i of Y is bitwise the small-M kernel's for any M (GPU test
// W4A16PairKernelKeepsTheBits).
// Limits (UsePair): int4 with stage flush, sm_90, 9 <= M <= 16 and M >= pair_min_rows, 8-split plans whose warp ranges
// are whole stages inside K (K == 16 * steps_per_warp * 32), an even number of strips.
#pragma once

#include "kernels/gemm/qlinear_kernel.cuh"
#include "kernels/gemm/qlinear_wgmma.cuh"  // EncodeMap2d

namespace flashq::gemm::detail {

constexpr int kPairSlots = 3;                                      // X slots per warp: two stages ahead
constexpr uint32_t kPairSlotBytes = 16 * kSubSteps * kStepK * 2;  // a stage of two 8-token tiles: 4 KB
constexpr int kPairWarps = kWarpsK * kMaxSplits;
constexpr uint32_t kPairXBytes = kPairWarps * kPairSlots * kPairSlotBytes;  // after the main loop: BlockSum's floats
constexpr uint32_t kPairSmemBytes = kPairXBytes + kPairWarps * kPairSlots * 16;  // + full, empty
static_assert(kPairWarps * 16 * 32 * sizeof(float) <= kPairXBytes, "the block sum fits in the X slots");

// A 2D tensor-map box at (c0, c1) into the same offset of the shared memory of both blocks of a 2-block cluster,
// completing on the mbarrier at the same offset in each.
__device__ __forceinline__ void TmaLoad2dToPair(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], "
      "[%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(uint16_t(3))
      : "memory");
}
// Arrives on the mbarrier at offset `bar` of the other block of the pair. Default semantics (release, CTA scope), as
// CUTLASS's cluster pipelines release a slot to its producer: .release.cluster compiles to MEMBAR.ALL.GPU, which would
// also wait for this thread's weight loads in flight.
__device__ __forceinline__ void MbarArrivePartner(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank ^ 1u));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

template <typename T>
__global__ void __launch_bounds__(kDirectMaxThreads, 1) QLinearPairKernel(const QLinearParams p,
                                                                           const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NT = 2;
  extern __shared__ __align__(1024) uint4 pair_smem[];  // the swizzled boxes need 1024-byte alignment
  LaunchDependents();  // as the int4 small-M kernel: the next kernel may start its weight prefetch at once
  const int lane = threadIdx.x & 31;
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x >> 5), 0);
  const int g = lane >> 2, t = lane & 3;
  const int strip = blockIdx.x;
  uint32_t rank;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int spw = p.steps_per_warp, nst = spw / kSubSteps;
  const int j0 = warp * spw;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(pair_smem));
  const uint32_t xslots = base + uint32_t(warp) * (kPairSlots * kPairSlotBytes);
  const uint32_t bars = base + kPairXBytes + uint32_t(warp) * (kPairSlots * 16);
  auto full = [&](int h) { return bars + 8u * h; };
  auto empty = [&](int h) { return bars + 8u * (kPairSlots + h); };

  // Weights: stage q in ring half q & 1 (kSubSteps uint4 per lane), its group's scale block beside it.
  const uint4* wp = static_cast<const uint4*>(p.qw) + (size_t(strip) * p.nk32 + j0) * 32 + lane;
  const char* szp = static_cast<const char*>(p.sz) + size_t(strip) * kSzBlockBytes;
  const size_t szstride = size_t(p.strips) * kSzBlockBytes;
  uint4 wb[kPairSlots][kSubSteps];
  uint2 sbs[kPairSlots];
  uint32_t sbz[kPairSlots];
  auto load_w = [&](int q, auto h) {
    constexpr int H = decltype(h)::value;
#pragma unroll
    for (int r = 0; r < kSubSteps; ++r) wb[H][r] = LdStream(wp + (q * kSubSteps + r) * 32);
    const char* sz = szp + size_t((j0 + q * kSubSteps) / p.gsteps) * szstride;
    sbs[H] = __ldg(reinterpret_cast<const uint2*>(sz) + g);
    sbz[H] = __ldg(reinterpret_cast<const uint32_t*>(sz + kSzZeros) + g);
  };
  // Lane 0: this block's token tile (rows 8 * rank .. + 7; rows past M read zeros) of stage q's X into slot
  // q % kPairSlots of both blocks, as two boxes of 2 steps x 8 rows (128-byte swizzle): a slot is [step pair][tile]
  // [row][128 bytes], the 16-byte chunk c of row i at c ^ (i % 8).
  auto fill_x = [&](int q) {
    const int h = q % kPairSlots;
    const uint32_t slot = xslots + uint32_t(h) * kPairSlotBytes;
    MbarArriveExpectTx(full(h), kPairSlotBytes);  // both blocks' tiles land here
#pragma unroll
    for (int kh = 0; kh < 2; ++kh)
      TmaLoad2dToPair(slot + uint32_t(kh) * (kPairSlotBytes / 2) + rank * (kPairSlotBytes / 4), &xmap,
                      (j0 + q * kSubSteps + 2 * kh) * kStepK, 8 * int(rank), full(h));
  };

  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < kPairSlots; ++h) {
      MbarInit(full(h), 1);
      MbarInit(empty(h), 2);  // this warp and its partner in the other block
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // The weights do not depend on the previous kernel: both stages stream in while it finishes.
  load_w(0, std::integral_constant<int, 0>{});
  if (nst > 1) load_w(1, std::integral_constant<int, 1>{});
  // Both blocks' barriers exist before any copy lands on them.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
  GridDependencyWait();
  if (lane == 0)
    for (int q = 0; q < min(nst, kPairSlots); ++q) fill_x(q);

  float acc[NT][2][4], c[NT][2][4];
  ZeroAcc<NT>(acc);
  float scl[4];
  uint32_t nzm[4];
  // Lane (g, t) reads X rows g and 8 + g at k 8t..8t+7 of step r: chunk 4 (r % 2) + t of row g of box (r / 2, tile).
  auto xaddr = [&](uint32_t slot, int r, int nt) {
    return slot + uint32_t(r >> 1) * (kPairSlotBytes / 2) + uint32_t(nt) * (kPairSlotBytes / 4) + uint32_t(g) * 128u +
           (uint32_t((4 * (r & 1) + t) ^ g) << 4);
  };
  // Stage q: weights from ring half H = q & 1, X from slot q % kPairSlots.
  auto stage = [&](int q, auto h) {
    constexpr int H = decltype(h)::value;
    const int xs = q % kPairSlots, use = q / kPairSlots;
    const uint32_t slot = xslots + uint32_t(xs) * kPairSlotBytes;
    GroupRegs<T>(sbs[H], sbz[H], scl, nzm);
    MbarWait(full(xs), use & 1);
#pragma unroll
    for (int r = 0; r < kSubSteps; ++r) {
      const uint32_t wv[4] = {wb[H][r].x, wb[H][r].y, wb[H][r].z, wb[H][r].w};
      const uint4 xv[NT] = {LdShared16(xaddr(slot, r, 0)), LdShared16(xaddr(slot, r, 1))};
      StepMma<T, NT, false>(wv, xv, nzm, r == 0, c, acc);
    }
    Flush<NT>(scl, c, acc);
    if (q + 2 < nst) load_w(q + 2, h);
    if (q + kPairSlots < nst) {
      __syncwarp();  // every lane has read the slot
      if (lane == 0) {
        MbarArrive(empty(xs));
        MbarArrivePartner(empty(xs), rank);
        MbarWait(empty(xs), use & 1);  // the partner warp is done with the slot too
        fill_x(q + kPairSlots);
      }
      __syncwarp();
    }
  };
  for (int q = 0; q < nst; q += 2) {
    stage(q, std::integral_constant<int, 0>{});
    if (q + 1 < nst) stage(q + 1, std::integral_constant<int, 1>{});
  }

  // Every copy into this block was waited for, and the partner's last arrival here came before its last copy that
  // this block waited for: no cluster barrier is needed before the block's sum or its exit. The sum's floats take the
  // X slots once every warp is done with them.
  __syncthreads();
  const float unused[1] = {1.0f};
  BlockSum<T, NT, false>(reinterpret_cast<float*>(pair_smem), p, strip, warp, lane, acc, unused);
#endif
}

// X as a 2D tensor map of 16-bit elements (dim0 contiguous), boxes box0 x box1 with 128-byte swizzle, zeros past the
// edges; false where the driver lacks the encoder or rejects the layout.
inline bool EncodeMap2dSwizzled(CUtensorMap* map, const void* base, uint64_t dim0, uint64_t dim1, uint64_t stride1,
                                uint32_t box0, uint32_t box1) {
  const TensorMapEncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {dim0, dim1};
  const cuuint64_t strides[1] = {stride1};
  const cuuint32_t box[2] = {box0, box1};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(base), dims, strides, box, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether the paired kernel takes a launch (see the header comment); the device check is the launcher's.
inline bool UsePair(const QLinearParams& p) {
  const int strips = (p.N + kWarpN - 1) / kWarpN;
  return p.M > 8 && p.M <= kSmallMMaxRows && p.M >= pair_min_rows.load(std::memory_order_relaxed) &&
         p.splits == kMaxSplits && p.steps_per_warp % kSubSteps == 0 && p.gsteps % kSubSteps == 0 &&
         p.nk32 == kPairWarps * p.steps_per_warp && p.K == p.nk32 * kStepK && strips % 2 == 0;
}

// cudaErrorNotSupported, with nothing launched, where the paired kernel does not apply: the caller takes
// QLinearDirectKernel.
template <typename T>
cudaError_t LaunchQLinearPair(const QLinearParams& p, cudaStream_t stream) {
  if (!UsePair(p) || DeviceMajor() < 9) return cudaErrorNotSupported;
  CUtensorMap xmap;  // X as [M][K] 16-bit: boxes of 64 columns x 8 rows, 128-byte swizzle, zeros past M
  if (!EncodeMap2dSwizzled(&xmap, p.x, uint64_t(p.K), uint64_t(p.M), uint64_t(p.K) * 2, 64, 8)) return cudaErrorNotSupported;
  static std::atomic<int> optin[kMaxDevices] = {};  // the opt-in is set once per device
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= kMaxDevices) return cudaErrorNotSupported;
  if (optin[dev].load(std::memory_order_acquire) == 0) {
    int most = 0;
    cudaError_t e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return e;
    if (uint32_t(most) < kPairSmemBytes) return cudaErrorNotSupported;
    e = cudaFuncSetAttribute(QLinearPairKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPairSmemBytes));
    if (e != cudaSuccess) return e;
    optin[dev].store(1, std::memory_order_release);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.N + kWarpN - 1) / kWarpN);
  cfg.blockDim = dim3(32 * kPairWarps);
  cfg.dynamicSmemBytes = kPairSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  cfg.attrs = at;
  AddPdl(&cfg);
  cudaLaunchAttribute& cl = at[cfg.numAttrs++];
  cl.id = cudaLaunchAttributeClusterDimension;
  cl.val.clusterDim.x = 2;
  cl.val.clusterDim.y = 1;
  cl.val.clusterDim.z = 1;
  pair_launches.fetch_add(1, std::memory_order_relaxed);
  return cudaLaunchKernelEx(&cfg, QLinearPairKernel<T>, p, xmap);
}

}  // namespace flashq::gemm::detail
