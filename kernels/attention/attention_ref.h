// CPU reference attention (plain C++, no CUDA): the server's CPU backend (Acc = float)
// and the tests' float64 reference (Acc = double).
//
// Layouts (row-major float):
//   varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens_q/k [batch+1] int32
//   paged:  q [total_q, Hq, D], k_cache/v_cache [num_blocks, page_size, Hkv, D],
//           block_table [batch, max_blocks_per_seq], seqlens_k [batch], cu_seqlens_q [batch+1]
//   o [total_q, Hq, D]; lse (optional) [Hq, total_q], natural log.
// Causal masking is bottom-right aligned: query i of a sequence with lq queries and lk keys
// sees keys j <= i + lk - lq. A query row that sees no key gets o = 0 and lse = -inf.
// GQA: query head h reads kv head h / (Hq / Hkv).
#pragma once

#include <cstdint>

#include "common/status.h"

namespace flashq::attention {

struct AttentionShape {
  int batch;
  int num_heads_q;
  int num_heads_kv;
  int head_dim;
  float softmax_scale;
  bool causal;
};

template <typename Acc>
void VarlenAttentionRef(const float* q, const float* k, const float* v, const int32_t* cu_seqlens_q,
                        const int32_t* cu_seqlens_k, const AttentionShape& shape, float* o, float* lse);

template <typename Acc>
void PagedAttentionRef(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                       int max_blocks_per_seq, int page_size, const int32_t* seqlens_k, const int32_t* cu_seqlens_q,
                       const AttentionShape& shape, float* o, float* lse);

extern template void VarlenAttentionRef<float>(const float*, const float*, const float*, const int32_t*,
                                               const int32_t*, const AttentionShape&, float*, float*);
extern template void VarlenAttentionRef<double>(const float*, const float*, const float*, const int32_t*,
                                                const int32_t*, const AttentionShape&, float*, float*);
extern template void PagedAttentionRef<float>(const float*, const float*, const float*, const int32_t*, int, int,
                                              const int32_t*, const int32_t*, const AttentionShape&, float*, float*);
extern template void PagedAttentionRef<double>(const float*, const float*, const float*, const int32_t*, int, int,
                                               const int32_t*, const int32_t*, const AttentionShape&, float*, float*);

// Checks of the reference's inputs (host side; the tests run them on the cases they generate, the server's models
// validate requests themselves).
// Heads > 0, Hq a multiple of Hkv, head_dim > 0, batch >= 0, softmax_scale finite and > 0.
Status CheckShape(const AttentionShape& shape);
// Paged: every seqlens_k[b] fits in max_blocks_per_seq * page_size, every block id used is in
// [0, num_blocks), and the new tokens fit (cu_seqlens_q[b+1] - cu_seqlens_q[b] <= seqlens_k[b]).
Status CheckPaged(const int32_t* block_table, int max_blocks_per_seq, int page_size, int num_blocks,
                  const int32_t* seqlens_k, const int32_t* cu_seqlens_q, int batch);

}  // namespace flashq::attention
