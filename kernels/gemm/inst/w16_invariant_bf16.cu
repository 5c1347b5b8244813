// Instantiation of LaunchW16Invariant (w16_invariant_launch.cuh; the kernel's header gives algorithm, layouts,
// limits): 16-bit weights and activations of type __nv_bfloat16.
#include "kernels/gemm/w16_invariant_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchW16InvariantBf16(const void* w, const void* x, void* y, int M, int N, int K, const GemmTuning& t,
                                   cudaStream_t s) {
  return LaunchW16Invariant<__nv_bfloat16>(w, x, y, M, N, K, t, s);
}
}  // namespace flashq::gemm::detail
