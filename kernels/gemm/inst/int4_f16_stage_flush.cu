// Instantiation of LaunchQLinear (qlinear_launch.cuh; the kernels' headers give algorithm, layouts, limits, speed):
// int4 weights, scale applied once per pipeline stage (groups of a multiple of 4 k32 steps), 16-bit type __half.
#include "kernels/gemm/qlinear_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInt4F16StageFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  return LaunchQLinear<__half, false, true>(p, t, s);
}
}  // namespace flashq::gemm::detail
