// Device views of the prepared weights and the kernel launchers (CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_tiles.h"

namespace flashq::gemm {

// Repacked int4 layout (see qlinear_fragment.cuh for the fragment order).
struct W4A16Weights::View {
  const void* qw = nullptr;        // uint4 [strips][nk32][32 lanes]
  const void* sz = nullptr;        // 96 B [G][strips]: fp16 scales [8][4], uint8 zeros [8][4]
  const int32_t* perm = nullptr;   // [K] act-order: packed position p holds channel perm[p]
  int K = 0, N = 0, nk32 = 0, strips = 0, groups = 0, gsteps = 0;
  SplitPlan plan;
  void* alloc = nullptr;           // one device allocation for all of the above
};

struct Fp8DeviceWeights::View {
  const uint8_t* w = nullptr;       // [N][K] E4M3 (cuBLASLt W8A8)
  const float* scale_vec = nullptr; // [N] (per-tensor expanded)
  const float* scale1 = nullptr;    // [1] per-tensor scale (W8A8 tensor-wise); null when per channel
  const void* qw = nullptr;         // uint4 [strips][nk32][2][32]  (W8A16)
  const float* fscales = nullptr;   // fp32 [strips][8][4]         (W8A16)
  int K = 0, N = 0, nk32 = 0, strips = 0;
  SplitPlan plan;
  void* alloc = nullptr;
};

namespace detail {

struct QLinearParams {
  const void* x = nullptr;         // [M][K] activations (act-order: already permuted)
  void* y = nullptr;               // [M][N]
  const void* qw = nullptr;
  const void* sz = nullptr;          // int4 scales + zeros blocks
  const float* fscales = nullptr;    // fp8
  float* partial = nullptr;        // [splits][M][N] when splits > 1
  void* xpack = nullptr;           // int4, M > 32 on sm_90: X packed for the wgmma kernel (qlinear_wgmma_kernel.cuh)
  int* counters = nullptr;         // [n_blocks * m_blocks], zero on entry and exit
  int M = 0, N = 0, K = 0, nk32 = 0, strips = 0, gsteps = 1, splits = 1, steps_per_warp = 0;
  int pairs = 1;                   // QLinearKernel: range pairs (splits) per block, set by the launcher
  int cluster = 0;                 // set by the launcher: split-K blocks of a tile form a cluster (sm_90)
  int* xready = nullptr;           // with xpack: [1 + packed stages], zero on entry and exit; the wgmma launcher keeps it
                                   // only where the device holds the whole grid at once (qlinear_wgmma_kernel.cuh)
  uint32_t wait_ns = 0;            // set by the wgmma launcher: how long a block of such a grid waits for the others
                                   // before its fallback (GemmTuning::grid_wait_ns)
};

// The launchers of inst/, one file per (weight format, activation type, flush): qlinear_launch.cuh's LaunchQLinear
// for that instantiation. One launch covers at most kMaxRowsPerLaunch rows. Stage flush: int4 groups of a multiple of
// kSubSteps k32 steps; step flush: the other group sizes.
cudaError_t LaunchInt4F16StageFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInt4Bf16StageFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInt4F16StepFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInt4Bf16StepFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchFp8F16(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchFp8Bf16(const QLinearParams& p, const GemmTuning& t, cudaStream_t s);
// The invariant GEMM (invariant_gemm_kernel.cuh), one file per (input, output) type under inst/;
// cudaErrorNotSupported off sm_90 or without a TMA encoder. Scales: W8A8 only.
struct InvariantGemmArgs {
  const void* w = nullptr;  // [N][K]
  const void* x = nullptr;  // [M][K]
  void* y = nullptr;        // [M][N]
  const float* x_scale = nullptr;  // [M] (x_scale_stride 1) or one tensor-wise scale (stride 0)
  int x_scale_stride = 1;
  const float* w_scale = nullptr;  // [N]
  int M = 0, N = 0, K = 0;
};
cudaError_t LaunchInvariantW16F16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInvariantW16Bf16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInvariantW8A8F16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s);
cudaError_t LaunchInvariantW8A8Bf16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s);

// linear_helper_kernels.cu
cudaError_t LaunchGatherColumns(const void* x, int M, int K, const int32_t* perm, void* out, cudaStream_t s);
// y[m][n] = y[m][n] * row[m] * col[n] in fp32, in place (N % 8 == 0).
cudaError_t LaunchScaleRowsCols(void* y, ActType act, int M, int N, const float* row, const float* col, cudaStream_t s);
// Reads `bytes` of scratch buffer buf (a multiple of 16; in practice nothing is written): the L2 then holds
// clean lines of buf only.
cudaError_t LaunchReadThrough(void* buf, size_t bytes, cudaStream_t s);
cudaError_t LaunchDequantInt4(const W4A16Weights::View& v, ActType act, void* out /*[N][K]*/, cudaStream_t s);

}  // namespace detail
}  // namespace flashq::gemm
