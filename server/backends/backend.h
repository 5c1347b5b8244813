// Backends run the arithmetic of a merged batch. The model kinds (server/models)
// do everything else, so the CPU and CUDA backends see the same batches and the CPU
// backend is the reference for the CUDA one.
//
// A batch's tensors are not merged on the host: each input is a Gather of the requests'
// own bytes and each output a Scatter into the requests' own destinations (a response
// buffer or a shared-memory region), so that a backend moves every byte once each way.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/gemm/quant_formats.h"
#include "server/core/shared_memory.h"
#include "server/core/tensor.h"

namespace flashq::server {

// One tensor of a batch: pieces laid end to end, typically one per request.
struct Gather {
  std::vector<ConstBytes> pieces;
  Gather() = default;
  Gather(std::string_view host) {  // one piece of ordinary host memory
    if (!host.empty()) pieces.push_back({host.data(), host.size()});
  }
  Gather(const std::string& host) : Gather(std::string_view(host)) {}
  Gather(ConstBytes one) {
    if (one.size) pieces.push_back(one);
  }
  size_t size() const {
    size_t n = 0;
    for (const ConstBytes& p : pieces) n += p.size;
    return n;
  }
};

// Where a batch's output goes: destinations laid end to end, one per request; a piece
// with null data drops its bytes (a request that did not ask for that output).
struct Scatter {
  std::vector<MutableBytes> pieces;
  size_t size() const {
    size_t n = 0;
    for (const MutableBytes& p : pieces) n += p.size;
    return n;
  }
};

// One host destination of `bytes` bytes, sized in `out`.
inline Scatter IntoString(std::string* out, size_t bytes) {
  out->resize(bytes);
  Scatter s;
  if (bytes) s.pieces.push_back({out->data(), bytes});
  return s;
}

// Where an executor adds the host time of a batch's input and output copies (staging,
// conversion, scatter), which ModelStatistics reports as compute_input and compute_output.
// Atomic: a batch may run on several GPUs' threads at once.
struct StageTimes {
  enum Stage { kInput, kOutput };
  std::atomic<uint64_t> input_ns{0}, output_ns{0};
  // Adds the time since `start` to `stage`; nothing when `times` is null.
  static void AddSince(StageTimes* times, Stage stage, std::chrono::steady_clock::time_point start) {
    if (!times) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    (stage == kInput ? times->input_ns : times->output_ns).fetch_add(uint64_t(ns.count()));
  }
};

// Adds the time from construction to destruction to one stage of `times` (may be null).
class StageTimer {
 public:
  StageTimer(StageTimes* times, StageTimes::Stage stage)
      : times_(times), stage_(stage), start_(std::chrono::steady_clock::now()) {}
  ~StageTimer() { StageTimes::AddSince(times_, stage_, start_); }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  StageTimes* times_;
  StageTimes::Stage stage_;
  std::chrono::steady_clock::time_point start_;
};

// ---- attention over a ragged batch (varlen) --------------------------------
struct AttentionBatch {
  DType dtype = DType::kF16;  // of Q, K, V and O
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
  bool causal = false;
  float softmax_scale = 1.0f;
  bool want_lse = false;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;  // [b + 1]
  int max_seqlen_q = 0, max_seqlen_k = 0;
  Gather q, k, v;                                   // [total_q, Hq, D], [total_k, Hkv, D]
  Scatter o;                                        // [total_q, Hq, D]
  StageTimes* times = nullptr;                      // may be null
};

class AttentionExecutor {
 public:
  virtual ~AttentionExecutor() = default;
  // Writes O ([total_q, Hq, D] in batch.dtype) into batch.o, and lse (if want_lse) as
  // [Hq, total_q].
  virtual absl::Status Run(const AttentionBatch& batch, std::vector<float>* lse) = 0;
  // The same with O in one host string.
  absl::Status Run(AttentionBatch batch, std::string* o, std::vector<float>* lse) {
    batch.o = IntoString(o, size_t(batch.cu_seqlens_q.back()) * batch.num_heads_q * batch.head_dim * DTypeSize(batch.dtype));
    return Run(static_cast<const AttentionBatch&>(batch), lse);
  }
};

// ---- attention over a paged KV cache (kv_attention) ------------------------
struct KvGeometry {
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
  int page_size = 16, num_blocks = 0;
  int max_blocks_per_sequence = 0;
  // Elements of the K (or V) page pool. The model checks that this product fits far below
  // INT64_MAX before a backend sees the geometry, so backends may scale it by a dtype size.
  int64_t pool_elements() const { return int64_t(num_blocks) * page_size * num_heads_kv * head_dim; }
};

struct KvItem {
  std::string_view sequence_id;        // pins the sequence to one GPU
  Gather q, k, v;                      // new tokens: [n, Hq, D], [n, Hkv, D]
  int n = 0;
  int64_t start_pos = 0;               // tokens already cached for this sequence
  const std::vector<int32_t>* blocks = nullptr;  // block table covering start_pos + n tokens
  MutableBytes o;                      // [n, Hq, D]
};

struct KvBatch {
  DType dtype = DType::kF16;
  float softmax_scale = 1.0f;
  std::vector<KvItem> items;           // distinct sequences
  StageTimes* times = nullptr;         // may be null
};

class KvAttentionExecutor {
 public:
  virtual ~KvAttentionExecutor() = default;
  // Appends each item's K/V to the cache, then attends causally over the whole
  // sequence, writing item i's [n_i, Hq, D] in batch.dtype into items[i].o.
  virtual absl::Status Run(const KvBatch& batch) = 0;
  // The same with each item's output in a host string of its own.
  absl::Status Run(KvBatch batch, int num_heads_q, int head_dim, std::vector<std::string>* outputs) {
    outputs->assign(batch.items.size(), std::string());
    for (size_t i = 0; i < batch.items.size(); ++i) {
      KvItem& it = batch.items[i];
      const size_t bytes = size_t(it.n) * num_heads_q * head_dim * DTypeSize(batch.dtype);
      (*outputs)[i].resize(bytes);
      it.o = {(*outputs)[i].data(), bytes};
    }
    return Run(static_cast<const KvBatch&>(batch));
  }
};

// ---- linear layers ----------------------------------------------------------
enum class WeightFormat { kBf16, kInt4, kFp8 };

struct LinearWeights {
  WeightFormat format = WeightFormat::kBf16;
  int K = 0, N = 0;
  std::vector<uint16_t> bf16;          // kBf16: [N][K]
  gemm::Int4Weights int4;              // kInt4 (from GPTQ or AWQ checkpoints)
  gemm::Fp8Weights fp8;                // kFp8
  bool fp8_activations = false;        // kFp8: W8A8 (true) or W8A16 (false)
  // kFp8 W8A8: > 0, the checkpoint's static activation scale (x8 = satfinite(x / scale));
  // 0, a scale per row from its amax (dynamic).
  float fp8_input_scale = 0.0f;
  // [N] or empty. Added to Y in Y's type, through float (FP16/BF16 outputs round twice).
  std::vector<float> bias;
};

class LinearExecutor {
 public:
  explicit LinearExecutor(int N) : N_(N) {}
  virtual ~LinearExecutor() = default;
  // y[M][N] = x[M][K] · Wᵀ (+ bias); x and y in `dtype` (FP16, BF16 or FP32). Copy times go
  // to `times` unless it is null.
  virtual absl::Status Run(DType dtype, int M, const Gather& x, const Scatter& y, StageTimes* times) = 0;
  // The same with y in one host string.
  absl::Status Run(DType dtype, int M, std::string_view x, std::string* y) {
    return Run(dtype, M, Gather(x), IntoString(y, size_t(M) * N_ * DTypeSize(dtype)), nullptr);
  }
  int N() const { return N_; }

 private:
  const int N_;
};

// ---- the backend ------------------------------------------------------------
struct BackendOptions {
  bool batch_invariant = true;
  int cpu_threads = 0;                 // 0: hardware concurrency
  // cuda: streams (each with its own pinned staging and device buffers) per GPU;
  // consecutive batches overlap their copies and kernels across them.
  int streams_per_device = 2;
  int64_t staging_bytes = int64_t(128) << 20;  // per stream, host (pinned) and device each
  int64_t arena_bytes = int64_t(2) << 30;      // per GPU, allocated once at start-up
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Devices the backend computes on: its GPUs, or 1 for the CPU.
  virtual int devices() const { return 1; }
  virtual absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateAttention() = 0;
  virtual absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateKvAttention(const KvGeometry& geometry) = 0;
  // Takes the weights (the CUDA backend uploads them once and frees the host copy).
  virtual absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights weights) = 0;
  // Page-locking and CUDA IPC for shared-memory regions; null for a backend without GPUs.
  virtual DeviceMemoryAccess* device_memory() { return nullptr; }
};

}  // namespace flashq::server
