// mbarriers in shared memory (sm_90): init, arrive (with an expected transaction count), and two waits. Callers use
// them only in code compiled for sm_90 (the header itself builds for every architecture).
#pragma once

#include <cstdint>

namespace flashq::ptx {

__device__ __forceinline__ void MbarInit(uint32_t addr, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// Publishes this thread's mbarrier inits to the other blocks of the cluster (and to the async proxy).
__device__ __forceinline__ void FenceMbarInitCluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
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
// Polls try_wait from C++. No trap after N polls: a __trap() reachable from the attention consumers keeps ptxas from
// giving them the registers setmaxnreg grants (attention/wgmma_consumer.cuh).
__device__ __forceinline__ void MbarWait(uint32_t addr, int parity) {
  while (!MbarTryWait(addr, parity)) {
  }
}
// The same wait as one asm loop around try_wait. The gemm kernels were measured with it: MbarWait's C++ poll loop
// gives them another schedule.
__device__ __forceinline__ void MbarWaitAsmLoop(uint32_t addr, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t addr, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
}

}  // namespace flashq::ptx
