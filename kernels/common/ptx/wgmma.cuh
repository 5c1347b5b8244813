// wgmma (sm_90a): the generated m64nNk16 wrappers and fences (wgmma_ops.cuh), plus the m64n64k16 form with A from
// registers and B K-major in shared memory (tnsp-b = 0) that the int4 gemm kernel uses.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx/wgmma_ops.cuh"

namespace flashq::ptx {

// Shared-memory matrix descriptor of a K-major operand in 64-column panels of 128-byte rows, 128B swizzle (SBO = 8
// rows of 128 B; LBO unused for this layout, encoded as 16 B).
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// wgmma m64n64k16, A from registers, B K-major from shared memory (tnsp-b = 0), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void WgmmaRsK(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FQ_WGMMA_RS(TY)                                                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                             \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                   \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
               "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),             \
                 "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),             \
                 "+f"(d[30]), "+f"(d[31])                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
  if constexpr (std::is_same_v<T, __half>) FQ_WGMMA_RS("f16");
  else FQ_WGMMA_RS("bf16");
#undef FQ_WGMMA_RS
#endif
}

}  // namespace flashq::ptx
