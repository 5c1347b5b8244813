// Bench-only prefill variants (not shipped): hd128 with a 128-row query tile (8 warps) against the
// shipped 64-row tile, to choose the default from measurements.
#include "kernels/attention/prefill_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillImpl<__nv_bfloat16, 128, false, 128>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 128, true, 128>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
