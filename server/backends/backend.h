// Backends run the arithmetic of a merged batch. The model kinds (server/models)
// do everything else, so the CPU and CUDA backends see the same batches and the CPU
// backend is the reference for the CUDA one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"
#include "kernels/gemm/quant_formats.h"

namespace flashq::server {

// ---- attention over a ragged batch (varlen) --------------------------------
struct AttentionBatch {
  DType dtype = DType::kF16;  // of Q, K, V and O
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
  bool causal = false;
  float softmax_scale = 1.0f;
  bool want_lse = false;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;  // [b + 1]
  int max_seqlen_q = 0, max_seqlen_k = 0;
  std::string_view q, k, v;                         // [total_q, Hq, D], [total_k, Hkv, D]
};

class AttentionExecutor {
 public:
  virtual ~AttentionExecutor() = default;
  // o: [total_q, Hq, D] in batch.dtype; lse (if want_lse): [Hq, total_q].
  virtual absl::Status Run(const AttentionBatch& batch, std::string* o, std::vector<float>* lse) = 0;
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
  std::string_view q, k, v;            // new tokens: [n, Hq, D], [n, Hkv, D]
  int n = 0;
  int64_t start_pos = 0;               // tokens already cached for this sequence
  const std::vector<int32_t>* blocks;  // block table covering start_pos + n tokens
};

struct KvBatch {
  DType dtype = DType::kF16;
  float softmax_scale = 1.0f;
  std::vector<KvItem> items;           // distinct sequences
};

class KvAttentionExecutor {
 public:
  virtual ~KvAttentionExecutor() = default;
  // Appends each item's K/V to the cache, then attends causally over the whole
  // sequence. outputs[i]: [n_i, Hq, D] in batch.dtype.
  virtual absl::Status Run(const KvBatch& batch, std::vector<std::string>* outputs) = 0;
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
};

class LinearExecutor {
 public:
  virtual ~LinearExecutor() = default;
  // y[M][N] = x[M][K] · Wᵀ; x and y in `dtype` (FP16, BF16 or FP32).
  virtual absl::Status Run(DType dtype, int M, std::string_view x, std::string* y) = 0;
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
  virtual absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateAttention() = 0;
  virtual absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateKvAttention(const KvGeometry& geometry) = 0;
  // Takes the weights (the CUDA backend uploads them once and frees the host copy).
  virtual absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights weights) = 0;
};

}  // namespace flashq::server
