// Instantiation: varlen prefill, fp16, head dim 64, non-causal.
#include "kernels/attention/prefill_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefill<__half, 64, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
