// CPU reference attention: two passes per query row (scores and max, then exp-sum and P*V),
// accumulated in Acc. O(lq * lk * D) per head; meant for correctness, not speed.
#include "kernels/attention/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace flashq::attention {
namespace {

// One sequence, one query head. key_row(j) / value_row(j) return the D floats of key j.
template <typename Acc, typename KeyRow, typename ValueRow>
void AttendRows(const float* q, int64_t q_row_stride, int lq, int lk, const AttentionShape& s, KeyRow key_row,
                ValueRow value_row, float* o, int64_t o_row_stride, float* lse, std::vector<Acc>& scores,
                std::vector<Acc>& acc) {
  const int d = s.head_dim;
  scores.resize(size_t(lk > 0 ? lk : 1));
  acc.resize(size_t(d));
  for (int i = 0; i < lq; ++i) {
    const float* qi = q + int64_t(i) * q_row_stride;
    float* oi = o + int64_t(i) * o_row_stride;
    int visible = lk;
    if (s.causal) {
      const int64_t last = int64_t(i) + lk - lq;  // bottom-right aligned
      visible = last < 0 ? 0 : int(std::min<int64_t>(last + 1, lk));
    }
    if (visible == 0) {
      for (int c = 0; c < d; ++c) oi[c] = 0.0f;
      if (lse) lse[i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    Acc mx = -std::numeric_limits<Acc>::infinity();
    for (int j = 0; j < visible; ++j) {
      const float* kj = key_row(j);
      Acc dot = 0;
      for (int c = 0; c < d; ++c) dot += Acc(qi[c]) * Acc(kj[c]);
      scores[size_t(j)] = dot * Acc(s.softmax_scale);
      if (scores[size_t(j)] > mx) mx = scores[size_t(j)];
    }
    Acc sum = 0;
    for (int c = 0; c < d; ++c) acc[size_t(c)] = 0;
    for (int j = 0; j < visible; ++j) {
      const Acc p = std::exp(scores[size_t(j)] - mx);
      sum += p;
      const float* vj = value_row(j);
      for (int c = 0; c < d; ++c) acc[size_t(c)] += p * Acc(vj[c]);
    }
    for (int c = 0; c < d; ++c) oi[c] = float(acc[size_t(c)] / sum);
    if (lse) lse[i] = float(mx + std::log(sum));
  }
}

}  // namespace

template <typename Acc>
void VarlenAttentionRef(const float* q, const float* k, const float* v, const int32_t* cu_seqlens_q,
                        const int32_t* cu_seqlens_k, const AttentionShape& s, float* o, float* lse) {
  const int hq = s.num_heads_q, hkv = s.num_heads_kv, d = s.head_dim;
  const int group = hq / hkv;
  const int64_t total_q = cu_seqlens_q[s.batch];
  std::vector<Acc> scores, acc;
  std::vector<float> lse_row;
  for (int b = 0; b < s.batch; ++b) {
    const int64_t q0 = cu_seqlens_q[b], k0 = cu_seqlens_k[b];
    const int lq = int(cu_seqlens_q[b + 1] - q0), lk = int(cu_seqlens_k[b + 1] - k0);
    lse_row.resize(size_t(lq > 0 ? lq : 1));
    for (int h = 0; h < hq; ++h) {
      const int hk = h / group;
      auto key_row = [&](int j) { return k + ((k0 + j) * hkv + hk) * d; };
      auto value_row = [&](int j) { return v + ((k0 + j) * hkv + hk) * d; };
      AttendRows<Acc>(q + (q0 * hq + h) * d, int64_t(hq) * d, lq, lk, s, key_row, value_row,
                      o + (q0 * hq + h) * d, int64_t(hq) * d, lse ? lse_row.data() : nullptr, scores, acc);
      if (lse)
        for (int i = 0; i < lq; ++i) lse[int64_t(h) * total_q + q0 + i] = lse_row[size_t(i)];
    }
  }
}

template <typename Acc>
void PagedAttentionRef(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
                       int max_blocks_per_seq, int page_size, const int32_t* seqlens_k, const int32_t* cu_seqlens_q,
                       const AttentionShape& s, float* o, float* lse) {
  const int hq = s.num_heads_q, hkv = s.num_heads_kv, d = s.head_dim;
  const int group = hq / hkv;
  const int64_t total_q = cu_seqlens_q[s.batch];
  std::vector<Acc> scores, acc;
  std::vector<float> lse_row;
  for (int b = 0; b < s.batch; ++b) {
    const int64_t q0 = cu_seqlens_q[b];
    const int lq = int(cu_seqlens_q[b + 1] - q0), lk = seqlens_k[b];
    const int32_t* table = block_table + int64_t(b) * max_blocks_per_seq;
    lse_row.resize(size_t(lq > 0 ? lq : 1));
    for (int h = 0; h < hq; ++h) {
      const int hk = h / group;
      auto slot = [&](int j) {
        return (int64_t(table[j / page_size]) * page_size + j % page_size) * hkv + hk;
      };
      auto key_row = [&](int j) { return k_cache + slot(j) * d; };
      auto value_row = [&](int j) { return v_cache + slot(j) * d; };
      AttendRows<Acc>(q + (q0 * hq + h) * d, int64_t(hq) * d, lq, lk, s, key_row, value_row,
                      o + (q0 * hq + h) * d, int64_t(hq) * d, lse ? lse_row.data() : nullptr, scores, acc);
      if (lse)
        for (int i = 0; i < lq; ++i) lse[int64_t(h) * total_q + q0 + i] = lse_row[size_t(i)];
    }
  }
}

template void VarlenAttentionRef<float>(const float*, const float*, const float*, const int32_t*, const int32_t*,
                                        const AttentionShape&, float*, float*);
template void VarlenAttentionRef<double>(const float*, const float*, const float*, const int32_t*, const int32_t*,
                                         const AttentionShape&, float*, float*);
template void PagedAttentionRef<float>(const float*, const float*, const float*, const int32_t*, int, int,
                                       const int32_t*, const int32_t*, const AttentionShape&, float*, float*);
template void PagedAttentionRef<double>(const float*, const float*, const float*, const int32_t*, int, int,
                                        const int32_t*, const int32_t*, const AttentionShape&, float*, float*);

Status CheckShape(const AttentionShape& s) {
  if (s.batch < 0) return InvalidArgument("attention: batch < 0");
  if (s.num_heads_q <= 0 || s.num_heads_kv <= 0) return InvalidArgument("attention: head counts must be > 0");
  if (s.num_heads_q % s.num_heads_kv != 0)
    return InvalidArgument("attention: num_heads_q (" + std::to_string(s.num_heads_q) +
                           ") is not a multiple of num_heads_kv (" + std::to_string(s.num_heads_kv) + ")");
  if (s.head_dim <= 0) return InvalidArgument("attention: head_dim must be > 0");
  if (!std::isfinite(s.softmax_scale) || s.softmax_scale <= 0.0f)
    return InvalidArgument("attention: softmax_scale must be finite and > 0");
  return Status::Ok();
}

Status CheckPaged(const int32_t* block_table, int max_blocks_per_seq, int page_size, int num_blocks,
                  const int32_t* seqlens_k, const int32_t* cu_seqlens_q, int batch) {
  if (page_size <= 0 || max_blocks_per_seq < 0 || num_blocks < 0)
    return InvalidArgument("attention: bad paged-cache geometry");
  for (int b = 0; b < batch; ++b) {
    const int lk = seqlens_k[b];
    const int lq = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    if (lk < 0 || int64_t(lk) > int64_t(max_blocks_per_seq) * page_size)
      return InvalidArgument("attention: seqlens_k[" + std::to_string(b) + "] does not fit the block table");
    if (lq < 0 || lq > lk) return InvalidArgument("attention: more new tokens than cached tokens");
    const int used = (lk + page_size - 1) / page_size;
    for (int i = 0; i < used; ++i) {
      const int32_t blk = block_table[int64_t(b) * max_blocks_per_seq + i];
      if (blk < 0 || blk >= num_blocks) return InvalidArgument("attention: block id out of range");
    }
  }
  return Status::Ok();
}

}  // namespace flashq::attention
