// Instantiation of LaunchQLinear (qlinear_launch.cuh; the kernels' headers give algorithm, layouts, limits, speed):
// FP8 E4M3 weights, 16-bit type __half.
#include "kernels/gemm/qlinear_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchFp8F16(const QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  return LaunchQLinear<__half, true, false>(p, t, s);
}
}  // namespace flashq::gemm::detail
