// Bench-only decode variant: the one-CTA-per-item kernel with cp.async loads only (what the
// shipped kernel does off sm_90), timed on Hopper beside the TMA loads.
#include "kernels/attention/paged_decode_kernel.cuh"

namespace flashq::attention::detail {
template Status LaunchPagedDecodeSplit<__nv_bfloat16, 128>(const PagedDecodeParams&, int, cudaStream_t, bool, bool);
}  // namespace flashq::attention::detail
