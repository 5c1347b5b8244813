#include "server/backends/cpu/cpu_backend.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_ref.h"
#include "kernels/gemm/gemm_ref.h"
#include "server/core/tensor.h"

namespace flashq::server {
namespace {

// A batch's input as floats. The CPU backend has no device memory, so every piece is host
// memory (ordinary or page-locked). A piece may end inside an element (a tensor left in
// the transport's receive buffers): that element is joined from the next piece.
std::vector<float> GatherAsFloat(DType t, const Gather& g) {
  const size_t size = DTypeSize(t);
  std::vector<float> out;
  out.reserve(g.size() / size);
  std::string split;
  for (const ConstBytes& p : g.pieces) {
    std::string_view s(p.data, p.size);
    if (!split.empty()) {
      const size_t take = std::min(size - split.size(), s.size());
      split.append(s.substr(0, take));
      s.remove_prefix(take);
      if (split.size() < size) continue;
      AppendAsFloat(t, split, &out);
      split.clear();
    }
    const size_t whole = s.size() / size * size;
    AppendAsFloat(t, s.substr(0, whole), &out);
    split.assign(s.substr(whole));
  }
  return out;
}

// Rounds `n` floats to `t` and writes them across the destinations (null ones drop theirs).
void ScatterFromFloat(DType t, const float* src, int64_t n, const Scatter& dst) {
  std::string bytes;
  AppendFromFloat(t, src, n, &bytes);
  size_t off = 0;
  for (const MutableBytes& p : dst.pieces) {
    if (p.data) std::memcpy(p.data, bytes.data() + off, std::min(p.size, bytes.size() - off));
    off += p.size;
  }
}

class CpuAttention : public AttentionExecutor {
 public:
  explicit CpuAttention(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)) {}

  using AttentionExecutor::Run;
  absl::Status Run(const AttentionBatch& b, std::vector<float>* lse) override {
    std::vector<float> q, k, v;
    {
      StageTimer t(b.times, StageTimes::kInput);
      q = GatherAsFloat(b.dtype, b.q), k = GatherAsFloat(b.dtype, b.k), v = GatherAsFloat(b.dtype, b.v);
    }
    const int batch = int(b.cu_seqlens_q.size()) - 1;
    const int64_t total_q = b.cu_seqlens_q.back();
    const int64_t q_row = int64_t(b.num_heads_q) * b.head_dim, kv_row = int64_t(b.num_heads_kv) * b.head_dim;
    std::vector<float> out(total_q * q_row);
    if (b.want_lse) lse->assign(size_t(b.num_heads_q) * total_q, 0.0f);
    // One sequence per task: each sequence's result depends on nothing else in the batch.
    pool_->ParallelFor(batch, [&](int s) {
      const int32_t q0 = b.cu_seqlens_q[s], q1 = b.cu_seqlens_q[s + 1];
      const int32_t k0 = b.cu_seqlens_k[s], k1 = b.cu_seqlens_k[s + 1];
      const int32_t cu_q[2] = {0, q1 - q0}, cu_k[2] = {0, k1 - k0};
      attention::AttentionShape shape{1, b.num_heads_q, b.num_heads_kv, b.head_dim, b.softmax_scale, b.causal};
      std::vector<float> seq_lse(b.want_lse ? size_t(b.num_heads_q) * (q1 - q0) : 0);
      attention::VarlenAttentionRef<float>(q.data() + q0 * q_row, k.data() + k0 * kv_row, v.data() + k0 * kv_row, cu_q,
                                           cu_k, shape, out.data() + q0 * q_row, b.want_lse ? seq_lse.data() : nullptr);
      if (b.want_lse) {
        for (int h = 0; h < b.num_heads_q; ++h) {
          std::memcpy(lse->data() + h * total_q + q0, seq_lse.data() + int64_t(h) * (q1 - q0), (q1 - q0) * 4);
        }
      }
    });
    StageTimer t(b.times, StageTimes::kOutput);
    ScatterFromFloat(b.dtype, out.data(), int64_t(out.size()), b.o);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<ThreadPool> pool_;
};

class CpuKvAttention : public KvAttentionExecutor {
 public:
  CpuKvAttention(const KvGeometry& g, std::shared_ptr<ThreadPool> pool)
      : g_(g), pool_(std::move(pool)),
        page_elems_(int64_t(g.page_size) * g.num_heads_kv * g.head_dim),
        k_cache_(size_t(g.num_blocks) * page_elems_), v_cache_(size_t(g.num_blocks) * page_elems_) {}

  using KvAttentionExecutor::Run;
  absl::Status Run(const KvBatch& b) override {
    const int64_t kv_row = int64_t(g_.num_heads_kv) * g_.head_dim, q_row = int64_t(g_.num_heads_q) * g_.head_dim;
    // Items are distinct sequences with disjoint blocks, so they run independently.
    pool_->ParallelFor(int(b.items.size()), [&](int i) {
      const KvItem& it = b.items[i];
      // Each sequence's copies run inside its own task, beside the others' compute: they are
      // not counted as the batch's input or output time.
      const std::vector<float> q = GatherAsFloat(b.dtype, it.q), k = GatherAsFloat(b.dtype, it.k),
                               v = GatherAsFloat(b.dtype, it.v);
      for (int t = 0; t < it.n; ++t) {  // append the new tokens to their pages
        const int64_t pos = it.start_pos + t;
        const int64_t block = (*it.blocks)[pos / g_.page_size];
        const int64_t off = block * page_elems_ + (pos % g_.page_size) * kv_row;
        std::memcpy(&k_cache_[off], &k[t * kv_row], kv_row * 4);
        std::memcpy(&v_cache_[off], &v[t * kv_row], kv_row * 4);
      }
      const int32_t seqlen = int32_t(it.start_pos + it.n);
      const int32_t cu_q[2] = {0, it.n};
      attention::AttentionShape shape{1, g_.num_heads_q, g_.num_heads_kv, g_.head_dim, b.softmax_scale, true};
      std::vector<float> o(it.n * q_row);
      attention::PagedAttentionRef<float>(q.data(), k_cache_.data(), v_cache_.data(), it.blocks->data(),
                                          int(it.blocks->size()), g_.page_size, &seqlen, cu_q, shape, o.data(), nullptr);
      ScatterFromFloat(b.dtype, o.data(), int64_t(o.size()), Scatter{{it.o}});
    });
    return absl::OkStatus();
  }

 private:
  const KvGeometry g_;
  std::shared_ptr<ThreadPool> pool_;
  const int64_t page_elems_;
  std::vector<float> k_cache_, v_cache_;  // [num_blocks, page_size, Hkv, D]
};

// Slices of a layer along N: rows [n0, n1) of W, as a layer of its own.
LinearWeights SliceN(const LinearWeights& w, int n0, int n1) {
  LinearWeights s;
  s.format = w.format;
  s.K = w.K;
  s.N = n1 - n0;
  s.fp8_activations = w.fp8_activations;
  s.fp8_input_scale = w.fp8_input_scale;
  const size_t K = size_t(w.K);
  switch (w.format) {
    case WeightFormat::kBf16: s.bf16.assign(w.bf16.begin() + n0 * K, w.bf16.begin() + n1 * K); break;
    case WeightFormat::kInt4: {
      const size_t g = size_t(w.int4.num_groups());
      s.int4.K = w.int4.K;  // not a copy of the whole layer: only the slice's rows are copied
      s.int4.group_size = w.int4.group_size;
      s.int4.g_idx = w.int4.g_idx;
      s.int4.N = s.N;
      s.int4.q.assign(w.int4.q.begin() + n0 * K, w.int4.q.begin() + n1 * K);
      s.int4.scales.assign(w.int4.scales.begin() + n0 * g, w.int4.scales.begin() + n1 * g);
      s.int4.zeros.assign(w.int4.zeros.begin() + n0 * g, w.int4.zeros.begin() + n1 * g);
      break;
    }
    case WeightFormat::kFp8:
      s.fp8.K = w.K;
      s.fp8.N = s.N;
      s.fp8.w.assign(w.fp8.w.begin() + n0 * K, w.fp8.w.begin() + n1 * K);
      s.fp8.scale = w.fp8.scale.size() == 1 ? w.fp8.scale
                                            : std::vector<float>(w.fp8.scale.begin() + n0, w.fp8.scale.begin() + n1);
      break;
  }
  return s;
}

// The layer is cut along N into one slice per thread, so even M = 1 uses every core.
// Each output element is computed by the same code whatever the slicing or M, so the
// result is deterministic and batch-invariant.
class CpuLinear : public LinearExecutor {
 public:
  CpuLinear(const LinearWeights& w, std::shared_ptr<ThreadPool> pool)
      : LinearExecutor(w.N), K_(w.K), bias_(w.bias), pool_(std::move(pool)) {
    const int parts = std::max(1, std::min(pool_->size(), w.N / 64));
    for (int p = 0; p < parts; ++p) {
      const int n0 = int(int64_t(w.N) * p / parts), n1 = int(int64_t(w.N) * (p + 1) / parts);
      slices_.push_back({n0, SliceN(w, n0, n1)});
    }
  }

  using LinearExecutor::Run;
  absl::Status Run(DType dtype, int M, const Gather& x_in, const Scatter& y_out, StageTimes* times) override {
    std::vector<float> x;
    {
      StageTimer t(times, StageTimes::kInput);
      x = GatherAsFloat(dtype, x_in);
    }
    const int N = this->N();
    std::vector<float> y(size_t(M) * N);
    pool_->ParallelFor(int(slices_.size()), [&](int p) {
      const auto& [n0, w] = slices_[p];
      std::vector<float> part(size_t(M) * w.N);
      switch (w.format) {
        case WeightFormat::kBf16: gemm::LinearRefBf16<float>(x.data(), M, K_, w.bf16.data(), w.N, part.data()); break;
        case WeightFormat::kInt4: gemm::LinearRefInt4<float>(x.data(), M, w.int4, part.data()); break;
        case WeightFormat::kFp8:
          if (w.fp8_activations && w.fp8_input_scale > 0) {
            gemm::LinearRefFp8W8A8Static<float>(x.data(), M, w.fp8, w.fp8_input_scale, part.data());
          } else if (w.fp8_activations) {
            gemm::LinearRefFp8W8A8<float>(x.data(), M, w.fp8, /*per_row_act=*/true, part.data());
          } else {
            gemm::LinearRefFp8W8A16<float>(x.data(), M, w.fp8, part.data());
          }
          break;
      }
      for (int m = 0; m < M; ++m) {
        std::copy(part.begin() + size_t(m) * w.N, part.begin() + size_t(m + 1) * w.N, y.begin() + size_t(m) * N + n0);
      }
    });
    if (!bias_.empty()) {  // in Y's type: round, add through float, round again
      for (size_t i = 0; i < y.size(); ++i) y[i] = RoundThrough(dtype, RoundThrough(dtype, y[i]) + bias_[i % N]);
    }
    StageTimer t(times, StageTimes::kOutput);
    ScatterFromFloat(dtype, y.data(), int64_t(y.size()), y_out);
    return absl::OkStatus();
  }

 private:
  const int K_;
  const std::vector<float> bias_;
  std::shared_ptr<ThreadPool> pool_;
  std::vector<std::pair<int, LinearWeights>> slices_;
};

// MemAvailable from /proc/meminfo: what new allocations can use without swapping; the
// physical memory where that file is missing.
int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  long long kb = 0;
  for (std::string line; std::getline(meminfo, line);) {
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) return int64_t(kb) * 1024;
  }
  return int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : pool_(std::make_shared<ThreadPool>(options.cpu_threads > 0 ? options.cpu_threads
                                                                 : int(std::max(1u, std::thread::hardware_concurrency())))) {}

absl::StatusOr<std::unique_ptr<AttentionExecutor>> CpuBackend::CreateAttention() {
  return std::unique_ptr<AttentionExecutor>(new CpuAttention(pool_));
}

absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CpuBackend::CreateKvAttention(const KvGeometry& g) {
  // Refused here rather than by the allocator: Linux overcommits, so a cache larger than
  // the machine would be granted and then end the process as its pages are zeroed.
  const int64_t need = 2 * g.pool_elements() * int64_t(sizeof(float));
  const int64_t have = AvailableHostBytes();
  if (need > have) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV cache needs ", need, " bytes of host memory (K and V, num_blocks ", g.num_blocks, " x page_size ",
        g.page_size, " x num_heads_kv ", g.num_heads_kv, " x head_dim ", g.head_dim, " x 4 bytes); ", have,
        " bytes are available; lower num_blocks (or --kv-cache-blocks)"));
  }
  return std::unique_ptr<KvAttentionExecutor>(new CpuKvAttention(g, pool_));
}

absl::StatusOr<std::unique_ptr<LinearExecutor>> CpuBackend::CreateLinear(LinearWeights weights) {
  return std::unique_ptr<LinearExecutor>(new CpuLinear(weights, pool_));
}

}  // namespace flashq::server
