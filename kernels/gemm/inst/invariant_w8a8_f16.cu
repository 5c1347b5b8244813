// Instantiation of LaunchInvariantGemm (invariant_gemm_launch.cuh; the kernel's header gives algorithm, layouts,
// limits): E4M3 weights and activations, __half output.
#include "kernels/gemm/invariant_gemm_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInvariantW8A8F16(const InvariantGemmArgs& a, const GemmTuning& t, cudaStream_t s) {
  return LaunchInvariantGemm<uint8_t, __half>(a, t, s);
}
}  // namespace flashq::gemm::detail
