// Instantiation: varlen prefill for sm_90a (wgmma), bf16, head dim 64, non-causal.
#include "kernels/attention/prefill_wgmma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWgmma<__nv_bfloat16, 64, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
