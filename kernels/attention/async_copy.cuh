// Asynchronous copies beyond cp.async: mbarrier handshakes and TMA (cp.async.bulk.tensor) loads,
// plus the host-side tensor-map encoder. The mbarrier and TMA instructions need sm_90; callers use
// them only in code compiled for sm_90 (the headers themselves build for every architecture).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/common/tensor_map.h"

namespace flashq::attention::detail {

__device__ __forceinline__ void MbarInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ bool MbarTryWait(uint32_t addr, int parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(addr), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void MbarWait(uint32_t addr, int parity) {
  // No trap after N polls: a __trap() reachable from the consumers keeps ptxas from giving
  // them the registers setmaxnreg grants (wgmma_consumer.cuh).
  while (!MbarTryWait(addr, parity)) {
  }
}
__device__ __forceinline__ void MbarArrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t addr, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
}
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Host: a 3D tensor map (D, heads, rows) over a [rows, heads, D] 16-bit tensor with the given
// element strides; boxes of 64 columns x 1 head x box_rows rows, 128-byte swizzle (the PanelOff
// layout). The row extent is set to 2^31 - 1: the kernels only issue boxes that lie inside their
// data (tails use cp.async). Unimplemented when the driver rejects the layout: the caller falls back.
inline Status EncodeRowsMap(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t row_stride,
                            int64_t head_stride, int box_rows) {
  const TensorMapEncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return Unimplemented("cuTensorMapEncodeTiled not available");
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(0x7fffffff)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(row_stride) * 2};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return Unimplemented("cuTensorMapEncodeTiled rejected the layout: " + std::to_string(int(r)));
  return Status::Ok();
}

}  // namespace flashq::attention::detail
