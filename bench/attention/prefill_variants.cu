// Bench-only prefill variants (not shipped). The mma.sync first version's tiling (one 16-row m-tile per
// warp: hd128 BM 64 / BN 64, hd64 BM 128 / BN 64) against the shipped two m-tiles per warp.
#include "bench/attention/prefill_wgmma_plain.cuh"
#include "kernels/attention/prefill_kernel.cuh"
#include "kernels/attention/prefill_wgmma_tma.cuh"

namespace flashq::attention::detail {
template Status LaunchPrefillImpl<__nv_bfloat16, 128, false, 64, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 128, true, 64, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 64, false, 128, 1>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillImpl<__nv_bfloat16, 64, true, 128, 1>(const VarlenAttentionParams&, cudaStream_t);
// The plain wgmma kernel (256 threads load, then compute; no warp specialisation).
template Status LaunchPrefillWgmma<__nv_bfloat16, 128, false>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWgmma<__nv_bfloat16, 128, true>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWgmma<__nv_bfloat16, 64, false>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWgmma<__nv_bfloat16, 64, true>(const VarlenAttentionParams&, cudaStream_t);
// Warp-specialised wgmma without the consumer ping-pong.
template Status LaunchPrefillWsImpl<__nv_bfloat16, 128, false, false>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWsImpl<__nv_bfloat16, 128, true, false>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWsImpl<__nv_bfloat16, 64, false, false>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillWsImpl<__nv_bfloat16, 64, true, false>(const VarlenAttentionParams&, cudaStream_t);
// TMA kernel that also loads tail tiles by TMA when the box stays inside the buffer.
template Status LaunchPrefillTmaImpl<__nv_bfloat16, 128, false, true>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillTmaImpl<__nv_bfloat16, 128, true, true>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillTmaImpl<__nv_bfloat16, 64, false, true>(const VarlenAttentionParams&, cudaStream_t);
template Status LaunchPrefillTmaImpl<__nv_bfloat16, 64, true, true>(const VarlenAttentionParams&, cudaStream_t);
}  // namespace flashq::attention::detail
