// cuBLASLt wrapper: one handle, one workspace per stream, and a plan cache keyed by
// shape, types, scale mode and batch-invariant mode. cuBLASLt forbids one workspace for
// matmuls that may run at the same time, so each stream gets its own (ReserveStream at
// start-up, else allocated on the stream's first call). All GEMMs are "TN" in cuBLASLt's
// column-major terms: D[N x M] = op_T(W: K x N, ld K) · X(K x M, ld K), which is
// Y[M][N] = X · Wᵀ in row-major terms (the only layout FP8 supports on Hopper).
//
// W8A8 row/column-wise scales use cuBLASLt's outer-vector scale mode (A: N weight scales,
// B: M activation scales, applied in fp32 before the one 16-bit store).
// Batch-invariant mode pins one algorithm per (N, K, types, scale mode): the first
// heuristic candidate (asked for at a reference M) that, with split-K forced to 1,
// passes cublasLtMatmulAlgoCheck at M = 1, 16, 128 and 4096; every M then runs it.
// Otherwise each (N, K) times the heuristic's candidates once per bucket of M (the powers of two up
// to kTimeMaxM; M = 5-8 share the choice timed at the first of them), up to kCandidates allowed a
// workspace and kNoWsCandidates without one, on the first call of the bucket whose stream is not
// being captured, with that call's own operands (interleaved cold-L2 rounds, best of each); the
// faster of the heuristic's two first picks stays unless another candidate beats it by kMinGain.
// The other M of the bucket take that choice where cublasLtMatmulAlgoCheck accepts it at their M.
// A warm-up at BlasLtWarmupRows times every bucket at load, so that the request path never times.
// Larger M (and, until then, or if timing fails, every M) runs the heuristic's first. For W8A8
// row/column scales with BF16 output the candidates also include the unscaled GEMM
// followed by our scaling epilogue (LaunchScaleRowsCols), faster than the outer-vector
// kernels at small M (FP16 would overflow on the unscaled products).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

constexpr int kCandidates = 8;     // non-invariant mode: heuristic candidates timed per form (workspace allowed)
constexpr int kNoWsCandidates = 4; // ... and without workspace
constexpr int kRounds = 5;         // interleaved timing rounds of one cold-L2 run each (each candidate keeps its best)
// Another candidate replaces the default (the faster of the heuristic's first picks with and without workspace)
// only if this much faster in the timing: with 3% the choice sometimes kept an algorithm 5-10% slower than the
// heuristic's first in the streaming benchmark (the timing's
// conditions rank close candidates differently); the wins that matter (the unscaled GEMM + epilogue form at
// small M) are 30% and more (docs/perf/experiments.md).
constexpr float kMinGain = 0.10f;
// Only GEMMs of at most this many rows are timed: at larger M (compute-bound, long kernels) the ranking of a
// short timing burst did not hold in sustained runs on the H200 (power-limited clocks), the heuristic's did.
constexpr int kTimeMaxM = 256;
// The bucket whose timed choice M shares: M rounded up to a power of two (M <= kTimeMaxM).
int Bucket(int M) {
  int b = 1;
  while (b < M) b *= 2;
  return b;
}

struct Key {
  int M, N, K, in, out, mode;
  bool invariant;
  auto tie() const { return std::tie(M, N, K, in, out, mode, invariant); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// The device operands of one call (scales null unless the key has a scale mode).
struct Operands {
  const void* w;
  const void* x;
  void* y;
  const float* a_scale;  // kScalar: 1 float; kOuterVec: N floats
  const float* b_scale;  // kScalar: 1 float; kOuterVec: M floats
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ScaleMode mode = ScaleMode::kNone;  // desc's; kNone under a kOuterVec key: unscaled GEMM + epilogue
  cublasLtMatmulAlgo_t algo{};
  bool chosen = false;  // algo is set (invariant mode: always)
  bool timed = false;   // non-invariant mode: chosen by timing (or timing was tried and failed)
  std::mutex mu;        // guards the scale-pointer attributes between set and enqueue, and the choice
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

// One algorithm of one plan (a plan per scale form). first: the heuristic's first pick with or without workspace.
struct Candidate {
  Plan* plan;
  cublasLtMatmulAlgo_t algo;
  bool first = false;
};

// A timed choice, shared by the M of its bucket: the algorithm, and for a kOuterVec key whether it is the unscaled
// GEMM's (followed by the scaling epilogue).
struct Choice {
  cublasLtMatmulAlgo_t algo;
  bool unscaled = false;
};

cudaDataType_t ActCuda(ActType t) { return t == ActType::kF16 ? CUDA_R_16F : CUDA_R_16BF; }

bool Capturing(cudaStream_t s) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone;
}

}  // namespace

struct BlasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  size_t ws_bytes = 0;
  std::map<cudaStream_t, void*> workspaces;  // under mu
  void* scale_placeholder = nullptr;  // 256 B of device memory: the scale pointers of descriptors before a call sets them
  std::mutex mu;
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, cublasLtMatmulAlgo_t> pinned;  // invariant mode: key with M = 0
  std::map<Key, Choice> choices;               // non-invariant mode: key with M = Bucket(M), under mu

  ~Impl() {
    plans.clear();
    for (auto& [stream, ws] : workspaces) cudaFree(ws);
    if (scale_placeholder) cudaFree(scale_placeholder);
    if (handle) cublasLtDestroy(handle);
  }

  Status MakeLayouts(Plan* p, int M, int N, int K, cudaDataType_t in, cudaDataType_t out) {
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->a, in, K, N, K));
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->b, in, K, M, K));
    FQ_BLAS_RETURN(cublasLtMatrixLayoutCreate(&p->d, out, N, M, N));
    return Status::Ok();
  }

  Status MakeDesc(Plan* p, ScaleMode mode) {
    p->mode = mode;
    FQ_BLAS_RETURN(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (mode == ScaleMode::kOuterVec) {
      int32_t m = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &m, sizeof(m)));
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &m, sizeof(m)));
      // Heuristic queries and algorithm checks see vector scale pointers, as the calls will (Enqueue sets the
      // real ones): without them the algorithm pinned on the H200 failed at some M ("unsupported value").
      const void* ph = scale_placeholder;
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ph, sizeof(ph)));
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ph, sizeof(ph)));
    }
    return Status::Ok();
  }

  // Heuristic candidates for one (M, N, K) that need at most max_ws bytes of workspace.
  Status Candidates(const Key& k, cublasLtMatmulHeuristicResult_t* res, int want, int* got, size_t max_ws) {
    Plan p;
    FQ_RETURN_IF_ERROR(MakeDesc(&p, ScaleMode(k.mode)));
    FQ_RETURN_IF_ERROR(MakeLayouts(&p, k.M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)));
    cublasLtMatmulPreference_t pref;
    FQ_BLAS_RETURN(cublasLtMatmulPreferenceCreate(&pref));
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, want, res, got);
    cublasLtMatmulPreferenceDestroy(pref);
    FQ_BLAS_RETURN(st);
    if (*got == 0) return Internal("cuBLASLt: no algorithm for M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K));
    return Status::Ok();
  }

  bool Fits(const Key& k, int M, cublasLtMatmulAlgo_t algo, bool unscaled = false) {
    Plan p;
    if (!MakeDesc(&p, unscaled ? ScaleMode::kNone : ScaleMode(k.mode)).ok() ||
        !MakeLayouts(&p, M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)).ok())
      return false;
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
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
    FQ_RETURN_IF_ERROR(Candidates(ref, res, 16, &got, ws_bytes));
    for (int i = 0; i < got; ++i) {
      cublasLtMatmulAlgo_t algo = res[i].algo;
      int32_t one = 1;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
      int32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none));
      bool ok = true;
      for (int m : {1, 16, 128, 4096}) ok = ok && Fits(k, m, algo);
      if (ok) {
        pinned[pk] = algo;
        *out = algo;
        return Status::Ok();
      }
    }
    return Internal("cuBLASLt: no split-K-free algorithm valid for every M at N=" + std::to_string(k.N) + " K=" + std::to_string(k.K));
  }

  // The workspace of `stream`, allocated on its first use unless the stream is being captured
  // (cudaMalloc is not a capturable call: reserve such streams first).
  Status Workspace(cudaStream_t stream, void** out) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = workspaces.find(stream);
    if (it == workspaces.end()) {
      void* ws = nullptr;
      if (ws_bytes) {
        if (Capturing(stream))
          return Internal("cuBLASLt: stream is being captured and has no workspace (BlasLt::ReserveStream first)");
        FQ_CUDA_RETURN(cudaMalloc(&ws, ws_bytes));
      }
      it = workspaces.emplace(stream, ws).first;
    }
    *out = it->second;
    return Status::Ok();
  }

  // Finds or makes k's plan. Invariant plans get the pinned algorithm here; the others
  // get theirs from Choose (under the plan's own mutex, not this one).
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
      if (!Fits(k, k.M, p->algo)) return Internal("cuBLASLt: pinned algorithm rejects M=" + std::to_string(k.M));
      p->chosen = true;
    }
    *out = p.get();
    plans.emplace(k, std::move(p));
    return Status::Ok();
  }

  // One call of candidate c with workspace ws (the stream's); the unscaled form of a kOuterVec key adds the
  // scaling epilogue. Caller holds c.plan->mu.
  Status Enqueue(const Key& k, const Candidate& c, const Operands& o, void* ws, cudaStream_t stream) {
    Plan* p = c.plan;
    if (p->mode != ScaleMode::kNone) {
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &o.a_scale, sizeof(o.a_scale)));
      FQ_BLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &o.b_scale, sizeof(o.b_scale)));
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(handle, p->desc, &alpha, o.w, p->a, o.x, p->b, &beta, o.y, p->d, o.y, p->d, &c.algo,
                                             ws, ws_bytes, stream);
    if (st != CUBLAS_STATUS_SUCCESS)
      return Internal("cublasLtMatmul (M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K) +
                      ", scale mode " + std::to_string(int(p->mode)) + (k.invariant ? ", pinned" : "") + "): " + cublasLtGetStatusString(st));
    if (p->mode != ScaleMode(k.mode)) {
      const ActType act = k.out == int(CUDA_R_16F) ? ActType::kF16 : ActType::kBF16;
      FQ_CUDA_RETURN(detail::LaunchScaleRowsCols(o.y, act, k.M, k.N, o.b_scale, o.a_scale, stream));
    }
    return Status::Ok();
  }

  // Index of the fastest candidate, timed on `stream` with the call's operands (o.y is overwritten): every
  // candidate runs once untimed, then kRounds rounds time one run of each candidate between two events,
  // interleaved so that clock ramp-up does not favour late candidates; each keeps its best round. Before each
  // timed run the stream's workspace (64 MB in the server, more than the H200's L2) is read through, so the run
  // reads its weights from DRAM as a server streaming many layers does: timed on warm L2, the choice flipped
  // between calls between algorithms 15% apart when streaming; after a memset of the workspace (dirty L2) it
  // kept a 10% slower one (H200).
  // The faster of the heuristic's first picks (with and without workspace) stays unless another candidate is
  // kMinGain faster. 0 when timing fails.
  int Fastest(const Key& k, const std::vector<Candidate>& cands, const Operands& o, void* ws, cudaStream_t stream) {
    if (cands.size() < 2) return 0;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    std::vector<float> best_ms(cands.size(), -1.0f);
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
      std::vector<bool> ok(cands.size());
      for (size_t i = 0; i < cands.size(); ++i) ok[i] = Enqueue(k, cands[i], o, ws, stream).ok();
      for (int round = 0; round < kRounds; ++round)
        for (size_t i = 0; i < cands.size(); ++i) {
          if (!ok[i]) continue;
          bool good = (!ws || detail::LaunchReadThrough(ws, ws_bytes & ~size_t(15), stream) == cudaSuccess) &&
                      cudaEventRecord(e0, stream) == cudaSuccess && Enqueue(k, cands[i], o, ws, stream).ok();
          float ms = 0.0f;
          good = good && cudaEventRecord(e1, stream) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
                 cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
          if (!good) ok[i] = false;
          else if (best_ms[i] < 0.0f || ms < best_ms[i]) best_ms[i] = ms;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    int best = 0;
    for (size_t i = 1; i < cands.size(); ++i)
      if (cands[i].first && best_ms[i] >= 0.0f && (best_ms[best] < 0.0f || best_ms[i] < best_ms[best])) best = int(i);
    const float bar = best_ms[best] * (1.0f - kMinGain);
    for (size_t i = 1; i < cands.size(); ++i)
      if (!cands[i].first && best_ms[i] >= 0.0f && (best_ms[best] < 0.0f || (best_ms[i] < bar && best_ms[i] < best_ms[best])))
        best = int(i);
    return best;
  }

  // Non-invariant mode: sets p's algorithm (and, for a kOuterVec key, its form). With
  // operands on a stream that is not being captured, times the candidates once; otherwise
  // takes the heuristic's first (if p has none yet) and leaves the timing to a later call.
  // ws: the stream's workspace. Caller holds p->mu.
  Status Choose(const Key& k, Plan* p, const Operands* o, void* ws, cudaStream_t stream) {
    if (p->timed) return Status::Ok();
    Key bucket = k;
    bucket.M = Bucket(k.M);
    if (k.M <= kTimeMaxM) {  // another M of the bucket was timed: its choice, where it runs at this M
      std::optional<Choice> c;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = choices.find(bucket); it != choices.end()) c = it->second;
      }
      if (c && Fits(k, k.M, c->algo, c->unscaled)) {
        if (c->unscaled && p->mode != ScaleMode::kNone) {
          cublasLtMatmulDescDestroy(p->desc);
          p->desc = nullptr;
          FQ_RETURN_IF_ERROR(MakeDesc(p, ScaleMode::kNone));
        }
        p->algo = c->algo;
        p->chosen = p->timed = true;
        return Status::Ok();
      }
    }
    const bool can_time = o && k.M <= kTimeMaxM && !Capturing(stream);
    if (p->chosen && !can_time) return Status::Ok();
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int got = 0;
    FQ_RETURN_IF_ERROR(Candidates(k, res, can_time ? kCandidates : 1, &got, ws_bytes));
    std::vector<Candidate> cands;
    for (int i = 0; i < got; ++i) cands.push_back({p, res[i].algo, i == 0});
    // Timed candidates of key kk in plan pl: the heuristic's with the workspace limit (already in cands for k
    // itself) and its first kNoWsCandidates without workspace (for k, the first of these competes with the
    // heuristic's first as an equal: Fastest). At small M and long K the heuristic offers only
    // split-K algorithms (a second, reduction kernel) when it may use a workspace, and the workspace-free ones
    // can be faster (14336 x 4096 FP8 M = 32: 17.4 against 19.4 µs on the H200).
    auto add = [&](const Key& kk, Plan* pl, bool with_ws) {
      if (with_ws && Candidates(kk, res, kCandidates, &got, ws_bytes).ok())
        for (int i = 0; i < got; ++i) cands.push_back({pl, res[i].algo});
      if (!Candidates(kk, res, kNoWsCandidates, &got, 0).ok()) return;
      for (int i = 0; i < got; ++i) {
        bool dup = false;
        for (const Candidate& c : cands) dup = dup || (c.plan == pl && std::memcmp(&c.algo, &res[i].algo, sizeof(c.algo)) == 0);
        if (!dup) cands.push_back({pl, res[i].algo, pl == p && i == 0});
      }
    };
    if (can_time) add(k, p, false);
    Plan plain;  // kOuterVec key, BF16 out: the unscaled GEMM + epilogue form
    if (can_time && ScaleMode(k.mode) == ScaleMode::kOuterVec && k.out == int(CUDA_R_16BF)) {
      Key kp = k;
      kp.mode = int(ScaleMode::kNone);
      FQ_RETURN_IF_ERROR(MakeDesc(&plain, ScaleMode::kNone));
      FQ_RETURN_IF_ERROR(MakeLayouts(&plain, k.M, k.N, k.K, cudaDataType_t(k.in), cudaDataType_t(k.out)));
      add(kp, &plain, true);
    }
    const int best = can_time ? Fastest(k, cands, *o, ws, stream) : 0;
    if (cands[best].plan == &plain) {
      std::swap(p->desc, plain.desc);  // same layouts; plain now owns (and frees) the scaled desc
      p->mode = ScaleMode::kNone;
    }
    p->algo = cands[best].algo;
    p->chosen = true;
    p->timed = can_time;
    if (can_time) {
      std::lock_guard<std::mutex> lock(mu);
      choices.emplace(bucket, Choice{p->algo, p->mode != ScaleMode(k.mode)});
    }
    return Status::Ok();
  }

  Status Run(const Key& k, const Operands& o, cudaStream_t stream) {
    Plan* p = nullptr;
    FQ_RETURN_IF_ERROR(GetPlan(k, &p));
    void* ws = nullptr;
    FQ_RETURN_IF_ERROR(Workspace(stream, &ws));
    std::lock_guard<std::mutex> lock(p->mu);
    if (!k.invariant) FQ_RETURN_IF_ERROR(Choose(k, p, &o, ws, stream));
    return Enqueue(k, {p, p->algo}, o, ws, stream);
  }
};

BlasLt::BlasLt() = default;
BlasLt::~BlasLt() = default;

Status BlasLt::Create(size_t workspace_bytes, std::unique_ptr<BlasLt>* out) {
  std::unique_ptr<BlasLt> b(new BlasLt());
  b->impl_ = std::make_unique<Impl>();
  FQ_BLAS_RETURN(cublasLtCreate(&b->impl_->handle));
  FQ_CUDA_RETURN(cudaMalloc(&b->impl_->scale_placeholder, 256));
  b->impl_->ws_bytes = workspace_bytes;
  *out = std::move(b);
  return Status::Ok();
}

Status BlasLt::ReserveStream(cudaStream_t stream) {
  void* ws = nullptr;
  return impl_->Workspace(stream, &ws);
}

Status RunBf16(BlasLt* blas, const void* w, int N, int K, const LinearArgs& a, cudaStream_t stream) {
  if (!blas) return InvalidArgument("RunBf16: null BlasLt");
  if (a.M < 0 || N <= 0 || K <= 0) return InvalidArgument("RunBf16: bad shape");
  if (a.M == 0) return Status::Ok();
  if (!w || !a.x || !a.y) return InvalidArgument("RunBf16: null pointer");
  Key k{a.M, N, K, int(ActCuda(a.act)), int(ActCuda(a.act)), int(ScaleMode::kNone), a.batch_invariant};
  return blas->impl()->Run(k, {w, a.x, a.y, nullptr, nullptr}, stream);
}

std::vector<int> BlasLtWarmupRows(int max_rows) {
  std::vector<int> rows;
  for (int m = 1; m <= std::min(max_rows, kTimeMaxM); m *= 2) rows.push_back(m);
  return rows;
}

Status WarmBf16(BlasLt* blas, int M, int N, int K, ActType act, bool batch_invariant) {
  if (!blas) return InvalidArgument("WarmBf16: null BlasLt");
  Key k{M, N, K, int(ActCuda(act)), int(ActCuda(act)), int(ScaleMode::kNone), batch_invariant};
  Plan* p = nullptr;
  FQ_RETURN_IF_ERROR(blas->impl()->GetPlan(k, &p));
  if (batch_invariant) return Status::Ok();
  std::lock_guard<std::mutex> lock(p->mu);
  return blas->impl()->Choose(k, p, nullptr, nullptr, nullptr);
}

Status RunW8A8(BlasLt* blas, const Fp8DeviceWeights& w, const W8A8Args& a, cudaStream_t stream) {
  if (!blas) return InvalidArgument("RunW8A8: null BlasLt");
  const auto& v = w.view();
  if (!v.w) return InvalidArgument("RunW8A8: these FP8 weights were created for W8A16 only (Fp8Paths::kW8A16)");
  if (v.K % 16 != 0 || v.N % 16 != 0)
    return InvalidArgument("RunW8A8: cuBLASLt FP8 needs K and N multiples of 16 (K=" + std::to_string(v.K) + " N=" + std::to_string(v.N) + ")");
  if (a.M < 0) return InvalidArgument("RunW8A8: M must be >= 0");
  if (a.M == 0) return Status::Ok();
  if (!a.x_fp8 || !a.x_scale || !a.y) return InvalidArgument("RunW8A8: null pointer");
  // Tensor-wise: scalar scales. Otherwise outer-vector scales: w scale per column n (N
  // floats, per-tensor weights expanded), x scale per row m (M floats).
  const bool tensorwise = !w.per_channel() && !a.per_row_act;
  const ScaleMode mode = tensorwise ? ScaleMode::kScalar : ScaleMode::kOuterVec;
  Key k{a.M, v.N, v.K, int(CUDA_R_8F_E4M3), int(ActCuda(a.out)), int(mode), a.batch_invariant};
  return blas->impl()->Run(k, {v.w, a.x_fp8, a.y, tensorwise ? v.scale1 : v.scale_vec, a.x_scale}, stream);
}

}  // namespace flashq::gemm
