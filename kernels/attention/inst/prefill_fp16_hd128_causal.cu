// Instantiation: varlen prefill, fp16, head dim 128, causal.
#include "kernels/attention/prefill_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefill<__half, 128, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
