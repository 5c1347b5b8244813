// Instantiation: paged split-KV decode (+ combine), bf16, head dim 256 (causal is a runtime flag).
#include "kernels/attention/paged_decode_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPagedDecode<__nv_bfloat16, 256>(const PagedDecodeParams&, int, cudaStream_t);
}  // namespace flashq::attention::detail
