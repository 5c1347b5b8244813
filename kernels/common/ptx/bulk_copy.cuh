// Bulk copies (sm_90): cp.async.bulk and TMA tensor loads into shared memory, completing on an mbarrier, and the
// proxy fences that order generic-proxy accesses with them. Callers use them only in code compiled for sm_90.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashq::ptx {

// `bytes` (a multiple of 16) from global to shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void BulkCopy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// A 2D tensor-map box at (c0, c1) into shared memory, completing on mbarrier `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (st.shared, cp.async) before async-proxy reads (wgmma, TMA).
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders this thread's generic-proxy global accesses with the async proxy's (TMA reads of data this grid wrote).
__device__ __forceinline__ void FenceProxyAsyncGlobal() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

}  // namespace flashq::ptx
