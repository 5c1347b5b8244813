// Instantiation of qlinear_kernel.cuh (see there for algorithm, layouts, limits, speed):
// W4A16Bf16, 16-bit type __nv_bfloat16, scale applied per k32 step (groups of 32 or 64, channelwise with K/32 not a multiple of 4).
#include "kernels/gemm/qlinear_kernel.cuh"

namespace flashq::gemm::detail {
cudaError_t LaunchW4A16Bf16Step(const QLinearParams& p, cudaStream_t s) { return LaunchQLinear<__nv_bfloat16, false, false>(p, s); }
}  // namespace flashq::gemm::detail
