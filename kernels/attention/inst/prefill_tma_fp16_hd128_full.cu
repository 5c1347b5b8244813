// Instantiation: TMA warp-specialised wgmma prefill (sm_90a), fp16, head dim 128, full.
#include "kernels/attention/prefill_wgmma_tma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillTma<__half, 128, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
