// Instantiation: varlen prefill for sm_90a (warp-specialised wgmma), bf16, head dim 128, causal.
#include "kernels/attention/prefill_wgmma_ws.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWs<__nv_bfloat16, 128, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
