// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda), for the host code
// that builds TMA tensor maps; null where the driver does not provide it.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace flashq {

using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                            CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline TensorMapEncodeTiledFn TensorMapEncoder() {
  static const TensorMapEncodeTiledFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<TensorMapEncodeTiledFn>(fn);
  }();
  return encode;
}

}  // namespace flashq
