// Instantiation of LaunchQLinear (qlinear_launch.cuh; the kernels' headers give algorithm, layouts, limits, speed):
// int4 weights, scale applied once per pipeline stage (groups of a multiple of 4 k32 steps), 16-bit type __nv_bfloat16.
#include "kernels/gemm/qlinear_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchInt4Bf16StageFlush(const QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  return LaunchQLinear<__nv_bfloat16, false, true>(p, t, s);
}
}  // namespace flashq::gemm::detail
