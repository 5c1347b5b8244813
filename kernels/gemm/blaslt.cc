// cuBLASLt wrapper: one handle, a preallocated workspace, and a plan cache keyed by
// shape, types, scale mode and batch-invariant mode. All GEMMs are "TN" in cuBLASLt's
// column-major terms: D[N x M] = op_T(W: K x N, ld K) · X(K x M, ld K), which is
// Y[M][N] = X · Wᵀ in row-major terms (the only layout FP8 supports on Hopper).
//
// W8A8 row-wise scales run unscaled plus a scaling epilogue (see run_w8a8).
// Batch-invariant mode pins one algorithm per (N, K, types, scale mode): the first
// heuristic candidate (asked for at a reference M) that, with split-K forced to 1,
// passes cublasLtMatmulAlgoCheck at M = 1, 16, 128 and 4096; every M then runs it.
// Otherwise each (M, N, K) gets the heuristic's first choice.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/common/cuda_check.h"
#include "kernels/gemm/gemm_internal.h"

namespace flashq::gemm {
namespace {

Status BlasStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(std::string(call) + ": " + cublasLtGetStatusString(s));
}
#define FQ_BLAS_RETURN(call) FQ_RETURN_IF_ERROR(BlasStatus((call), #call))

enum class ScaleMode { kNone, kScalar, kOuterVec };

struct Key {
  int M, N, K, in, out, mode;
  bool invariant;
  auto tie() const { return std::tie(M, N, K, in, out, mode, invariant); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t ws = 0;
  std::mutex mu;  // guards the scale-pointer attributes between set and enqueue
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

cudaDataType_t ActCuda(ActType t) { return t == ActType::kF16 ? CUDA_R_16F : CUDA_R_16BF; }

}  // namespace

struct BlasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t ws_bytes = 0;
  std::mutex mu;
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, cublasLtMatmulAlgo_t> pinned;  // invariant mode: key with M = 0

  ~Impl() {
    plans.clear();
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  Status MakeLayouts(Plan* p, int M, int N, int K, cudaDataType_t in, cudaDataType_t out) {
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->a, in, K, N, K));
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->b, in, K, M, K));
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->d, out, N, M, N));
    return Status::Ok();
  }

  Status MakeDesc(Plan* p, ScaleMode mode) {
    FQ_BLAS_RETURN(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (mode == ScaleMode::kOuterVec) {
      int32_t m = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &m, sizeof(m)));
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &m, sizeof(m)));
    }
    return Status::Ok();
  }

  // Heuristic candidates for one (M, N, K).
  Status Candidates(const Key& k, cublasLtMatmulHeuristicResult_t* res, int want, int* got) {
    Plan p;
    FQ_RETURN_IF_ERROR(MakeDesc(&p, ScaleMode(k.mode)));
    FQ_RETURN_IF_ERROR(MakeLayouts(&p, k.M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)));
    cublasLtMatmulPreference_t pref;
    FQ_BLAS_RETURN(cublasLtMatmulPreferenceCreate(&pref));
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, want, res, got);
    cublasLtMatmulPreferenceDestroy(pref);
    FQ_BLAS_RETURN(st);
    if (*got == 0) return Internal("cuBLASLt: no algorithm for M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K));
    return Status::Ok();
  }

  bool Fits(const Key& k, int M, cublasLtMatmulAlgo_t algo, size_t* ws) {
    Plan p;
    if (!MakeDesc(&p, ScaleMode(k.mode)).ok() || !MakeLayouts(&p, M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)).ok())
      return false;
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
    if (ws) *ws = r.workspaceSize;
    return r.workspaceSize <= ws_bytes;
  }

  Status PinnedAlgo(const Key& k, cublasLtMatmulAlgo_t* out) {
    Key pk = k;
    pk.M = 0;
    auto it = pinned.find(pk);
    if (it != pinned.end()) {
      *out = it->second;
      return Status::Ok();
    }
    Key ref = k;
    ref.M = 1024;
    cublasLtMatmulHeuristicResult_t res[16];
    int got = 0;
    FQ_RETURN_IF_ERROR(Candidates(ref, res, 16, &got));
    for (int i = 0; i < got; ++i) {
      cublasLtMatmulAlgo_t algo = res[i].algo;
      int32_t one = 1;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
      int32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none));
      bool ok = true;
      for (int m : {1, 16, 128, 4096}) ok = ok && Fits(k, m, algo, nullptr);
      if (ok) {
        pinned[pk] = algo;
        *out = algo;
        return Status::Ok();
      }
    }
    return Internal("cuBLASLt: no split-K-free algorithm valid for every M at N=" + std::to_string(k.N) + " K=" + std::to_string(k.K));
  }

  Status GetPlan(const Key& k, Plan** out) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(k);
    if (it != plans.end()) {
      *out = it->second.get();
      return Status::Ok();
    }
    auto p = std::make_unique<Plan>();
    FQ_RETURN_IF_ERROR(MakeDesc(p.get(), ScaleMode(k.mode)));
    FQ_RETURN_IF_ERROR(MakeLayouts(p.get(), k.M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)));
    if (k.invariant) {
      FQ_RETURN_IF_ERROR(PinnedAlgo(k, &p->algo));
      if (!Fits(k, k.M, p->algo, &p->ws)) return Internal("cuBLASLt: pinned algorithm rejects M=" + std::to_string(k.M));
    } else {
      cublasLtMatmulHeuristicResult_t r{};
      int got = 0;
      FQ_RETURN_IF_ERROR(Candidates(k, &r, 1, &got));
      p->algo = r.algo;
      p->ws = r.workspaceSize;
    }
    *out = p.get();
    plans.emplace(k, std::move(p));
    return Status::Ok();
  }

  Status Run(const Key& k, const void* w, const void* x, void* y, const float* a_scale, const float* b_scale,
             cudaStream_t stream) {
    Plan* p = nullptr;
    FQ_RETURN_IF_ERROR(GetPlan(k, &p));
    const float alpha = 1.0f, beta = 0.0f;
    std::lock_guard<std::mutex> lock(p->mu);
    if (ScaleMode(k.mode) != ScaleMode::kNone) {
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    }
    FQ_BLAS_RETURN(cublasLtMatmul(handle, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d, &p->algo, workspace,
                                  ws_bytes, stream));
    return Status::Ok();
  }
};

BlasLt::BlasLt() = default;
BlasLt::~BlasLt() = default;

Status BlasLt::Create(size_t workspace_bytes, std::unique_ptr<BlasLt>* out) {
  std::unique_ptr<BlasLt> b(new BlasLt());
  b->impl_ = std::make_unique<Impl>();
  FQ_BLAS_RETURN(cublasLtCreate(&b->impl_->handle));
  if (workspace_bytes) FQ_CUDA_RETURN(cudaMalloc(&b->impl_->workspace, workspace_bytes));
  b->impl_->ws_bytes = workspace_bytes;
  *out = std::move(b);
  return Status::Ok();
}

Status run_bf16(BlasLt* blas, const void* w, int N, int K, const LinearArgs& a, cudaStream_t stream) {
  if (!blas) return InvalidArgument("run_bf16: null BlasLt");
  if (a.M < 0 || N <= 0 || K <= 0) return InvalidArgument("run_bf16: bad shape");
  if (a.M == 0) return Status::Ok();
  if (!w || !a.x || !a.y) return InvalidArgument("run_bf16: null pointer");
  Key k{a.M, N, K, int(ActCuda(a.act)), int(ActCuda(a.act)), int(ScaleMode::kNone), a.batch_invariant};
  return blas->impl()->Run(k, w, a.x, a.y, nullptr, nullptr, stream);
}

Status WarmBf16(BlasLt* blas, int M, int N, int K, ActType act, bool batch_invariant) {
  if (!blas) return InvalidArgument("WarmBf16: null BlasLt");
  Key k{M, N, K, int(ActCuda(act)), int(ActCuda(act)), int(ScaleMode::kNone), batch_invariant};
  Plan* p = nullptr;
  return blas->impl()->GetPlan(k, &p);
}

Status run_w8a8(BlasLt* blas, const Fp8DeviceWeights& w, const W8A8Args& a, cudaStream_t stream) {
  if (!blas) return InvalidArgument("run_w8a8: null BlasLt");
  const auto& v = w.view();
  if (v.K % 16 != 0 || v.N % 16 != 0)
    return InvalidArgument("run_w8a8: cuBLASLt FP8 needs K and N multiples of 16 (K=" + std::to_string(v.K) + " N=" + std::to_string(v.N) + ")");
  if (a.M < 0) return InvalidArgument("run_w8a8: M must be >= 0");
  if (a.M == 0) return Status::Ok();
  if (!a.x_fp8 || !a.x_scale || !a.y) return InvalidArgument("run_w8a8: null pointer");
  const bool tensorwise = !w.per_channel() && !a.per_row_act;
  if (tensorwise) {
    Key k{a.M, v.N, v.K, int(CUDA_R_8F_E4M3), int(ActCuda(a.out)), int(ScaleMode::kScalar), a.batch_invariant};
    return blas->impl()->Run(k, v.w, a.x_fp8, a.y, v.scale1, a.x_scale, stream);
  }
  // Row/column-wise: cuBLASLt 13.0 rejects outer-vector scale modes for FP8 on Hopper
  // ("unsupported value"), so the GEMM runs unscaled into y (16-bit) and a small
  // epilogue multiplies by x_scale[m] * w_scale[n] in fp32 (one extra 16-bit rounding).
  Key k{a.M, v.N, v.K, int(CUDA_R_8F_E4M3), int(ActCuda(a.out)), int(ScaleMode::kNone), a.batch_invariant};
  FQ_RETURN_IF_ERROR(blas->impl()->Run(k, v.w, a.x_fp8, a.y, nullptr, nullptr, stream));
  FQ_CUDA_RETURN(detail::LaunchScaleRowsCols(a.y, a.out, a.M, v.N, a.x_scale, v.scale_vec, stream));
  return Status::Ok();
}

}  // namespace flashq::gemm
