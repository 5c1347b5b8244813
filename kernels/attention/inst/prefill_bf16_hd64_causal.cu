// Instantiation: varlen prefill, bf16, head dim 64, causal.
#include "kernels/attention/prefill_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefill<__nv_bfloat16, 64, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
