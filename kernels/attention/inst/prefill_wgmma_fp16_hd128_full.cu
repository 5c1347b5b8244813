// Instantiation: varlen prefill for sm_90a (wgmma), fp16, head dim 128, non-causal.
#include "kernels/attention/prefill_wgmma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWgmma<__half, 128, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
