// Instantiation: varlen prefill for sm_90a (wgmma), bf16, head dim 128, non-causal.
#include "kernels/attention/prefill_wgmma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWgmma<__nv_bfloat16, 128, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
