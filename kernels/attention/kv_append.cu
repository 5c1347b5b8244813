// KV-cache append: copies new K/V rows [total_new, Hkv, D] into the paged cache
// [num_blocks, page_size, Hkv, D] through the block table. One CTA per (new token, sequence);
// 16-byte loads and stores, dtype-agnostic (2-byte elements). Token i of sequence b lands at
// position seqlens_k[b] - n_b + i. Memory-bound copy; not benchmarked on its own (tested in
// tests/kernels/attention: the cache after append is compared byte for byte).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/common/cuda_check.h"

namespace flashq::attention {
namespace {

__global__ void __launch_bounds__(128) KvAppendKernel(const KvAppendParams p) {
  const int b = blockIdx.y, i = blockIdx.x;
  const int n0 = p.cu_seqlens_new[b], n = p.cu_seqlens_new[b + 1] - n0;
  if (i >= n) return;
  const int pos = p.seqlens_k[b] - n + i;
  const int64_t dst_row =
      int64_t(p.block_table[int64_t(b) * p.max_blocks_per_seq + pos / p.page_size]) * p.kv_block_stride +
      int64_t(pos % p.page_size) * p.kv_row_stride;
  const int64_t src_row = int64_t(n0 + i) * p.new_row_stride;
  const int chunks = p.head_dim / 8;  // 16-byte chunks per head
  for (int c = threadIdx.x; c < p.num_heads_kv * chunks; c += blockDim.x) {
    const int h = c / chunks, off = (c % chunks) * 8;
    const int64_t s = src_row + int64_t(h) * p.new_head_stride + off;
    const int64_t d = dst_row + int64_t(h) * p.kv_head_stride + off;
    const uint4 kv = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k_new) + s);
    const uint4 vv = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.v_new) + s);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.k_cache) + d) = kv;
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.v_cache) + d) = vv;
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status RunKvAppend(const KvAppendParams& p, cudaStream_t stream) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return InvalidArgument("RunKvAppend: dtype must be FP16 or BF16");
  if (p.head_dim <= 0 || p.head_dim % 8 != 0 || p.num_heads_kv <= 0 || p.batch < 0 || p.page_size <= 0 ||
      p.max_new < 0)
    return InvalidArgument("RunKvAppend: bad shape");
  if (p.batch == 0 || p.max_new == 0) return Status::Ok();
  if (!p.k_new || !p.v_new || !p.k_cache || !p.v_cache || !p.block_table || !p.seqlens_k || !p.cu_seqlens_new)
    return InvalidArgument("RunKvAppend: null pointer");
  if (!Aligned16(p.k_new) || !Aligned16(p.v_new) || !Aligned16(p.k_cache) || !Aligned16(p.v_cache) ||
      p.new_row_stride % 8 || p.new_head_stride % 8 || p.kv_block_stride % 8 || p.kv_row_stride % 8 ||
      p.kv_head_stride % 8)
    return InvalidArgument("RunKvAppend: tensors must be 16-byte aligned with strides multiple of 8");
  if (p.batch > 65535) return InvalidArgument("RunKvAppend: batch > 65535");
  KvAppendKernel<<<dim3(p.max_new, p.batch), 128, 0, stream>>>(p);
  FQ_CUDA_RETURN_LAUNCH();
  return Status::Ok();
}

}  // namespace flashq::attention
