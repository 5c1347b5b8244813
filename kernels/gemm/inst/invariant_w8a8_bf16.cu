// Instantiation of LaunchInvariantGemm (invariant_gemm_launch.cuh; the kernel's header gives algorithm, layouts,
// limits): E4M3 weights and activations, __nv_bfloat16 output.
#include "kernels/gemm/invariant_gemm_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInvariantW8A8Bf16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s) {
  return LaunchInvariantGemm<uint8_t, __nv_bfloat16>(a, t, s);
}
}  // namespace flashq::gemm::detail
