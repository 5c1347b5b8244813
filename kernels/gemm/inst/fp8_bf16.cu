// Instantiation of LaunchQLinear (qlinear_launch.cuh; the kernels' headers give algorithm, layouts, limits, speed):
// FP8 E4M3 weights, 16-bit type __nv_bfloat16.
#include "kernels/gemm/qlinear_launch.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchFp8Bf16(const QLinearParams& p, const GemmTuning& t, cudaStream_t s) {
  return LaunchQLinear<__nv_bfloat16, true, false>(p, t, s);
}
}  // namespace flashq::gemm::detail
