// Linear layers on the GPU: every layer has a replica per GPU and batches go round-robin.
// Rows go in chunks of max_rows; rows are independent, so chunking keeps batch invariance.
#include <algorithm>
#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/common/convert.h"
#include "kernels/gemm/gemm.h"
#include "server/backends/cuda/executors.h"
#include "server/backends/cuda/staging.h"

namespace flashq::server {
namespace {

class CudaLinear : public LinearExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<CudaLinear>> Create(Contexts& ctx, ServerMetrics& m, const LinearWeights& w,
                                                            bool invariant) {
    std::unique_ptr<CudaLinear> e(new CudaLinear(ctx, m, w, invariant));
    e->max_rows_ = invariant ? 256 : 4096;
    // Batch-invariant BF16 and W8A8 layers run our invariant GEMM where every GPU can (sm_90) and the shape fits it,
    // else cuBLASLt's pinned algorithm; the choice is per layer, made once, so a layer's bits never change path.
    const bool bf16 = w.format == WeightFormat::kBf16, w8a8 = w.format == WeightFormat::kFp8 && w.fp8_activations;
    e->own_gemm_ = invariant && (bf16 || w8a8) && w.K % (bf16 ? 8 : 16) == 0 && w.N % 8 == 0;
    for (auto& d : ctx) {
      int major = 0;
      FQ_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d->device()));
      e->own_gemm_ = e->own_gemm_ && major == 9;
    }
    for (auto& d : ctx) {
      FQ_CUDA_OK(cudaSetDevice(d->device()));
      // Held by the executor from the start, so that a load failing half-way still frees
      // what it took (the destructor).
      Replica& r = e->replicas_.emplace_back();
      switch (w.format) {
        case WeightFormat::kBf16: {
          auto p = d->arena().Allocate(w.bf16.size() * 2, "bf16 weights");
          if (!p.ok()) {  // large weights may live outside the arena; they are allocated at load only
            FQ_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&r.bf16), w.bf16.size() * 2));
            r.own_bf16 = true;
          } else {
            r.bf16 = *p;
          }
          FQ_CUDA_OK(cudaMemcpy(r.bf16, w.bf16.data(), w.bf16.size() * 2, cudaMemcpyHostToDevice));
          break;
        }
        case WeightFormat::kInt4:
          if (auto s = FromKernel(gemm::W4A16Weights::Create(w.int4, &r.w4)); !s.ok()) return s;
          r.ws_bytes = gemm::W4A16WorkspaceBytes(*r.w4, e->max_rows_, invariant);
          break;
        case WeightFormat::kFp8:
          // Only the copy of the path this model runs (W8A8 or W8A16) goes to the GPU.
          if (auto s = FromKernel(gemm::Fp8DeviceWeights::Create(
                  w.fp8, &r.fp8, w.fp8_activations ? gemm::Fp8Paths::kW8A8 : gemm::Fp8Paths::kW8A16));
              !s.ok())
            return s;
          r.ws_bytes = w.fp8_activations ? gemm::W8A8WorkspaceBytes(w.K, e->max_rows_) : gemm::W8A16WorkspaceBytes(*r.fp8, e->max_rows_);
          break;
      }
      if (!w.bias.empty()) {
        auto p = d->arena().Allocate(w.bias.size() * 4, "linear bias");
        if (!p.ok()) return p.status();
        r.bias = reinterpret_cast<float*>(*p);
        FQ_CUDA_OK(cudaMemcpy(r.bias, w.bias.data(), w.bias.size() * 4, cudaMemcpyHostToDevice));
      }
      // One zero-filled workspace per stream, so concurrent batches never share scratch.
      for (int s = 0; s < d->num_slots(); ++s) {
        char* ws = nullptr;
        if (r.ws_bytes) {
          auto p = d->arena().Allocate(r.ws_bytes, "linear workspace");
          if (!p.ok()) return p.status();
          ws = *p;
          FQ_CUDA_OK(cudaMemset(ws, 0, r.ws_bytes));
          if (w.format == WeightFormat::kFp8 && w.fp8_activations && w.fp8_input_scale > 0) {
            // A static activation scale: its row scales are written once, after the largest xq.
            const std::vector<float> scales(e->max_rows_, w.fp8_input_scale);
            const size_t at = gemm::W8A8WorkspaceLayout(w.K, e->max_rows_, e->max_rows_, /*static_scale=*/true).scale;
            FQ_CUDA_OK(cudaMemcpy(ws + at, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
          }
        }
        r.workspace.push_back(ws);
      }
    }
    FQ_CUDA_OK(cudaDeviceSynchronize());
    return e;
  }

  // Runs once the model's workers have stopped, so no kernel still reads these.
  ~CudaLinear() override {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      Replica& r = replicas_[i];
      DeviceArena& arena = ctx_[i]->arena();
      if (r.own_bf16) cudaFree(r.bf16);
      else arena.Free(r.bf16);
      arena.Free(r.bias);
      for (char* ws : r.workspace) arena.Free(ws);
    }
  }

  // The row counts that reach every kernel this layer can run, up to the largest the server uses: one per tile of
  // the invariant GEMM on any of the GPUs, else gemm::WarmupRows; and outside the invariant mode one per bucket of
  // cuBLASLt's timed choices, so that no request waits for a timing.
  absl::StatusOr<std::vector<int>> WarmupRows() const {
    std::vector<int> rows = invariant_ ? std::vector<int>{} : gemm::BlasLtWarmupRows(max_rows_);
    if (!own_gemm_) {
      for (int m : gemm::WarmupRows(max_rows_)) rows.push_back(m);
    } else {
      const int64_t k_bytes = int64_t(K_) * (format_ == WeightFormat::kBf16 ? 2 : 1);
      for (auto& d : ctx_) {
        int sms = 0;
        FQ_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->device()));
        for (int m : gemm::InvariantWarmupRows(max_rows_, k_bytes, N(), sms)) rows.push_back(m);
      }
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    return rows;
  }

  using LinearExecutor::Run;
  absl::Status Run(DType dtype, int M, const Gather& x, const Scatter& y, StageTimes* times) override {
    return RunOn(next_++ % replicas_.size(), dtype, M, x, y, times);
  }

  absl::Status RunOn(size_t dev, DType dtype, int M, const Gather& x_in, const Scatter& y_out, StageTimes* times) {
    DeviceContext& d = *ctx_[dev];
    Replica& r = replicas_[dev];
    // BF16 weights go through cuBLASLt in BF16, so other activations are converted to it.
    const DType kdt = format_ == WeightFormat::kBf16 ? DType::kBF16 : KernelDType(dtype);
    const gemm::ActType act = kdt == DType::kBF16 ? gemm::ActType::kBF16 : gemm::ActType::kF16;
    // The type the GPU writes Y in: W8A8's GEMM always writes BF16 (see below).
    const DType ydt = (format_ == WeightFormat::kFp8 && fp8_act_) ? DType::kBF16 : kdt;
    const size_t esize = DTypeSize(dtype);
    const int N = this->N();
    SlotLease slot(d);
    for (int r0 = 0; r0 < M; r0 += max_rows_) {
      const int m = std::min(max_rows_, M - r0);
      BatchStaging st(*slot, times);
      auto xd = st.UploadAs(x_in, dtype, size_t(r0) * K_, size_t(m) * K_, kdt);
      if (!xd.ok()) return xd.status();
      char* yd = st.Take(size_t(m) * N * 2);
      if (!yd) return absl::ResourceExhaustedError("linear batch chunk exceeds the GPU staging buffer");
      auto stream = st.stream();
      if (!stream.ok()) return stream.status();
      gemm::LinearArgs a;
      a.x = *xd;
      a.y = yd;
      a.M = m;
      a.act = act;
      a.batch_invariant = invariant_;
      a.workspace = r.workspace[slot->index];
      a.workspace_bytes = r.ws_bytes;
      KernelTimer timer(*slot, *hist_[dev]);
      Status s;
      switch (format_) {
        case WeightFormat::kBf16:
          s = own_gemm_ ? gemm::RunW16Invariant(r.bf16, N, K_, a, *stream)
                        : gemm::RunBf16(d.blas(), r.bf16, N, K_, a, *stream);
          break;
        case WeightFormat::kInt4: s = gemm::RunW4A16(*r.w4, a, d.blas(), *stream); break;
        case WeightFormat::kFp8: s = fp8_act_ ? RunW8A8(d, r, a, *stream) : gemm::RunW8A16(*r.fp8, a, *stream); break;
      }
      if (auto st_ = FromKernel(s); !st_.ok()) return st_;
      timer.Stop();
      auto y = st.Convert(yd, ydt, dtype, size_t(m) * N);
      if (!y.ok()) return y.status();
      if (r.bias) {
        if (auto b = FromKernel(RunAddBias(*y, dtype, m, N, r.bias, *stream)); !b.ok()) return b;
      }
      if (auto dl = st.Download(*y, y_out, size_t(r0) * N * esize, size_t(m) * N * esize); !dl.ok()) return dl;
      if (auto f = st.Finish(); !f.ok()) return f;
      timer.Observe();
    }
    return absl::OkStatus();
  }

 private:
  struct Replica {
    char* bf16 = nullptr;
    bool own_bf16 = false;
    float* bias = nullptr;  // [N] or null
    std::unique_ptr<gemm::W4A16Weights> w4;
    std::unique_ptr<gemm::Fp8DeviceWeights> fp8;
    size_t ws_bytes = 0;
    std::vector<char*> workspace;  // per stream slot
  };

  CudaLinear(Contexts& ctx, ServerMetrics& m, const LinearWeights& w, bool invariant)
      : LinearExecutor(w.N), ctx_(ctx), format_(w.format), K_(w.K), fp8_act_(w.fp8_activations),
        fp8_input_scale_(w.fp8_input_scale), invariant_(invariant),
        hist_(PerGpuHistograms(m, ctx, w.format == WeightFormat::kBf16 ? "linear_bf16"
                                : w.format == WeightFormat::kInt4 ? "linear_w4a16"
                                : w.fp8_activations ? "linear_w8a8" : "linear_w8a16")) {}

  Status RunW8A8(DeviceContext& d, Replica& r, const gemm::LinearArgs& a, cudaStream_t stream) {
    const bool static_scale = fp8_input_scale_ > 0;
    const gemm::W8A8Workspace l = gemm::W8A8WorkspaceLayout(K_, max_rows_, a.M, static_scale);
    auto* xq = reinterpret_cast<uint8_t*>(static_cast<char*>(a.workspace) + l.xq);
    auto* xs = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + l.scale);
    Status s;
    if (static_scale) {
      s = gemm::RunQuantizeActFp8Static(a.x, a.act, a.M, K_, xs, xq, stream);
    } else {
      s = gemm::RunQuantizeActFp8(a.x, a.act, a.M, K_, /*per_row=*/true, xq, xs, stream);
    }
    if (!s.ok()) return s;
    gemm::W8A8Args w8;
    w8.x_fp8 = xq;
    w8.x_scale = xs;
    w8.per_row_act = true;
    // Batch-invariant mode scales inside cuBLASLt, but the non-invariant mode may run the
    // GEMM unscaled and scale afterwards when that is faster, which only BF16 output
    // allows (|x8 . w8| reaches 448^2 * K: FP16 would overflow). So the GEMM writes BF16,
    // and FP16 requests are converted on the GPU.
    w8.y = a.y;
    w8.M = a.M;
    w8.out = gemm::ActType::kBF16;
    w8.batch_invariant = invariant_;
    return own_gemm_ ? gemm::RunW8A8Invariant(*r.fp8, w8, stream) : gemm::RunW8A8(d.blas(), *r.fp8, w8, stream);
  }

  Contexts& ctx_;
  const WeightFormat format_;
  const int K_;
  const bool fp8_act_;
  const float fp8_input_scale_;
  const bool invariant_;
  bool own_gemm_ = false;  // our invariant GEMM instead of cuBLASLt (set by Create)
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  int max_rows_ = 256;
  std::vector<Replica> replicas_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateCudaLinear(Contexts& ctx, ServerMetrics& metrics,
                                                                 LinearWeights w, bool invariant) {
  auto e = CudaLinear::Create(ctx, metrics, w, invariant);
  if (!e.ok()) return e.status();
  // Warm-up: every path once, on each GPU, at the row counts that reach every kernel, in each
  // activation type (FP32 runs as FP16).
  auto rows = (*e)->WarmupRows();
  if (!rows.ok()) return rows.status();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int m : *rows) {
    std::vector<float> x(size_t(m) * w.K);
    for (float& f : x) f = nd(rng);
    for (DType t : {DType::kF16, DType::kBF16}) {
      std::string xb, y;
      AppendFromFloat(t, x.data(), int64_t(x.size()), &xb);
      for (size_t dev = 0; dev < ctx.size(); ++dev) {
        if (auto s = (*e)->RunOn(dev, t, m, Gather(xb), IntoString(&y, size_t(m) * w.N * DTypeSize(t)), nullptr); !s.ok()) {
          return s;
        }
      }
    }
  }
  return std::unique_ptr<LinearExecutor>(std::move(*e));
}

}  // namespace flashq::server
