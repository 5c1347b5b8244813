// RunVarlenAttention: host-side checks (no device reads), then dispatch to the precompiled
// instantiation for (dtype, head dim, causal). See prefill_kernel.cuh for the kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/launch_decls.h"
#include "kernels/common/cuda_check.h"

namespace flashq::attention {
namespace {

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool Mult8(int64_t s) { return s % 8 == 0; }

Status CheckVarlen(const VarlenAttentionParams& p) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return InvalidArgument("RunVarlenAttention: dtype must be FP16 or BF16");
  if (!SupportedHeadDim(p.head_dim))
    return InvalidArgument("RunVarlenAttention: head_dim " + std::to_string(p.head_dim) + " not in {64,128,256}");
  if (p.batch < 0 || p.num_heads_q <= 0 || p.num_heads_kv <= 0 || p.num_heads_q % p.num_heads_kv != 0)
    return InvalidArgument("RunVarlenAttention: bad batch or head counts");
  if (p.max_seqlen_q < 0) return InvalidArgument("RunVarlenAttention: max_seqlen_q < 0");
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.0f)
    return InvalidArgument("RunVarlenAttention: softmax_scale must be finite and > 0");
  if (p.batch == 0 || p.max_seqlen_q == 0) return Status::Ok();
  if (!p.q || !p.k || !p.v || !p.o || !p.cu_seqlens_q || !p.cu_seqlens_k)
    return InvalidArgument("RunVarlenAttention: null pointer");
  if (!Aligned16(p.q) || !Aligned16(p.k) || !Aligned16(p.v) || !Aligned16(p.o))
    return InvalidArgument("RunVarlenAttention: tensors must be 16-byte aligned");
  if (!Mult8(p.q_row_stride) || !Mult8(p.q_head_stride) || !Mult8(p.k_row_stride) || !Mult8(p.k_head_stride) ||
      !Mult8(p.v_row_stride) || !Mult8(p.v_head_stride) || !Mult8(p.o_row_stride) || !Mult8(p.o_head_stride))
    return InvalidArgument("RunVarlenAttention: strides must be multiples of 8 elements");
  return Status::Ok();
}

// Hopper (compute capability 9.0) runs the wgmma kernels for head dims 64 and 128; the build
// must then include sm_90a (CMAKE_CUDA_ARCHITECTURES 90a-real), as the project default does.
Status IsHopper(bool* hopper) {
  int dev = 0, major = 0, minor = 0;
  FQ_CUDA_RETURN(cudaGetDevice(&dev));
  FQ_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FQ_CUDA_RETURN(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  *hopper = major == 9 && minor == 0;
  return Status::Ok();
}

template <typename T>
Status DispatchHeadDim(const VarlenAttentionParams& p, cudaStream_t st) {
  using detail::LaunchPrefill;
  using detail::LaunchPrefillTma;
  using detail::LaunchPrefillWs;
  // Hopper: the TMA warp-specialised kernel for head dims 64 and 128 (falls back to the cp.async
  // warp-specialised kernel when the driver rejects the tensor maps, e.g. for unusual strides).
  bool hopper = false;
  FQ_RETURN_IF_ERROR(IsHopper(&hopper));
  if (hopper && (p.head_dim == 64 || p.head_dim == 128)) {
    Status s = p.head_dim == 64 ? (p.causal ? LaunchPrefillTma<T, 64, true>(p, st) : LaunchPrefillTma<T, 64, false>(p, st))
                                : (p.causal ? LaunchPrefillTma<T, 128, true>(p, st) : LaunchPrefillTma<T, 128, false>(p, st));
    if (s.code() != StatusCode::kUnimplemented) return s;
    if (p.head_dim == 64) return p.causal ? LaunchPrefillWs<T, 64, true>(p, st) : LaunchPrefillWs<T, 64, false>(p, st);
    return p.causal ? LaunchPrefillWs<T, 128, true>(p, st) : LaunchPrefillWs<T, 128, false>(p, st);
  }
  switch (p.head_dim) {
    case 64: return p.causal ? LaunchPrefill<T, 64, true>(p, st) : LaunchPrefill<T, 64, false>(p, st);
    case 128: return p.causal ? LaunchPrefill<T, 128, true>(p, st) : LaunchPrefill<T, 128, false>(p, st);
    case 256: return p.causal ? LaunchPrefill<T, 256, true>(p, st) : LaunchPrefill<T, 256, false>(p, st);
  }
  return InvalidArgument("RunVarlenAttention: unsupported head_dim");
}

}  // namespace

Status RunVarlenAttention(const VarlenAttentionParams& p, cudaStream_t stream) {
  FQ_RETURN_IF_ERROR(CheckVarlen(p));
  if (p.batch == 0 || p.max_seqlen_q == 0) return Status::Ok();
  return p.dtype == DType::kBF16 ? DispatchHeadDim<__nv_bfloat16>(p, stream) : DispatchHeadDim<__half>(p, stream);
}

}  // namespace flashq::attention
