// Instantiation: varlen prefill for sm_90a (warp-specialised wgmma), fp16, head dim 64, non-causal.
#include "kernels/attention/prefill_wgmma_ws.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillWs<__half, 64, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
