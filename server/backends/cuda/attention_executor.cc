// Varlen attention on the GPU: a batch's sequences go round-robin to a GPU, in chunks of
// sequences that fit one stream's staging.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "server/backends/cuda/executors.h"
#include "server/backends/cuda/staging.h"

namespace flashq::server {
namespace {

class CudaAttention : public AttentionExecutor {
 public:
  CudaAttention(Contexts& ctx, ServerMetrics& m) : ctx_(ctx), hist_(PerGpuHistograms(m, ctx, "varlen_attention")) {}

  using AttentionExecutor::Run;
  absl::Status Run(const AttentionBatch& b, std::vector<float>* lse) override {
    const size_t dev = next_++ % ctx_.size();
    DeviceContext& d = *ctx_[dev];
    const int batch = int(b.cu_seqlens_q.size()) - 1;
    const int64_t total_q = b.cu_seqlens_q.back();
    if (b.want_lse) lse->assign(size_t(b.num_heads_q) * total_q, 0.0f);
    std::vector<float> chunk_lse;
    SlotLease slot(d);
    // Sequences go in chunks that fit the stream's staging buffers. A sequence's result
    // does not depend on its chunk, so chunking keeps batch invariance.
    for (int s0 = 0; s0 < batch;) {
      int s1 = s0;
      while (s1 < batch && Need(b, s0, s1 + 1) <= slot->bytes) ++s1;
      if (s1 == s0) {
        return absl::ResourceExhaustedError(absl::StrCat("sequence ", s0, " needs ", Need(b, s0, s0 + 1),
                                                         " bytes of GPU staging; the limit is ", slot->bytes,
                                                         " (raise --gpu-staging-mb)"));
      }
      if (auto s = RunChunk(b, s0, s1, *slot, *hist_[dev], b.want_lse ? &chunk_lse : nullptr); !s.ok()) return s;
      if (b.want_lse) {
        const int64_t q0 = b.cu_seqlens_q[s0], tq = b.cu_seqlens_q[s1] - q0;
        for (int h = 0; h < b.num_heads_q; ++h) {
          std::memcpy(lse->data() + h * total_q + q0, chunk_lse.data() + h * tq, tq * 4);
        }
      }
      s0 = s1;
    }
    return absl::OkStatus();
  }

 private:
  static size_t Need(const AttentionBatch& b, int s0, int s1) {
    const size_t tq = b.cu_seqlens_q[s1] - b.cu_seqlens_q[s0], tk = b.cu_seqlens_k[s1] - b.cu_seqlens_k[s0];
    const size_t q_elems = tq * b.num_heads_q * b.head_dim, kv_elems = tk * b.num_heads_kv * b.head_dim;
    const size_t n = size_t(s1 - s0 + 1) * 4;
    const DType kdt = KernelDType(b.dtype);
    std::vector<size_t> sizes = {n, n};
    for (size_t e : {q_elems, kv_elems, kv_elems, q_elems}) BatchStaging::Need(&sizes, b.dtype, kdt, e);
    if (b.want_lse) sizes.push_back(tq * b.num_heads_q * 4);
    return Carver::Need(sizes);
  }

  absl::Status RunChunk(const AttentionBatch& b, int s0, int s1, StreamSlot& slot, prometheus::Histogram& hist,
                        std::vector<float>* lse) {
    const int n = s1 - s0;
    const int32_t q0 = b.cu_seqlens_q[s0], k0 = b.cu_seqlens_k[s0];
    const int64_t tq = b.cu_seqlens_q[s1] - q0, tk = b.cu_seqlens_k[s1] - k0;
    const int64_t q_row = int64_t(b.num_heads_q) * b.head_dim, kv_row = int64_t(b.num_heads_kv) * b.head_dim;
    const DType kdt = KernelDType(b.dtype);
    std::vector<int32_t> cu(2 * (n + 1));  // cu_q, then cu_k, rebased to the chunk
    int max_q = 0;
    for (int i = 0; i <= n; ++i) {
      cu[i] = b.cu_seqlens_q[s0 + i] - q0;
      cu[n + 1 + i] = b.cu_seqlens_k[s0 + i] - k0;
      if (i) max_q = std::max(max_q, cu[i] - cu[i - 1]);
    }
    BatchStaging st(slot, b.times);
    char* cu_d = st.Take(cu.size() * 4);
    if (!cu_d) return absl::ResourceExhaustedError("attention chunk exceeds the GPU staging buffer");
    if (auto s = st.UploadHost(cu.data(), cu.size() * 4, cu_d); !s.ok()) return s;
    auto q = st.UploadAs(b.q, b.dtype, size_t(q0) * q_row, tq * q_row, kdt);
    if (!q.ok()) return q.status();
    auto k = st.UploadAs(b.k, b.dtype, size_t(k0) * kv_row, tk * kv_row, kdt);
    if (!k.ok()) return k.status();
    auto v = st.UploadAs(b.v, b.dtype, size_t(k0) * kv_row, tk * kv_row, kdt);
    if (!v.ok()) return v.status();
    char* o_d = st.Take(tq * q_row * 2);
    char* lse_d = lse ? st.Take(tq * b.num_heads_q * 4) : nullptr;
    if (!o_d || (lse && !lse_d)) return absl::ResourceExhaustedError("attention chunk exceeds the GPU staging buffer");
    attention::VarlenAttentionParams p;
    p.q = *q;
    p.k = *k;
    p.v = *v;
    p.o = o_d;
    p.lse = reinterpret_cast<float*>(lse_d);
    p.cu_seqlens_q = reinterpret_cast<const int32_t*>(cu_d);
    p.cu_seqlens_k = reinterpret_cast<const int32_t*>(cu_d) + n + 1;
    p.q_row_stride = p.o_row_stride = q_row;
    p.k_row_stride = p.v_row_stride = kv_row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = b.head_dim;
    p.lse_head_stride = tq;
    p.batch = n;
    p.num_heads_q = b.num_heads_q;
    p.num_heads_kv = b.num_heads_kv;
    p.head_dim = b.head_dim;
    p.max_seqlen_q = max_q;
    p.softmax_scale = b.softmax_scale;
    p.causal = b.causal;
    p.dtype = kdt;
    auto stream = st.stream();
    if (!stream.ok()) return stream.status();
    KernelTimer timer(slot, hist);
    if (auto s = FromKernel(attention::RunVarlenAttention(p, *stream)); !s.ok()) return s;
    timer.Stop();
    auto o = st.Convert(o_d, kdt, b.dtype, tq * q_row);
    if (!o.ok()) return o.status();
    const size_t esize = DTypeSize(b.dtype);
    if (auto s = st.Download(*o, b.o, size_t(q0) * q_row * esize, tq * q_row * esize); !s.ok()) return s;
    if (lse) {
      lse->resize(tq * b.num_heads_q);
      if (auto s = st.DownloadHost(lse_d, lse->data(), lse->size() * 4); !s.ok()) return s;
    }
    if (auto s = st.Finish(); !s.ok()) return s;
    timer.Observe();
    return absl::OkStatus();
  }

  Contexts& ctx_;
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  std::atomic<uint64_t> next_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateCudaAttention(Contexts& ctx, ServerMetrics& metrics) {
  auto e = std::make_unique<CudaAttention>(ctx, metrics);
  // Warm-up: every compiled instantiation the model can reach, on every GPU (round-robin).
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (size_t dev = 0; dev < ctx.size(); ++dev) {
    for (DType t : {DType::kF16, DType::kBF16}) {
      for (int d : {64, 128, 256}) {
        for (bool causal : {false, true}) {
          AttentionBatch b;
          b.dtype = t;
          b.num_heads_q = 4;
          b.num_heads_kv = 2;
          b.head_dim = d;
          b.causal = causal;
          b.softmax_scale = 0.125f;
          b.want_lse = true;
          b.cu_seqlens_q = {0, 3, 70};
          b.cu_seqlens_k = {0, 5, 72};
          b.max_seqlen_q = 67;
          b.max_seqlen_k = 67;
          std::vector<float> q(70 * 4 * d), k(72 * 2 * d);
          for (float& f : q) f = nd(rng);
          for (float& f : k) f = nd(rng);
          std::string qb, kb, o;
          AppendFromFloat(t, q.data(), int64_t(q.size()), &qb);
          AppendFromFloat(t, k.data(), int64_t(k.size()), &kb);
          b.q = qb;
          b.k = kb;
          b.v = kb;
          std::vector<float> lse;
          if (auto s = e->Run(b, &o, &lse); !s.ok()) return s;
        }
      }
    }
  }
  return std::unique_ptr<AttentionExecutor>(std::move(e));
}

}  // namespace flashq::server
