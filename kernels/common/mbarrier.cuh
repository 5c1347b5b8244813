// mbarrier handshakes and the bulk copy engine (sm_90): shared by the Hopper attention and linear
// kernels. Only code compiled for sm_90 calls these; the header builds for every architecture.
#pragma once

#include <cstdint>

namespace flashq {

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
  // No trap after N polls: a __trap() reachable from wgmma consumers keeps ptxas from giving
  // them the registers setmaxnreg grants (kernels/attention/wgmma_consumer.cuh).
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
// Makes barrier initialisation visible to the async proxy (bulk copies) and the other threads' waits.
__device__ __forceinline__ void FenceMbarInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma, TMA).
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this CTA's
// shared memory, completing on the mbarrier at `bar` (which must expect the bytes).
__device__ __forceinline__ void BulkCopyG2S(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace flashq
