// Instantiation: varlen prefill for sm_90a (wgmma), bf16, head dim 64, causal.
#include "kernels/attention/prefill_wgmma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWgmma<__nv_bfloat16, 64, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
