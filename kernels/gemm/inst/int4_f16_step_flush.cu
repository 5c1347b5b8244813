// Instantiation of LaunchQLinear (qlinear_launch.cuh; the kernels' headers give algorithm, layouts, limits, speed):
// int4 weights, scale applied per k32 step (groups of 32 or 64, channelwise with K/32 not a multiple of 4), 16-bit type __half.
#include "kernels/gemm/qlinear_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInt4F16StepFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  return LaunchQLinear<__half, false, false>(p, t, s);
}
}  // namespace flashq::gemm::detail
