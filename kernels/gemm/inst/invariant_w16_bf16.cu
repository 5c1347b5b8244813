// Instantiation of LaunchInvariantGemm (invariant_gemm_launch.cuh; the kernel's header gives algorithm, layouts,
// limits): 16-bit weights and activations of type __nv_bfloat16.
#include "kernels/gemm/invariant_gemm_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInvariantW16Bf16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s) {
  return LaunchInvariantGemm<__nv_bfloat16, __nv_bfloat16>(a, t, s);
}
}  // namespace flashq::gemm::detail
