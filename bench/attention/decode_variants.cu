// Bench-only decode variants: the one-CTA-per-item kernel with cp.async loads only (what
// the shipped kernel does off sm_90), and the persistent warp-specialised kernel of
// decode_stream_variant.cuh with four producer warps and 5 or 6 stages.
#include "bench/attention/decode_stream_variant.cuh"

namespace flashq::attention::detail {
template Status LaunchPagedDecodeSplit<__nv_bfloat16, 128>(const PagedDecodeParams&, int, cudaStream_t, bool, bool);
template Status LaunchPagedDecodeStream<__nv_bfloat16, 128, 4, 5>(const PagedDecodeParams&, int, cudaStream_t);
template Status LaunchPagedDecodeStream<__nv_bfloat16, 128, 4, 6>(const PagedDecodeParams&, int, cudaStream_t);
}  // namespace flashq::attention::detail
