// Instantiation: TMA warp-specialised wgmma prefill (sm_90a), fp16, head dim 128, causal.
#include "kernels/attention/prefill_wgmma_tma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillTma<__half, 128, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
