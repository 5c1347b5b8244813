// Instantiation: TMA warp-specialised wgmma prefill (sm_90a), bf16, head dim 64, causal.
#include "kernels/attention/prefill_wgmma_tma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillTma<__nv_bfloat16, 64, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
