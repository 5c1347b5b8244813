// Instantiation: paged split-KV decode (+ combine), fp16, head dim 128 (causal is a runtime flag).
#include "kernels/attention/paged_decode_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPagedDecode<__half, 128>(const PagedDecodeParams&, int, cudaStream_t);
}  // namespace flashq::attention::detail
