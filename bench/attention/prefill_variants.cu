// Bench-only prefill variants (not shipped): the first version's tiling (one 16-row m-tile per
// warp: hd128 BM 64 / BN 64, hd64 BM 128 / BN 64) against the shipped two m-tiles per warp.
#include "kernels/attention/prefill_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillImpl<__nv_bfloat16, 128, false, 64, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 128, true, 64, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 64, false, 128, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 64, true, 128, 1>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
