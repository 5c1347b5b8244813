// RunPagedDecode and its workspace query: host-side checks (no device reads), then dispatch to
// the precompiled (dtype, head dim) instantiation. See paged_decode_kernel.cuh for the kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/launch_decls.h"

namespace flashq::attention {
namespace {

int SplitTokens(int requested) { return requested > 0 ? requested : kDefaultSplitTokens; }
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool Mult8(int64_t s) { return s % 8 == 0; }

template <typename T>
Status Dispatch(const PagedDecodeParams& p, int split, cudaStream_t s) {
  switch (p.head_dim) {
    case 64: return detail::LaunchPagedDecode<T, 64>(p, split, s);
    case 128: return detail::LaunchPagedDecode<T, 128>(p, split, s);
    case 256: return detail::LaunchPagedDecode<T, 256>(p, split, s);
  }
  return InvalidArgument("RunPagedDecode: unsupported head_dim");
}

}  // namespace

size_t PagedDecodeWorkspaceBytes(int total_q, int num_heads_q, int head_dim, int max_seqlen_k, int split_tokens) {
  const int split = SplitTokens(split_tokens);
  const int64_t max_splits = (int64_t(max_seqlen_k) + split - 1) / split;
  if (max_splits <= 1) return 0;
  return size_t(int64_t(total_q) * num_heads_q * max_splits * (int64_t(head_dim) + 1) * 4);
}

Status RunPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return InvalidArgument("RunPagedDecode: dtype must be FP16 or BF16");
  if (!SupportedHeadDim(p.head_dim))
    return InvalidArgument("RunPagedDecode: head_dim " + std::to_string(p.head_dim) + " not in {64,128,256}");
  if (p.batch < 0 || p.num_heads_q <= 0 || p.num_heads_kv <= 0 || p.num_heads_q % p.num_heads_kv != 0)
    return InvalidArgument("RunPagedDecode: bad batch or head counts");
  if (p.page_size <= 0 || p.max_blocks_per_seq < 0 || p.max_seqlen_q < 0 || p.max_seqlen_k < 0 || p.total_q < 0)
    return InvalidArgument("RunPagedDecode: bad cache geometry or bounds");
  if (int64_t(p.max_seqlen_k) > int64_t(p.max_blocks_per_seq) * p.page_size)
    return InvalidArgument("RunPagedDecode: max_seqlen_k exceeds max_blocks_per_seq * page_size");
  const int split = SplitTokens(p.split_tokens);
  if (split % 64 != 0) return InvalidArgument("RunPagedDecode: split_tokens must be a multiple of 64");
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.0f)
    return InvalidArgument("RunPagedDecode: softmax_scale must be finite and > 0");
  if (p.batch == 0 || p.total_q == 0 || p.max_seqlen_q == 0 || p.max_seqlen_k == 0) return Status::Ok();
  if (!p.q || !p.k_cache || !p.v_cache || !p.o || !p.block_table || !p.seqlens_k || !p.cu_seqlens_q)
    return InvalidArgument("RunPagedDecode: null pointer");
  if (!Aligned16(p.q) || !Aligned16(p.k_cache) || !Aligned16(p.v_cache) || !Aligned16(p.o) ||
      !Mult8(p.q_row_stride) || !Mult8(p.q_head_stride) || !Mult8(p.o_row_stride) || !Mult8(p.o_head_stride) ||
      !Mult8(p.kv_block_stride) || !Mult8(p.kv_row_stride) || !Mult8(p.kv_head_stride))
    return InvalidArgument("RunPagedDecode: tensors must be 16-byte aligned with strides multiple of 8");
  const size_t need = PagedDecodeWorkspaceBytes(p.total_q, p.num_heads_q, p.head_dim, p.max_seqlen_k, split);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need || !Aligned16(p.workspace)))
    return InvalidArgument("RunPagedDecode: workspace needs " + std::to_string(need) + " bytes, 16-byte aligned");
  return p.dtype == DType::kBF16 ? Dispatch<__nv_bfloat16>(p, split, stream) : Dispatch<__half>(p, split, stream);
}

}  // namespace flashq::attention
