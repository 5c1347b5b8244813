// Device views of the prepared weights and the kernel launchers (CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_tiles.h"

namespace flashq::gemm {

// Repacked int4 layout (see qlinear_kernel.cuh for the fragment order).
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
  void* xpack = nullptr;           // int4, M > 32 on sm_90: X packed for the wgmma kernel (qlinear_wgmma.cuh)
  int* counters = nullptr;         // [n_blocks * m_blocks], zero on entry and exit
  int M = 0, N = 0, K = 0, nk32 = 0, strips = 0, gsteps = 1, splits = 1, steps_per_warp = 0;
  int pairs = 1;                   // QLinearKernel: range pairs (splits) per block, set by the launcher
  int cluster = 0;                 // set by the launcher: split-K blocks of a tile form a cluster (sm_90)
  int* xready = nullptr;           // with xpack: [1 + packed stages], zero on entry and exit; the wgmma launcher keeps it
                                   // only where the device holds the whole grid at once (qlinear_wgmma.cuh)
  uint32_t wait_ns = 0;            // set by the wgmma launcher: how long a block of such a grid waits for the others
                                   // before its fallback (grid_wait_ns)
};

// The wgmma kernel's wait for the other blocks of a resident grid (in-kernel X packing, spread split sum) before it
// falls back to work that needs no other block; tests set 0 to run the fallbacks.
inline std::atomic<uint32_t> grid_wait_ns{1000000};

// A bench knob "NAME=n" in the environment, or `fallback` where it is not set.
inline int KnobInt(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : fallback;
}

// The staged small-M kernel (qlinear_staged.cuh) takes launches of at most kStagedMaxRows rows: one 8-token tile. With
// two it ran 0.5-0.7 µs slower than QLinearDirectKernel at 4096² M = 12-16 (H200,
// docs/perf/experiments.md). staged_max_rows lowers that (bench knob FLASHQ_GEMM_STAGED_MAX_M;
// tests set 0 to compare with QLinearDirectKernel); staged_launches counts its launches (tests check that it ran).
constexpr int kStagedMaxRows = 8;
inline std::atomic<int> staged_max_rows{KnobInt("FLASHQ_GEMM_STAGED_MAX_M", kStagedMaxRows)};
inline std::atomic<long> staged_launches{0};
// Launches of at most this many rows dequantize their first stage before griddepcontrol.wait, larger ones after it
// (qlinear_staged.cuh says why; bench knob FLASHQ_GEMM_STAGED_EARLY_M).
inline std::atomic<int> staged_dequant_first_rows{KnobInt("FLASHQ_GEMM_STAGED_EARLY_M", 1)};

// W8A16 launches of at most staged_fp8_max_rows rows (and kStagedMaxRows) take the staged kernel's fp8 form where it
// applies (qlinear_staged.cuh; bench knob FLASHQ_GEMM_STAGED_FP8_MAX_M; tests set 0 to compare with
// QLinearDirectKernel).
inline std::atomic<int> staged_fp8_max_rows{KnobInt("FLASHQ_GEMM_STAGED_FP8_MAX_M", kStagedMaxRows)};

// int4 small-M launches (stage flush, M <= kSmallMMaxRows) of 8-split plans on sm_90 that the staged kernel does not
// take run QLinearDirectKernel's strip pairs (2-block clusters). Bench knob FLASHQ_GEMM_NOPAIRS=1 turns them off (tests
// turn them off to compare); pair_launches counts their launches (tests check that they ran).
inline std::atomic<bool> strip_pairs{KnobInt("FLASHQ_GEMM_NOPAIRS", 0) == 0};
inline std::atomic<long> pair_launches{0};

// One launch covers at most kMaxRowsPerLaunch rows.
cudaError_t LaunchW4A16F16(const QLinearParams& p, cudaStream_t s);
cudaError_t LaunchW4A16Bf16(const QLinearParams& p, cudaStream_t s);
cudaError_t LaunchW4A16F16Step(const QLinearParams& p, cudaStream_t s);   // group of 1 k32 step (or odd)
cudaError_t LaunchW4A16Bf16Step(const QLinearParams& p, cudaStream_t s);
cudaError_t LaunchW8A16F16(const QLinearParams& p, cudaStream_t s);
cudaError_t LaunchW8A16Bf16(const QLinearParams& p, cudaStream_t s);

// aux_kernels.cu
cudaError_t LaunchGatherColumns(const void* x, int M, int K, const int32_t* perm, void* out, cudaStream_t s);
// y[m][n] = y[m][n] * row[m] * col[n] in fp32, in place (N % 8 == 0).
cudaError_t LaunchScaleRowsCols(void* y, ActType act, int M, int N, const float* row, const float* col, cudaStream_t s);
// Reads `bytes` of scratch buffer buf (a multiple of 16; in practice nothing is written): the L2 then holds
// clean lines of buf only.
cudaError_t LaunchReadThrough(void* buf, size_t bytes, cudaStream_t s);
cudaError_t LaunchDequantInt4(const W4A16Weights::View& v, ActType act, void* out /*[N][K]*/, cudaStream_t s);

}  // namespace detail
}  // namespace flashq::gemm
