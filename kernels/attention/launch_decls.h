// Declarations of the per-instantiation launchers. Each is defined by one small file in inst/
// (dtype x head dim [x causal]); the dispatchers see only these declarations.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention/attention.h"

namespace flashq::attention::detail {

template <typename T, int D, bool kCausal>
Status LaunchPrefill(const VarlenAttentionParams& p, cudaStream_t stream);

// sm_90a warp-specialised wgmma prefill (producer warpgroup + 2 ping-pong consumers), D in {64, 128}.
template <typename T, int D, bool kCausal>
Status LaunchPrefillWs(const VarlenAttentionParams& p, cudaStream_t stream);

// sm_90a FlashAttention-3-style prefill: TMA producer warp + 2 ping-pong consumers, D in {64, 128}.
// Returns Unimplemented (before launching) if the driver rejects the tensor maps.
template <typename T, int D, bool kCausal>
Status LaunchPrefillTma(const VarlenAttentionParams& p, cudaStream_t stream);

template <typename T, int D>
Status LaunchPagedDecode(const PagedDecodeParams& p, int split_tokens, cudaStream_t stream);

}  // namespace flashq::attention::detail
