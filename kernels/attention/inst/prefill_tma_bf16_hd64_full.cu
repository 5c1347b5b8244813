// Instantiation: TMA warp-specialised wgmma prefill (sm_90a), bf16, head dim 64, full.
#include "kernels/attention/prefill_wgmma_tma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillTma<__nv_bfloat16, 64, false>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
