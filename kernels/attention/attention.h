// GPU attention API: varlen prefill, paged split-KV decode, KV-cache append.
//
// Plain parameter structs (raw device pointers, element strides as int64, cu_seqlens), passed by
// value to one non-template launcher each. The launchers validate what they can on the host
// without reading device memory, pick the precompiled instantiation (dtype x head dim x causal),
// and launch on the given stream. They never allocate, plan or synchronize.
//
// Batch invariance: every tile, split and reduction order is a function of one sequence's own
// lengths (fixed tile sizes, fixed split size), so a sequence's output is bitwise identical
// whether it runs alone or in any ragged batch, and across runs.
//
// This header is includable without CUDA. Without CUDA the launchers return Unimplemented.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

#if defined(FLASHQ_HAVE_CUDA)
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif

namespace flashq::attention {

// Head dims with a compiled kernel.
constexpr bool SupportedHeadDim(int d) { return d == 64 || d == 128 || d == 256; }

// Varlen prefill. q [total_q, Hq, D], k/v [total_k, Hkv, D], o [total_q, Hq, D] in `dtype`
// (kF16 or kBF16); strides are in elements, the last dim is contiguous, base pointers 16-byte
// aligned and row/head strides multiples of 8. lse (optional, fp32) is [Hq, total_q] with row
// stride lse_head_stride (0 means total_q). cu_seqlens_* are device int32 [batch+1].
// max_seqlen_q sizes the grid and must be >= every sequence's q length (it is not read per
// sequence, so any upper bound gives the same bits).
struct VarlenAttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t k_row_stride = 0, k_head_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;
  int64_t lse_head_stride = 0;
  int batch = 0;
  int num_heads_q = 0;
  int num_heads_kv = 0;
  int head_dim = 0;
  int max_seqlen_q = 0;
  float softmax_scale = 0.0f;
  bool causal = false;
  DType dtype = DType::kBF16;
};

Status RunVarlenAttention(const VarlenAttentionParams& params, cudaStream_t stream);

// Paged decode (q_len >= 1 new tokens per sequence, causal inside them, bottom-right).
// q [total_q, Hq, D]; k_cache/v_cache [num_blocks, page_size, Hkv, D] addressed through the
// strides below; block_table [batch, max_blocks_per_seq] int32; seqlens_k [batch] = cached tokens
// including the new ones; cu_seqlens_q [batch+1]. All index arrays are device memory.
// The KV of a sequence is cut into splits of `split_tokens` keys (a fixed size, never a fixed
// count, for batch invariance); each (sequence, kv head, split) is one CTA that handles all
// Hq/Hkv query heads of that kv head together (GQA packing: each K/V byte is read once), and a
// second kernel merges the splits with their log-sum-exp. Sequences with one split skip it.
// workspace: device memory of PagedDecodeWorkspaceBytes(...) bytes, 16-byte aligned.
struct PagedDecodeParams {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // optional [Hq, total_q]
  const int32_t* block_table = nullptr;
  const int32_t* seqlens_k = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;
  int64_t kv_block_stride = 0, kv_row_stride = 0, kv_head_stride = 0;  // shared by k_cache and v_cache
  int64_t lse_head_stride = 0;                                          // 0 means total_q
  int total_q = 0;
  int batch = 0;
  int max_blocks_per_seq = 0;
  int page_size = 0;      // any value >= 1 (16..256 in practice)
  int max_seqlen_q = 0;   // upper bound of q lengths
  int max_seqlen_k = 0;   // upper bound of seqlens_k
  int num_heads_q = 0;
  int num_heads_kv = 0;
  int head_dim = 0;
  int split_tokens = 0;   // 0 = kDefaultSplitTokens; else a multiple of 64
  float softmax_scale = 0.0f;
  bool causal = true;
  DType dtype = DType::kBF16;
};

constexpr int kDefaultSplitTokens = 1024;  // measured best single value on H200 (docs/perf/attention.md)

// Bytes of workspace RunPagedDecode needs for these bounds (fp32 partial O and LSE per
// (token, head, split)).
size_t PagedDecodeWorkspaceBytes(int total_q, int num_heads_q, int head_dim, int max_seqlen_k,
                                   int split_tokens = 0);

Status RunPagedDecode(const PagedDecodeParams& params, cudaStream_t stream);

// Append new K/V rows into the paged cache. k_new/v_new [total_new, Hkv, D]; token i of sequence
// b (0 <= i < n_b = cu_seqlens_new[b+1] - cu_seqlens_new[b]) goes to position
// seqlens_k[b] - n_b + i, i.e. seqlens_k already counts the new tokens.
struct KvAppendParams {
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* seqlens_k = nullptr;
  const int32_t* cu_seqlens_new = nullptr;
  int64_t new_row_stride = 0, new_head_stride = 0;                      // shared by k_new and v_new
  int64_t kv_block_stride = 0, kv_row_stride = 0, kv_head_stride = 0;  // shared by the caches
  int batch = 0;
  int max_new = 0;  // upper bound of n_b
  int max_blocks_per_seq = 0;
  int page_size = 0;
  int num_heads_kv = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;
};

Status RunKvAppend(const KvAppendParams& params, cudaStream_t stream);

}  // namespace flashq::attention
