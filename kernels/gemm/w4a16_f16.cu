// Instantiation of qlinear_kernel.cuh and, for M > 32 on sm_90, qlinear_wgmma.cuh, and for M <= 8
// with 8-split plans on sm_90, qlinear_staged.cuh (see there for algorithm, layouts, limits, speed):
// W4A16F16, 16-bit type __half, groups of a multiple of kSubSteps (4) k32 steps (scale applied per k128
// stage); other group sizes go to w4a16_f16_step.cu.
#include "kernels/gemm/qlinear_staged.cuh"
#include "kernels/gemm/qlinear_wgmma.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchW4A16F16(const QLinearParams& p, cudaStream_t s) {
  if (p.gsteps % kSubSteps != 0) return LaunchW4A16F16Step(p, s);
  return LaunchQLinear<__half, false, true>(p, s);
}
}  // namespace flashq::gemm::detail
