#include "server/backends/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm/gemm.h"
#include "server/backends/cuda/device_context.h"
#include "server/core/tensor.h"

namespace flashq::server {
namespace {

using Contexts = std::vector<std::unique_ptr<DeviceContext>>;

// Kernels take FP16/BF16; FP32 requests travel as FP16 and come back as FP32.
DType KernelDType(DType t) { return t == DType::kF32 ? DType::kF16 : t; }

// The bytes a kernel reads for `bytes` of type `from`, in the kernel's 16-bit type `to`
// (default: KernelDType(from)). No copy unless a conversion is needed; `storage` holds
// the converted bytes.
std::string_view ToKernelBytes(DType from, std::string_view bytes, std::string* storage,
                               std::optional<DType> to_type = std::nullopt) {
  const DType to = to_type.value_or(KernelDType(from));
  if (from == to) return bytes;
  std::vector<float> f;
  AppendAsFloat(from, bytes, &f);
  storage->clear();
  AppendFromFloat(to, f.data(), int64_t(f.size()), storage);
  return *storage;
}

// Appends `elems` kernel outputs of 16-bit type `from` to `out` in the request's type `to`.
void FromKernelBytes(DType from, DType to, const char* src, int64_t elems, std::string* out) {
  const std::string_view bytes(src, elems * DTypeSize(from));
  if (from == to) {
    out->append(bytes);
    return;
  }
  std::vector<float> f;
  AppendAsFloat(from, bytes, &f);
  AppendFromFloat(to, f.data(), int64_t(f.size()), out);
}

// flashq_kernel_seconds{kernel, gpu}, one series per GPU of the process.
std::vector<prometheus::Histogram*> PerGpuHistograms(ServerMetrics& m, const Contexts& ctx, const std::string& kernel) {
  std::vector<prometheus::Histogram*> h;
  for (const auto& d : ctx) h.push_back(&m.KernelHistogram(kernel, d->device()));
  return h;
}

// Times the kernels of one batch on its stream and feeds flashq_kernel_seconds.
class KernelTimer {
 public:
  KernelTimer(StreamSlot& s, prometheus::Histogram& h) : s_(s), h_(h) { cudaEventRecord(s.start, s.stream); }
  void Stop() { cudaEventRecord(s_.stop, s_.stream); }
  void Observe() {  // after the stream has synchronized
    float ms = 0;
    if (cudaEventElapsedTime(&ms, s_.start, s_.stop) == cudaSuccess) h_.Observe(double(ms) * 1e-3);
  }

 private:
  StreamSlot& s_;
  prometheus::Histogram& h_;
};

// ---- attention --------------------------------------------------------------
class CudaAttention : public AttentionExecutor {
 public:
  CudaAttention(Contexts& ctx, ServerMetrics& m) : ctx_(ctx), hist_(PerGpuHistograms(m, ctx, "varlen_attention")) {}

  absl::Status Run(const AttentionBatch& b, std::string* o, std::vector<float>* lse) override {
    const size_t dev = next_++ % ctx_.size();
    DeviceContext& d = *ctx_[dev];
    std::string qs, ks, vs;
    const std::string_view q = ToKernelBytes(b.dtype, b.q, &qs), k = ToKernelBytes(b.dtype, b.k, &ks),
                           v = ToKernelBytes(b.dtype, b.v, &vs);
    const int64_t q_row = int64_t(b.num_heads_q) * b.head_dim * 2, kv_row = int64_t(b.num_heads_kv) * b.head_dim * 2;
    const int batch = int(b.cu_seqlens_q.size()) - 1;
    const int64_t total_q = b.cu_seqlens_q.back();
    o->clear();
    if (b.want_lse) lse->assign(size_t(b.num_heads_q) * total_q, 0.0f);
    std::vector<float> chunk_lse;
    SlotLease slot(d);
    // Sequences go in chunks that fit the stream's staging buffers. A sequence's result
    // does not depend on its chunk, so chunking keeps batch invariance.
    for (int s0 = 0; s0 < batch;) {
      int s1 = s0;
      auto need = [&](int s_end) {
        const int64_t tq = b.cu_seqlens_q[s_end] - b.cu_seqlens_q[s0], tk = b.cu_seqlens_k[s_end] - b.cu_seqlens_k[s0];
        const size_t n = size_t(s_end - s0 + 1) * 4;
        return Carver::Need({n, n, size_t(tq * q_row), size_t(tk * kv_row), size_t(tk * kv_row), size_t(tq * q_row),
                             b.want_lse ? size_t(tq * b.num_heads_q * 4) : 0});
      };
      while (s1 < batch && need(s1 + 1) <= slot->bytes) ++s1;
      if (s1 == s0) {
        return absl::ResourceExhaustedError(absl::StrCat("sequence ", s0, " needs ", need(s0 + 1),
                                                         " bytes of GPU staging; the limit is ", slot->bytes,
                                                         " (raise --gpu-staging-mb)"));
      }
      if (auto s = RunChunk(b, q, k, v, s0, s1, *slot, *hist_[dev], o, b.want_lse ? &chunk_lse : nullptr); !s.ok()) {
        return s;
      }
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
  absl::Status RunChunk(const AttentionBatch& b, std::string_view q, std::string_view k, std::string_view v,
                        int s0, int s1, StreamSlot& slot, prometheus::Histogram& hist, std::string* o,
                        std::vector<float>* lse) {
    const int n = s1 - s0;
    const int32_t q0 = b.cu_seqlens_q[s0], k0 = b.cu_seqlens_k[s0];
    const int64_t tq = b.cu_seqlens_q[s1] - q0, tk = b.cu_seqlens_k[s1] - k0;
    const int64_t q_row = int64_t(b.num_heads_q) * b.head_dim * 2, kv_row = int64_t(b.num_heads_kv) * b.head_dim * 2;
    std::vector<int32_t> cu_q(n + 1), cu_k(n + 1);
    int max_q = 0;
    for (int i = 0; i <= n; ++i) {
      cu_q[i] = b.cu_seqlens_q[s0 + i] - q0;
      cu_k[i] = b.cu_seqlens_k[s0 + i] - k0;
      if (i) max_q = std::max(max_q, cu_q[i] - cu_q[i - 1]);
    }
    Carver hc(slot.host, slot.bytes), dc(slot.device, slot.bytes);
    struct Piece { const void* src; size_t bytes; char* h = nullptr; char* d = nullptr; };
    Piece in[] = {{cu_q.data(), cu_q.size() * 4}, {cu_k.data(), cu_k.size() * 4}, {q.data() + q0 * q_row, size_t(tq * q_row)},
                  {k.data() + k0 * kv_row, size_t(tk * kv_row)}, {v.data() + k0 * kv_row, size_t(tk * kv_row)}};
    for (Piece& p : in) {
      p.h = hc.Take(p.bytes);
      p.d = dc.Take(p.bytes);
      std::memcpy(p.h, p.src, p.bytes);
    }
    const size_t in_bytes = hc.used();
    char* o_h = hc.Take(tq * q_row);
    char* o_d = dc.Take(tq * q_row);
    char* lse_h = lse ? hc.Take(tq * b.num_heads_q * 4) : nullptr;
    char* lse_d = lse ? dc.Take(tq * b.num_heads_q * 4) : nullptr;
    FQ_CUDA_OK(cudaMemcpyAsync(slot.device, slot.host, in_bytes, cudaMemcpyHostToDevice, slot.stream));
    attention::VarlenAttentionParams p;
    p.q = in[2].d;
    p.k = in[3].d;
    p.v = in[4].d;
    p.o = o_d;
    p.lse = reinterpret_cast<float*>(lse_d);
    p.cu_seqlens_q = reinterpret_cast<const int32_t*>(in[0].d);
    p.cu_seqlens_k = reinterpret_cast<const int32_t*>(in[1].d);
    p.q_row_stride = p.o_row_stride = int64_t(b.num_heads_q) * b.head_dim;
    p.k_row_stride = p.v_row_stride = int64_t(b.num_heads_kv) * b.head_dim;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = b.head_dim;
    p.lse_head_stride = tq;
    p.batch = n;
    p.num_heads_q = b.num_heads_q;
    p.num_heads_kv = b.num_heads_kv;
    p.head_dim = b.head_dim;
    p.max_seqlen_q = max_q;
    p.softmax_scale = b.softmax_scale;
    p.causal = b.causal;
    p.dtype = KernelDType(b.dtype);
    KernelTimer timer(slot, hist);
    if (auto s = FromKernel(attention::run_varlen_attention(p, slot.stream)); !s.ok()) return s;
    timer.Stop();
    FQ_CUDA_OK(cudaMemcpyAsync(o_h, o_d, dc.used() - (o_d - slot.device), cudaMemcpyDeviceToHost, slot.stream));
    FQ_CUDA_OK(cudaStreamSynchronize(slot.stream));
    timer.Observe();
    FromKernelBytes(KernelDType(b.dtype), b.dtype, o_h, tq * q_row / 2, o);
    if (lse) lse->assign(reinterpret_cast<float*>(lse_h), reinterpret_cast<float*>(lse_h) + tq * b.num_heads_q);
    return absl::OkStatus();
  }

  Contexts& ctx_;
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  std::atomic<uint64_t> next_{0};
};

// ---- kv_attention -------------------------------------------------------------
class CudaKvAttention : public KvAttentionExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> Create(Contexts& ctx, ServerMetrics& m,
                                                                     const KvGeometry& g) {
    std::unique_ptr<CudaKvAttention> e(new CudaKvAttention(ctx, m, g));
    // Each GPU holds a full page pool; a sequence lives on the GPU its id hashes to.
    const size_t pool = size_t(g.pool_elements()) * 2;
    for (auto& d : ctx) {
      auto k = d->arena().Allocate(pool, "KV cache (K)");
      if (!k.ok()) return k.status();
      auto v = d->arena().Allocate(pool, "KV cache (V)");
      if (!v.ok()) return v.status();
      e->k_.push_back(*k);
      e->v_.push_back(*v);
    }
    m.BackendGauge("flashq_kv_cache_bytes", "Device bytes of the KV cache per GPU", {})
        .Set(double(pool) * 2);
    return std::unique_ptr<KvAttentionExecutor>(std::move(e));
  }

  absl::Status Run(const KvBatch& b, std::vector<std::string>* outputs) override {
    outputs->assign(b.items.size(), std::string());
    std::vector<std::vector<int>> by_device(ctx_.size());
    for (size_t i = 0; i < b.items.size(); ++i) {
      by_device[std::hash<std::string_view>()(b.items[i].sequence_id) % ctx_.size()].push_back(int(i));
    }
    // Each GPU's items run on that GPU, the GPUs side by side.
    std::vector<absl::Status> status(ctx_.size());
    std::vector<std::thread> others;
    for (size_t dev = 1; dev < ctx_.size(); ++dev) {
      if (by_device[dev].empty()) continue;
      others.emplace_back([&, dev] { status[dev] = RunDevice(int(dev), b, by_device[dev], outputs); });
    }
    if (!by_device[0].empty()) status[0] = RunDevice(0, b, by_device[0], outputs);
    for (auto& t : others) t.join();
    for (auto& s : status) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // Items go in groups that fit a stream's staging buffer (a long prefill needs much
  // more than a decode step). Items are independent sequences, so grouping does not
  // change any result.
  absl::Status RunDevice(int dev, const KvBatch& b, const std::vector<int>& items, std::vector<std::string>* outputs) {
    std::vector<int> group;
    for (size_t j = 0; j <= items.size(); ++j) {
      if (j < items.size()) {
        std::vector<int> grown = group;
        grown.push_back(items[j]);
        if (StagingNeed(b, grown) <= ctx_[dev]->staging_bytes() || group.empty()) {
          group = std::move(grown);
          continue;
        }
      }
      if (group.empty()) break;
      if (StagingNeed(b, group) > ctx_[dev]->staging_bytes()) {
        return absl::ResourceExhaustedError(absl::StrCat("a kv_attention request of ", b.items[group[0]].n,
                                                         " new tokens needs ", StagingNeed(b, group),
                                                         " bytes of GPU staging; the limit is ",
                                                         ctx_[dev]->staging_bytes(), " (raise --gpu-staging-mb)"));
      }
      if (auto s = RunOnDevice(dev, b, group, outputs); !s.ok()) return s;
      group.clear();
      if (j < items.size()) --j;  // start the next group with item j
    }
    return absl::OkStatus();
  }

  CudaKvAttention(Contexts& ctx, ServerMetrics& m, const KvGeometry& g)
      : ctx_(ctx), g_(g), hist_(PerGpuHistograms(m, ctx, "paged_decode")) {}

  size_t StagingNeed(const KvBatch& b, const std::vector<int>& items) const {
    int width = 1, max_k = 0, total = 0;
    for (int i : items) {
      width = std::max(width, int(b.items[i].blocks->size()));
      max_k = std::max(max_k, int(b.items[i].start_pos + b.items[i].n));
      total += b.items[i].n;
    }
    const size_t n = items.size();
    const size_t q_row = size_t(g_.num_heads_q) * g_.head_dim * 2, kv_row = size_t(g_.num_heads_kv) * g_.head_dim * 2;
    return Carver::Need({n * width * 4, n * 4, (n + 1) * 4, total * q_row, total * kv_row, total * kv_row,
                         total * q_row, attention::paged_decode_workspace_size(total, g_.num_heads_q, g_.head_dim, max_k)});
  }

  absl::Status RunOnDevice(int dev, const KvBatch& b, const std::vector<int>& items, std::vector<std::string>* outputs) {
    DeviceContext& d = *ctx_[dev];
    const int n = int(items.size());
    const DType dt = KernelDType(b.dtype);
    int width = 1, max_q = 0, max_k = 0, total = 0;
    for (int i : items) {
      width = std::max(width, int(b.items[i].blocks->size()));
      max_q = std::max(max_q, b.items[i].n);
      max_k = std::max(max_k, int(b.items[i].start_pos + b.items[i].n));
      total += b.items[i].n;
    }
    std::vector<int32_t> table(size_t(n) * width, 0), seqlens(n), cu(n + 1, 0);
    for (int j = 0; j < n; ++j) {
      const KvItem& it = b.items[items[j]];
      std::copy(it.blocks->begin(), it.blocks->end(), table.begin() + size_t(j) * width);
      seqlens[j] = int32_t(it.start_pos + it.n);
      cu[j + 1] = cu[j] + it.n;
    }
    const int64_t q_row = int64_t(g_.num_heads_q) * g_.head_dim * 2, kv_row = int64_t(g_.num_heads_kv) * g_.head_dim * 2;
    const size_t ws = attention::paged_decode_workspace_size(total, g_.num_heads_q, g_.head_dim, max_k);
    SlotLease slot(d);
    Carver hc(slot->host, slot->bytes), dc(slot->device, slot->bytes);
    const size_t sizes[] = {table.size() * 4, seqlens.size() * 4, cu.size() * 4, size_t(total * q_row),
                            size_t(total * kv_row), size_t(total * kv_row)};
    char* h[6];
    char* dv[6];
    for (int i = 0; i < 6; ++i) {
      h[i] = hc.Take(sizes[i]);
      dv[i] = dc.Take(sizes[i]);
      if (!h[i] || !dv[i]) return absl::ResourceExhaustedError("kv_attention batch exceeds the GPU staging buffer");
    }
    std::memcpy(h[0], table.data(), sizes[0]);
    std::memcpy(h[1], seqlens.data(), sizes[1]);
    std::memcpy(h[2], cu.data(), sizes[2]);
    for (int part = 0; part < 3; ++part) {  // q, k, v of every item, back to back
      char* dst = h[3 + part];
      for (int i : items) {
        const KvItem& it = b.items[i];
        std::string storage;
        std::string_view bytes = ToKernelBytes(b.dtype, part == 0 ? it.q : part == 1 ? it.k : it.v, &storage);
        std::memcpy(dst, bytes.data(), bytes.size());
        dst += bytes.size();
      }
    }
    const size_t in_bytes = hc.used();
    char* o_h = hc.Take(total * q_row);
    char* o_d = dc.Take(total * q_row);
    char* w_d = dc.Take(ws);
    if (!o_h || !o_d || !w_d) return absl::ResourceExhaustedError("kv_attention batch exceeds the GPU staging buffer");
    FQ_CUDA_OK(cudaMemcpyAsync(slot->device, slot->host, in_bytes, cudaMemcpyHostToDevice, slot->stream));

    const int64_t block_stride = int64_t(g_.page_size) * g_.num_heads_kv * g_.head_dim;
    attention::KvAppendParams a;
    a.k_new = dv[4];
    a.v_new = dv[5];
    a.k_cache = k_[dev];
    a.v_cache = v_[dev];
    a.block_table = reinterpret_cast<const int32_t*>(dv[0]);
    a.seqlens_k = reinterpret_cast<const int32_t*>(dv[1]);
    a.cu_seqlens_new = reinterpret_cast<const int32_t*>(dv[2]);
    a.new_row_stride = int64_t(g_.num_heads_kv) * g_.head_dim;
    a.new_head_stride = g_.head_dim;
    a.kv_block_stride = block_stride;
    a.kv_row_stride = int64_t(g_.num_heads_kv) * g_.head_dim;
    a.kv_head_stride = g_.head_dim;
    a.batch = n;
    a.max_new = max_q;
    a.max_blocks_per_seq = width;
    a.page_size = g_.page_size;
    a.num_heads_kv = g_.num_heads_kv;
    a.head_dim = g_.head_dim;
    a.dtype = dt;
    attention::PagedDecodeParams p;
    p.q = dv[3];
    p.k_cache = k_[dev];
    p.v_cache = v_[dev];
    p.o = o_d;
    p.block_table = a.block_table;
    p.seqlens_k = a.seqlens_k;
    p.cu_seqlens_q = a.cu_seqlens_new;
    p.workspace = w_d;
    p.workspace_bytes = ws;
    p.q_row_stride = p.o_row_stride = int64_t(g_.num_heads_q) * g_.head_dim;
    p.q_head_stride = p.o_head_stride = g_.head_dim;
    p.kv_block_stride = block_stride;
    p.kv_row_stride = a.kv_row_stride;
    p.kv_head_stride = g_.head_dim;
    p.total_q = total;
    p.batch = n;
    p.max_blocks_per_seq = width;
    p.page_size = g_.page_size;
    p.max_seqlen_q = max_q;
    p.max_seqlen_k = max_k;
    p.num_heads_q = g_.num_heads_q;
    p.num_heads_kv = g_.num_heads_kv;
    p.head_dim = g_.head_dim;
    p.softmax_scale = b.softmax_scale;
    p.causal = true;
    p.dtype = dt;
    KernelTimer timer(*slot, *hist_[dev]);
    if (auto s = FromKernel(attention::run_kv_append(a, slot->stream)); !s.ok()) return s;
    if (auto s = FromKernel(attention::run_paged_decode(p, slot->stream)); !s.ok()) return s;
    timer.Stop();
    FQ_CUDA_OK(cudaMemcpyAsync(o_h, o_d, total * q_row, cudaMemcpyDeviceToHost, slot->stream));
    FQ_CUDA_OK(cudaStreamSynchronize(slot->stream));
    timer.Observe();
    int64_t off = 0;
    for (int i : items) {
      const int64_t bytes = b.items[i].n * q_row;
      FromKernelBytes(KernelDType(b.dtype), b.dtype, o_h + off, bytes / 2, &(*outputs)[i]);
      off += bytes;
    }
    return absl::OkStatus();
  }

  Contexts& ctx_;
  const KvGeometry g_;
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  std::vector<char*> k_, v_;  // per GPU: [num_blocks, page_size, Hkv, D]
};

// ---- linear layers ------------------------------------------------------------
class CudaLinear : public LinearExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<LinearExecutor>> Create(Contexts& ctx, ServerMetrics& m, LinearWeights w,
                                                                bool invariant) {
    std::unique_ptr<CudaLinear> e(new CudaLinear(ctx, m, w, invariant));
    // Rows go in chunks; rows are independent, so chunking keeps batch invariance.
    e->max_rows_ = invariant ? 256 : 4096;
    for (auto& d : ctx) {
      FQ_CUDA_OK(cudaSetDevice(d->device()));
      Replica r;
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
          r.ws_bytes = w.fp8_activations ? size_t(e->max_rows_) * (w.K + 4) + 256 : gemm::W8A16WorkspaceBytes(*r.fp8, e->max_rows_);
          break;
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
            FQ_CUDA_OK(cudaMemcpy(ws + e->StaticScaleOffset(), scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
          }
        }
        r.workspace.push_back(ws);
      }
      e->replicas_.push_back(std::move(r));
    }
    FQ_CUDA_OK(cudaDeviceSynchronize());
    // Warm-up: every path once, on each GPU, at the row counts that select the kernels
    // (gemm::kSmallMMaxRows, gemm::kWgmmaMinRows - 1, gemm::kWgmmaTileRows) and at the largest the server will use.
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    for (int m : {1, std::min(gemm::kSmallMMaxRows, e->max_rows_), std::min(gemm::kWgmmaMinRows - 1, e->max_rows_),
                  std::min(gemm::kWgmmaTileRows, e->max_rows_), e->max_rows_}) {
      std::vector<float> x(size_t(m) * w.K);
      for (float& f : x) f = nd(rng);
      for (DType t : {DType::kF16, DType::kBF16}) {
        std::string xb, y;
        AppendFromFloat(t, x.data(), int64_t(x.size()), &xb);
        for (size_t dev = 0; dev < ctx.size(); ++dev) {
          if (auto s = e->RunOn(dev, t, m, xb, &y); !s.ok()) return s;
        }
      }
    }
    return std::unique_ptr<LinearExecutor>(std::move(e));
  }

  ~CudaLinear() override {
    for (auto& r : replicas_) {
      if (r.own_bf16) cudaFree(r.bf16);
    }
  }

  absl::Status Run(DType dtype, int M, std::string_view x, std::string* y) override {
    return RunOn(next_++ % replicas_.size(), dtype, M, x, y);
  }

 private:
  struct Replica {
    char* bf16 = nullptr;
    bool own_bf16 = false;
    std::unique_ptr<gemm::W4A16Weights> w4;
    std::unique_ptr<gemm::Fp8DeviceWeights> fp8;
    size_t ws_bytes = 0;
    std::vector<char*> workspace;  // per stream slot
  };

  // W8A8 workspace: xq [rows][K] E4M3, then the row scales (256-byte aligned). Static
  // scales sit after the largest chunk's xq, so no chunk's xq reaches them.
  size_t StaticScaleOffset() const { return (size_t(max_rows_) * K_ + 255) & ~size_t(255); }

  CudaLinear(Contexts& ctx, ServerMetrics& m, const LinearWeights& w, bool invariant)
      : ctx_(ctx), format_(w.format), K_(w.K), N_(w.N), fp8_act_(w.fp8_activations),
        fp8_input_scale_(w.fp8_input_scale), invariant_(invariant),
        hist_(PerGpuHistograms(m, ctx, w.format == WeightFormat::kBf16 ? "linear_bf16"
                                : w.format == WeightFormat::kInt4 ? "linear_w4a16"
                                : w.fp8_activations ? "linear_w8a8" : "linear_w8a16")) {}

  absl::Status RunOn(size_t dev, DType dtype, int M, std::string_view x_in, std::string* y) {
    DeviceContext& d = *ctx_[dev];
    Replica& r = replicas_[dev];
    // BF16 weights go through cuBLASLt in BF16, so other activations are converted to it.
    const DType kdt = format_ == WeightFormat::kBf16 ? DType::kBF16 : KernelDType(dtype);
    std::string storage;
    const std::string_view x = ToKernelBytes(dtype, x_in, &storage, kdt);
    const gemm::ActType act = kdt == DType::kBF16 ? gemm::ActType::kBF16 : gemm::ActType::kF16;
    // The type the GPU writes Y in: W8A8's GEMM always writes BF16 (see below).
    const DType ydt = (format_ == WeightFormat::kFp8 && fp8_act_) ? DType::kBF16 : kdt;
    y->clear();
    SlotLease slot(d);
    for (int r0 = 0; r0 < M; r0 += max_rows_) {
      const int m = std::min(max_rows_, M - r0);
      Carver hc(slot->host, slot->bytes), dc(slot->device, slot->bytes);
      const size_t xb = size_t(m) * K_ * 2, yb = size_t(m) * N_ * 2;
      char *xh = hc.Take(xb), *xd = dc.Take(xb), *yh = hc.Take(yb), *yd = dc.Take(yb);
      if (!yh || !yd) return absl::ResourceExhaustedError("linear batch chunk exceeds the GPU staging buffer");
      std::memcpy(xh, x.data() + size_t(r0) * K_ * 2, xb);
      FQ_CUDA_OK(cudaMemcpyAsync(xd, xh, xb, cudaMemcpyHostToDevice, slot->stream));
      gemm::LinearArgs a;
      a.x = xd;
      a.y = yd;
      a.M = m;
      a.act = act;
      a.batch_invariant = invariant_;
      a.workspace = r.workspace[slot->index];
      a.workspace_bytes = r.ws_bytes;
      KernelTimer timer(*slot, *hist_[dev]);
      Status s;
      switch (format_) {
        case WeightFormat::kBf16: s = gemm::run_bf16(d.blas(), r.bf16, N_, K_, a, slot->stream); break;
        case WeightFormat::kInt4: s = gemm::run_w4a16(*r.w4, a, d.blas(), slot->stream); break;
        case WeightFormat::kFp8:
          if (!fp8_act_) {
            s = gemm::run_w8a16(*r.fp8, a, slot->stream);
          } else {
            auto* xq = reinterpret_cast<uint8_t*>(a.workspace);
            float* xs;
            if (fp8_input_scale_ > 0) {
              xs = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + StaticScaleOffset());
              s = gemm::run_quantize_act_fp8_static(xd, act, m, K_, xs, xq, slot->stream);
            } else {
              xs = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + ((size_t(m) * K_ + 255) & ~size_t(255)));
              s = gemm::run_quantize_act_fp8(xd, act, m, K_, /*per_row=*/true, xq, xs, slot->stream);
            }
            if (s.ok()) {
              gemm::W8A8Args w8;
              w8.x_fp8 = xq;
              w8.x_scale = xs;
              w8.per_row_act = true;
              // Batch-invariant mode scales inside cuBLASLt, but the non-invariant mode may
              // run the GEMM unscaled and scale afterwards when that is faster, which only
              // BF16 output allows (|x8 . w8| reaches 448^2 * K: FP16 would overflow). So the
              // GEMM writes BF16; FP16 requests are converted on the host.
              w8.y = yd;
              w8.M = m;
              w8.out = gemm::ActType::kBF16;
              w8.batch_invariant = invariant_;
              s = gemm::run_w8a8(d.blas(), *r.fp8, w8, slot->stream);
            }
          }
          break;
      }
      if (auto st = FromKernel(s); !st.ok()) return st;
      timer.Stop();
      FQ_CUDA_OK(cudaMemcpyAsync(yh, yd, yb, cudaMemcpyDeviceToHost, slot->stream));
      FQ_CUDA_OK(cudaStreamSynchronize(slot->stream));
      timer.Observe();
      FromKernelBytes(ydt, dtype, yh, int64_t(m) * N_, y);
    }
    return absl::OkStatus();
  }

  Contexts& ctx_;
  const WeightFormat format_;
  const int K_, N_;
  const bool fp8_act_;
  const float fp8_input_scale_;
  const bool invariant_;
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  int max_rows_ = 256;
  std::vector<Replica> replicas_;
  std::atomic<uint64_t> next_{0};
};

// ---- the backend --------------------------------------------------------------
class CudaBackend : public Backend {
 public:
  CudaBackend(const BackendOptions& o, ServerMetrics& m, Contexts ctx) : options_(o), metrics_(m), ctx_(std::move(ctx)) {
    for (auto& d : ctx_) {
      mem_gauges_.push_back(&m.BackendGauge("flashq_gpu_memory_used_bytes", "Device memory in use per GPU",
                                            {{"gpu", std::to_string(d->device())}}));
      arena_gauges_.push_back(&m.BackendGauge("flashq_gpu_arena_used_bytes", "Bytes carved from the start-up arena",
                                              {{"gpu", std::to_string(d->device())}}));
    }
    UpdateGauges();
    poller_ = std::thread([this] {
      while (!stop_) {
        for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        UpdateGauges();
      }
    });
  }
  ~CudaBackend() override {
    stop_ = true;
    poller_.join();
  }

  std::string name() const override {
    return absl::StrCat("cuda (", ctx_.size(), " GPU", ctx_.size() > 1 ? "s" : "", ": ", ctx_[0]->name(), ")");
  }

  absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateAttention() override {
    auto e = std::make_unique<CudaAttention>(ctx_, metrics_);
    // Warm-up: every compiled instantiation the model can reach, on every GPU.
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    for (size_t dev = 0; dev < ctx_.size(); ++dev) {
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

  absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateKvAttention(const KvGeometry& g) override {
    auto e = CudaKvAttention::Create(ctx_, metrics_, g);
    if (!e.ok()) return e;
    // Warm-up: a prefill and a decode step through block 0 on every GPU (block 0 is
    // rewritten before it is read by any real sequence that gets it).
    std::vector<int32_t> blocks(std::max(1, (70 + g.page_size - 1) / g.page_size));
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = int32_t(i % g.num_blocks);
    std::mt19937 rng(13);
    std::normal_distribution<float> nd;
    for (DType t : {DType::kF16, DType::kBF16}) {
      for (size_t dev = 0; dev < ctx_.size(); ++dev) {
        for (auto [start, n] : {std::pair<int, int>{0, 69}, {69, 1}}) {
          std::vector<float> q(size_t(n) * g.num_heads_q * g.head_dim), k(size_t(n) * g.num_heads_kv * g.head_dim);
          for (float& f : q) f = nd(rng);
          for (float& f : k) f = nd(rng);
          std::string qb, kb;
          AppendFromFloat(t, q.data(), int64_t(q.size()), &qb);
          AppendFromFloat(t, k.data(), int64_t(k.size()), &kb);
          // Find an id that hashes to this GPU.
          std::string id;
          for (int i = 0;; ++i) {
            id = absl::StrCat("warmup-", i);
            if (std::hash<std::string_view>()(id) % ctx_.size() == dev) break;
          }
          KvBatch b;
          b.dtype = t;
          b.softmax_scale = 1.0f / std::sqrt(float(g.head_dim));
          b.items.push_back({id, qb, kb, kb, n, start, &blocks});
          std::vector<std::string> outs;
          if (auto s = (*e)->Run(b, &outs); !s.ok()) return s;
        }
      }
    }
    return e;
  }

  absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights weights) override {
    return CudaLinear::Create(ctx_, metrics_, std::move(weights), options_.batch_invariant);
  }

 private:
  void UpdateGauges() {
    for (size_t i = 0; i < ctx_.size(); ++i) {
      size_t free_b = 0, total_b = 0;
      cudaSetDevice(ctx_[i]->device());
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) mem_gauges_[i]->Set(double(total_b - free_b));
      arena_gauges_[i]->Set(double(ctx_[i]->arena().used()));
    }
  }

  const BackendOptions options_;
  ServerMetrics& metrics_;
  Contexts ctx_;
  std::vector<prometheus::Gauge*> mem_gauges_, arena_gauges_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options, ServerMetrics& metrics) {
  const int n = CudaDeviceCount();
  if (n == 0) return absl::FailedPreconditionError("--backend=cuda: no CUDA device is visible");
  Contexts ctx;
  for (int i = 0; i < n; ++i) {
    auto d = DeviceContext::Create(i, std::max(1, options.streams_per_device), size_t(options.staging_bytes),
                                   size_t(options.arena_bytes));
    if (!d.ok()) return absl::Status(d.status().code(), absl::StrCat("GPU ", i, ": ", d.status().message()));
    ctx.push_back(std::move(*d));
  }
  return std::unique_ptr<Backend>(new CudaBackend(options, metrics, std::move(ctx)));
}

}  // namespace flashq::server
