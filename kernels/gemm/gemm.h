// GPU quantized linear layers: Y[M][N] = X[M][K] · Wᵀ with W resident on the GPU.
//
// Weights are prepared once at load (Create: upload + repack into the layout the
// kernels read fastest); the Run* entry points never allocate: scratch comes from the
// caller's workspace (size from *WorkspaceBytes). All entry points return a Status;
// without CUDA they exist and return Unimplemented.
//
// batch_invariant (the server's default): row i of Y is bitwise identical whatever M is.
// Our kernels choose split-K and the K-order of accumulation from K and N only; the
// cuBLASLt paths pin one algorithm per (N, K, types) with split-K off. With it off,
// W4A16 may dequantize to 16-bit and call cuBLASLt for large M, and cuBLASLt calls take
// the fastest of a few algorithms timed per shape (see BlasLt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/gemm/dispatch.h"
#include "kernels/gemm/gemm_tiles.h"
#include "kernels/gemm/gemm_tuning.h"
#include "kernels/gemm/quant_formats.h"

#ifdef FLASHQ_HAVE_CUDA
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace flashq::gemm {

enum class ActType { kF16, kBF16 };  // 16-bit activation / output type

// cuBLASLt handle, a cuBLASLt workspace of workspace_bytes per stream and a plan cache keyed
// by shape. Thread-safe: calls on different streams may run at the same time (cuBLASLt forbids
// them one workspace). A stream's workspace is allocated on its first call; ReserveStream
// allocates it up front (at start-up, or before capturing the stream into a graph). Plans are made on first use of a
// shape; call WarmBf16() at load for the shapes you serve so that no heuristic query happens on the request path.
// Batch-invariant plans run the pinned algorithm. Non-invariant plans with M <= 256 are
// timed once per bucket of M (M rounded up to a power of two): the first call of the bucket whose stream is not being
// captured runs up to 12 heuristic candidates, with and without workspace (for W8A8 row/column scales, in both
// forms: see RunW8A8), 5 times each on its stream with its own operands and a cold L2,
// waits for them, and keeps the fastest if it clearly beats the heuristic's first picks;
// y is then written by the real call. The bucket's other M take that choice where it runs at their M. Calls at
// BlasLtWarmupRows at load time every bucket, so that the request path never does. Larger M, and every plan until it
// is timed (warm-up, capture) or if timing fails, run the heuristic's first candidate.
class BlasLt {
 public:
  static Status Create(size_t workspace_bytes, std::unique_ptr<BlasLt>* out);
  Status ReserveStream(cudaStream_t stream);
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  BlasLt();
  std::unique_ptr<Impl> impl_;
};

// Common arguments of one linear call. x: [M][K], y: [M][N], both row-major, 16-bit `act`.
struct LinearArgs {
  const void* x = nullptr;
  void* y = nullptr;
  int M = 0;
  ActType act = ActType::kBF16;
  bool batch_invariant = true;
  void* workspace = nullptr;  // device scratch (see *WorkspaceBytes); 256-byte aligned
  size_t workspace_bytes = 0;
  GemmTuning tuning;  // our kernels' dispatch (the defaults are the shipped choices)
};

// ---- W4A16: group-wise int4 weights (GPTQ / AWQ / RTN), 16-bit activations ----
// Kernel limits (errors name them): K % 8 == 0 (16-byte activation rows); group_size a
// multiple of 32 or == K (channelwise); act-order g_idx must give each group at most
// group_size channels and groups in order after sorting. N and K need not be multiples
// of the tile or of the group size (padded at load).
class W4A16Weights {
 public:
  // tuning.target_warps sets the split-K plan (PlanFor).
  static Status Create(const Int4Weights& w, std::unique_ptr<W4A16Weights>* out, const GemmTuning& tuning = {});
  // Device-to-device copy (another replica on the current device; benchmarks rotate copies).
  Status Clone(std::unique_ptr<W4A16Weights>* out) const;
  ~W4A16Weights();
  int K() const { return K_; }
  int N() const { return N_; }
  bool act_order() const { return perm_ != nullptr; }
  size_t device_bytes() const { return bytes_; }
  struct View;  // device pointers (defined in the CUDA sources)
  const View& view() const { return *view_; }

 private:
  W4A16Weights() = default;
  int K_ = 0, N_ = 0;
  size_t bytes_ = 0;
  int32_t* perm_ = nullptr;
  std::unique_ptr<View> view_;
};
// Scratch for RunW4A16 with M up to max_m rows (split-K partials, act-order gather, X packed for
// the sm_90 wgmma kernel at M > 32, and the 16-bit dequantized copy of W for the non-invariant
// large-M path).
size_t W4A16WorkspaceBytes(const W4A16Weights& w, int max_m, bool batch_invariant);
// Which kernel takes a launch: dispatch.h (a warm-up at WarmupRows(max_m) loads every kernel a layer can reach).
// M at or above which the non-invariant mode dequantizes W and calls cuBLASLt.
constexpr int kW4A16DequantMinM = 256;
// blas may be null when batch_invariant or M < kW4A16DequantMinM.
// The workspace must be zero-filled once before first use (kernels leave it zeroed), and serves one weight (and
// stream) at any M up to the max_m it was sized for: other weights' layouts put data where its words must stay zero.
Status RunW4A16(const W4A16Weights& w, const LinearArgs& a, BlasLt* blas, cudaStream_t stream);

// ---- 16-bit weights in the batch-invariant mode (our kernel, sm_90a) ----
// y = x · wᵀ with w [N][K] of the activation type, row-major on the device (the checkpoint's layout, no repacking).
// Each output is one fp32 chain over K's k16 chunks in order (two, added in order, on narrow layers of long rows),
// whatever M (invariant_gemm_kernel.cuh), so row i of y is bitwise the same for any M. Needs K % 8 == 0, N % 8 == 0 and
// 16-byte aligned x, w and y; no workspace (a.workspace is not read). Unimplemented on GPUs other than sm_90 (callers
// keep cuBLASLt's pinned algorithm there). RunW8A8Invariant is its W8A8 form (below).
Status RunW16Invariant(const void* w, int N, int K, const LinearArgs& a, cudaStream_t stream);

// ---- FP8 E4M3 weights: W8A16 (our kernel) and W8A8 (cuBLASLt) ----
// The paths a set of FP8 weights serves. Each keeps its own copy on the GPU (W8A8 the [N][K] E4M3 matrix that cuBLASLt
// reads, W8A16 our kernel's repacked words), so weights made for one path take half the memory of kBoth; the other
// path's Run* call then returns InvalidArgument.
enum class Fp8Paths { kBoth, kW8A16, kW8A8 };
class Fp8DeviceWeights {
 public:
  static Status Create(const Fp8Weights& w, std::unique_ptr<Fp8DeviceWeights>* out, Fp8Paths paths = Fp8Paths::kBoth,
                       const GemmTuning& tuning = {});
  Status Clone(std::unique_ptr<Fp8DeviceWeights>* out) const;
  ~Fp8DeviceWeights();
  int K() const { return K_; }
  int N() const { return N_; }
  bool per_channel() const { return per_channel_; }
  Fp8Paths paths() const;  // from the copies the weights hold
  size_t device_bytes() const { return bytes_; }
  struct View;
  const View& view() const { return *view_; }

 private:
  Fp8DeviceWeights() = default;
  int K_ = 0, N_ = 0;
  bool per_channel_ = false;
  size_t bytes_ = 0;
  std::unique_ptr<View> view_;
};
size_t W8A16WorkspaceBytes(const Fp8DeviceWeights& w, int max_m);
// The workspace: as RunW4A16's.
Status RunW8A16(const Fp8DeviceWeights& w, const LinearArgs& a, cudaStream_t stream);

// W8A8: x_fp8 [M][K] E4M3 with x_scale (device, M floats; all equal for per-tensor).
// Tensor-wise mode (weights per-tensor and !per_row_act): cuBLASLt scalar scales. Otherwise
// (weights per channel and/or activations per row) cuBLASLt's outer-vector scales
// (x_scale[m] * w_scale[n] in fp32, one 16-bit rounding). For BF16 outputs, non-invariant
// mode may instead run the GEMM unscaled into y and scale y in place (two roundings) when
// that timed faster for the shape, as it does at small M; not for FP16, which the unscaled
// products (up to 448^2 * K) overflow. Needs K % 16 == 0, N % 16 == 0.
// Per-tensor activation scales depend on the whole batch: only per_row_act is batch-invariant.
struct W8A8Args {
  const uint8_t* x_fp8 = nullptr;
  const float* x_scale = nullptr;
  bool per_row_act = true;
  void* y = nullptr;
  int M = 0;
  ActType out = ActType::kBF16;
  bool batch_invariant = true;
  GemmTuning tuning;  // RunW8A8Invariant's tile override (sweeps)
};
Status RunW8A8(BlasLt* blas, const Fp8DeviceWeights& w, const W8A8Args& a, cudaStream_t stream);
// W8A8 on our invariant GEMM (sm_90a): the same operands and result as RunW8A8, y = (x · wᵀ) * (x_scale[m] *
// w_scale[n]) with one 16-bit rounding (per_row_act false: x_scale[0] for every m; per-tensor weights use their
// expanded scale), the same chains over K's k32 chunks whatever M, in Hopper's fast FP8 accumulation
// (docs/perf/gemm.md). Needs weights with the W8A8 copy, K % 16 == 0, N % 8 == 0; a.batch_invariant is ignored (always
// invariant). Unimplemented off sm_90.
Status RunW8A8Invariant(const Fp8DeviceWeights& w, const W8A8Args& a, cudaStream_t stream);
// A W8A8 caller's workspace for quantizing M <= max_m rows of K activations: xq [M][K] E4M3 at offset 0, then the M
// row scales (256-byte aligned). A static input scale sits after the largest call's xq (max_m rows), so that no
// call's xq reaches it.
struct W8A8Workspace {
  size_t xq = 0, scale = 0;
};
size_t W8A8WorkspaceBytes(int K, int max_m);
W8A8Workspace W8A8WorkspaceLayout(int K, int max_m, int M, bool static_scale);
// Dynamic activation quantization: the same bits as QuantizeActFp8 on the host.
// scale: M floats (per-tensor: every entry holds the tensor scale).
Status RunQuantizeActFp8(const void* x, ActType act, int M, int K, bool per_row, uint8_t* xq, float* scale,
                            cudaStream_t stream);
// Static activation quantization (a checkpoint's input_scale): xq = satfinite_rn(x / scale[m])
// with scale given (device, M floats, all the static scale); the same bits as the host's
// FloatToFp8E4M3(x / scale). Batch-invariant: the scale does not depend on the batch.
Status RunQuantizeActFp8Static(const void* x, ActType act, int M, int K, const float* scale, uint8_t* xq,
                                   cudaStream_t stream);

// ---- 16-bit baseline through cuBLASLt ----
// w: device [N][K] in a.act's type. Plans are cached per (M, N, K, type, mode).
// Non-invariant mode: the first call of a bucket of M may run the GEMM several times (timing; see BlasLt).
Status RunBf16(BlasLt* blas, const void* w, int N, int K, const LinearArgs& a, cudaStream_t stream);
// Resolves (and caches) the plan for a shape ahead of time: cold start, not request path.
// Non-invariant plans get their bucket's timed choice here if it has one that runs at M, else the heuristic's first
// algorithm (M <= 256: timed by the first call with operands).
Status WarmBf16(BlasLt* blas, int M, int N, int K, ActType act, bool batch_invariant);
// One row count per bucket of BlasLt's timed choices up to max_rows, ascending: calls at each (with operands) time
// every bucket a non-invariant layer can reach.
std::vector<int> BlasLtWarmupRows(int max_rows);

}  // namespace flashq::gemm
