// Instantiation of qlinear_kernel.cuh and, for M <= 8 with 8-split plans on sm_90, of qlinear_staged.cuh (see there
// for algorithm, layouts, limits, speed):
// W8A16Bf16, 16-bit type __nv_bfloat16.
#include "kernels/gemm/qlinear_staged.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchW8A16Bf16(const QLinearParams& p, cudaStream_t s) { return LaunchQLinear<__nv_bfloat16, true, false>(p, s); }
}  // namespace flashq::gemm::detail
