// Attention over the paged KV cache on the GPU. Each GPU holds a full page pool; a
// sequence lives on the GPU its id hashes to, and the GPUs of a batch run side by side.
// Items are independent sequences, so grouping them to fit the staging changes no result.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "server/backends/cuda/executors.h"
#include "server/backends/cuda/staging.h"

namespace flashq::server {
namespace {

size_t DeviceOf(std::string_view sequence_id, size_t devices) { return std::hash<std::string_view>()(sequence_id) % devices; }

class CudaKvAttention : public KvAttentionExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<CudaKvAttention>> Create(Contexts& ctx, ServerMetrics& m, const KvGeometry& g) {
    std::unique_ptr<CudaKvAttention> e(new CudaKvAttention(ctx, m, g));
    const size_t pool = size_t(g.pool_elements()) * 2;
    for (auto& d : ctx) {
      // Held by the executor as soon as taken, so that a failure frees them (the destructor).
      e->k_.push_back(nullptr);
      e->v_.push_back(nullptr);
      auto k = d->arena().Allocate(pool, "KV cache (K)");
      if (!k.ok()) return k.status();
      e->k_.back() = *k;
      auto v = d->arena().Allocate(pool, "KV cache (V)");
      if (!v.ok()) return v.status();
      e->v_.back() = *v;
    }
    m.BackendGauge("flashq_kv_cache_bytes", "Device bytes of the KV cache per GPU", {}).Set(double(pool) * 2);
    return e;
  }

  // Runs once the model's workers have stopped: the KV pages go back to the arena.
  ~CudaKvAttention() override {
    for (size_t i = 0; i < k_.size(); ++i) {
      ctx_[i]->arena().Free(k_[i]);
      ctx_[i]->arena().Free(v_[i]);
    }
  }

  using KvAttentionExecutor::Run;
  absl::Status Run(const KvBatch& b) override {
    std::vector<std::vector<int>> by_device(ctx_.size());
    for (size_t i = 0; i < b.items.size(); ++i) by_device[DeviceOf(b.items[i].sequence_id, ctx_.size())].push_back(int(i));
    std::vector<absl::Status> status(ctx_.size());
    std::vector<std::thread> others;
    for (size_t dev = 1; dev < ctx_.size(); ++dev) {
      if (by_device[dev].empty()) continue;
      others.emplace_back([&, dev] { status[dev] = RunDevice(int(dev), b, by_device[dev]); });
    }
    if (!by_device[0].empty()) status[0] = RunDevice(0, b, by_device[0]);
    for (auto& t : others) t.join();
    for (auto& s : status) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  CudaKvAttention(Contexts& ctx, ServerMetrics& m, const KvGeometry& g)
      : ctx_(ctx), g_(g), hist_(PerGpuHistograms(m, ctx, "paged_decode")) {}

  // Items go in groups that fit a stream's staging buffer (a long prefill needs much more
  // than a decode step).
  absl::Status RunDevice(int dev, const KvBatch& b, const std::vector<int>& items) {
    const size_t cap = ctx_[dev]->staging_bytes();
    std::vector<int> group;
    for (int i : items) {
      group.push_back(i);
      if (group.size() > 1 && StagingNeed(b, group) > cap) {
        group.pop_back();
        if (auto s = RunGroup(dev, b, group); !s.ok()) return s;
        group = {i};
      }
    }
    return group.empty() ? absl::OkStatus() : RunGroup(dev, b, group);
  }

  size_t StagingNeed(const KvBatch& b, const std::vector<int>& items) const {
    int width = 1, max_k = 0, total = 0;
    for (int i : items) {
      width = std::max(width, int(b.items[i].blocks->size()));
      max_k = std::max(max_k, int(b.items[i].start_pos + b.items[i].n));
      total += b.items[i].n;
    }
    const size_t n = items.size();
    const size_t q_elems = size_t(total) * g_.num_heads_q * g_.head_dim, kv_elems = size_t(total) * g_.num_heads_kv * g_.head_dim;
    const DType kdt = KernelDType(b.dtype);
    std::vector<size_t> sizes = {(n * width + n + n + 1) * 4};
    for (size_t e : {q_elems, kv_elems, kv_elems, q_elems}) BatchStaging::Need(&sizes, b.dtype, kdt, e);
    sizes.push_back(attention::PagedDecodeWorkspaceBytes(total, g_.num_heads_q, g_.head_dim, max_k));
    return Carver::Need(sizes);
  }

  absl::Status RunGroup(int dev, const KvBatch& b, const std::vector<int>& items) {
    if (StagingNeed(b, items) > ctx_[dev]->staging_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat("a kv_attention request of ", b.items[items[0]].n,
                                                       " new tokens needs ", StagingNeed(b, items),
                                                       " bytes of GPU staging; the limit is ",
                                                       ctx_[dev]->staging_bytes(), " (raise --gpu-staging-mb)"));
    }
    const int n = int(items.size());
    const DType kdt = KernelDType(b.dtype);
    int width = 1, max_q = 0, max_k = 0, total = 0;
    for (int i : items) {
      width = std::max(width, int(b.items[i].blocks->size()));
      max_q = std::max(max_q, b.items[i].n);
      max_k = std::max(max_k, int(b.items[i].start_pos + b.items[i].n));
      total += b.items[i].n;
    }
    // One host table: block table [n][width], then seqlens [n], then cu_seqlens_new [n + 1].
    std::vector<int32_t> tables(size_t(n) * width + n + n + 1, 0);
    int32_t* seqlens = tables.data() + size_t(n) * width;
    int32_t* cu = seqlens + n;
    Gather q, k, v;
    Scatter o;
    for (int j = 0; j < n; ++j) {
      const KvItem& it = b.items[items[j]];
      std::copy(it.blocks->begin(), it.blocks->end(), tables.begin() + size_t(j) * width);
      seqlens[j] = int32_t(it.start_pos + it.n);
      cu[j + 1] = cu[j] + it.n;
      for (auto [to, from] : {std::pair{&q, &it.q}, {&k, &it.k}, {&v, &it.v}})
        to->pieces.insert(to->pieces.end(), from->pieces.begin(), from->pieces.end());
      o.pieces.push_back(it.o);
    }
    const int64_t q_row = int64_t(g_.num_heads_q) * g_.head_dim, kv_row = int64_t(g_.num_heads_kv) * g_.head_dim;
    const size_t ws = attention::PagedDecodeWorkspaceBytes(total, g_.num_heads_q, g_.head_dim, max_k);
    SlotLease slot(*ctx_[dev]);
    BatchStaging st(*slot, b.times);
    char* tables_d = st.Take(tables.size() * 4);
    if (!tables_d) return absl::ResourceExhaustedError("kv_attention batch exceeds the GPU staging buffer");
    if (auto s = st.UploadHost(tables.data(), tables.size() * 4, tables_d); !s.ok()) return s;
    auto q_d = st.UploadAs(q, b.dtype, 0, total * q_row, kdt);
    if (!q_d.ok()) return q_d.status();
    auto k_d = st.UploadAs(k, b.dtype, 0, total * kv_row, kdt);
    if (!k_d.ok()) return k_d.status();
    auto v_d = st.UploadAs(v, b.dtype, 0, total * kv_row, kdt);
    if (!v_d.ok()) return v_d.status();
    char* o_d = st.Take(total * q_row * 2);
    char* w_d = st.Take(ws);
    if (!o_d || !w_d) return absl::ResourceExhaustedError("kv_attention batch exceeds the GPU staging buffer");

    const int64_t block_stride = int64_t(g_.page_size) * g_.num_heads_kv * g_.head_dim;
    const auto* table_d = reinterpret_cast<const int32_t*>(tables_d);
    attention::KvAppendParams a;
    a.k_new = *k_d;
    a.v_new = *v_d;
    a.k_cache = k_[dev];
    a.v_cache = v_[dev];
    a.block_table = table_d;
    a.seqlens_k = table_d + size_t(n) * width;
    a.cu_seqlens_new = a.seqlens_k + n;
    a.new_row_stride = kv_row;
    a.new_head_stride = g_.head_dim;
    a.kv_block_stride = block_stride;
    a.kv_row_stride = kv_row;
    a.kv_head_stride = g_.head_dim;
    a.batch = n;
    a.max_new = max_q;
    a.max_blocks_per_seq = width;
    a.page_size = g_.page_size;
    a.num_heads_kv = g_.num_heads_kv;
    a.head_dim = g_.head_dim;
    a.dtype = kdt;
    attention::PagedDecodeParams p;
    p.q = *q_d;
    p.k_cache = k_[dev];
    p.v_cache = v_[dev];
    p.o = o_d;
    p.block_table = a.block_table;
    p.seqlens_k = a.seqlens_k;
    p.cu_seqlens_q = a.cu_seqlens_new;
    p.workspace = w_d;
    p.workspace_bytes = ws;
    p.q_row_stride = p.o_row_stride = q_row;
    p.q_head_stride = p.o_head_stride = g_.head_dim;
    p.kv_block_stride = block_stride;
    p.kv_row_stride = kv_row;
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
    p.dtype = kdt;
    auto stream = st.stream();
    if (!stream.ok()) return stream.status();
    KernelTimer timer(*slot, *hist_[dev]);
    if (auto s = FromKernel(attention::RunKvAppend(a, *stream)); !s.ok()) return s;
    if (auto s = FromKernel(attention::RunPagedDecode(p, *stream)); !s.ok()) return s;
    timer.Stop();
    auto out = st.Convert(o_d, kdt, b.dtype, total * q_row);
    if (!out.ok()) return out.status();
    if (auto s = st.Download(*out, o, 0, total * q_row * DTypeSize(b.dtype)); !s.ok()) return s;
    if (auto s = st.Finish(); !s.ok()) return s;
    timer.Observe();
    return absl::OkStatus();
  }

  Contexts& ctx_;
  const KvGeometry g_;
  std::vector<prometheus::Histogram*> hist_;  // per GPU
  std::vector<char*> k_, v_;                  // per GPU: [num_blocks, page_size, Hkv, D]
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateCudaKvAttention(Contexts& ctx, ServerMetrics& metrics,
                                                                           const KvGeometry& g) {
  auto e = CudaKvAttention::Create(ctx, metrics, g);
  if (!e.ok()) return e.status();
  // Warm-up: a prefill and a decode step through block 0 on every GPU (block 0 is
  // rewritten before it is read by any real sequence that gets it).
  std::vector<int32_t> blocks(std::max(1, (70 + g.page_size - 1) / g.page_size));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = int32_t(i % g.num_blocks);
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (size_t dev = 0; dev < ctx.size(); ++dev) {
      for (auto [start, n] : {std::pair<int, int>{0, 69}, {69, 1}}) {
        std::vector<float> q(size_t(n) * g.num_heads_q * g.head_dim), k(size_t(n) * g.num_heads_kv * g.head_dim);
        for (float& f : q) f = nd(rng);
        for (float& f : k) f = nd(rng);
        std::string qb, kb;
        AppendFromFloat(t, q.data(), int64_t(q.size()), &qb);
        AppendFromFloat(t, k.data(), int64_t(k.size()), &kb);
        std::string id;  // one that hashes to this GPU
        for (int i = 0;; ++i) {
          id = absl::StrCat("warmup-", i);
          if (DeviceOf(id, ctx.size()) == dev) break;
        }
        KvBatch b;
        b.dtype = t;
        b.softmax_scale = 1.0f / std::sqrt(float(g.head_dim));
        const ConstBytes kv{kb.data(), kb.size()};
        b.items.push_back({id, HostBytes(qb), kv, kv, n, start, &blocks, {}});
        std::vector<std::string> outs;
        if (auto s = (*e)->Run(b, g.num_heads_q, g.head_dim, &outs); !s.ok()) return s;
      }
    }
  }
  return std::unique_ptr<KvAttentionExecutor>(std::move(*e));
}

}  // namespace flashq::server
