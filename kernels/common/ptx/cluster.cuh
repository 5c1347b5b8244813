// Thread-block clusters (sm_90): cluster barriers, distributed shared memory addresses, loads and st.async stores.
// Only code compiled for sm_90 calls these; elsewhere their bodies are empty.
#pragma once

#include <cstdint>

namespace flashq::ptx {

__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// Cluster barrier halves: arrive publishes nothing (an mbarrier init is published by fence.mbarrier_init before it),
// wait acquires; a thread waits before it arrives again or reads what the other blocks initialized.
__device__ __forceinline__ void ClusterArriveRelaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ClusterWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}
// A cluster barrier that publishes nothing (no memory fence; release / acquire cost a GPU-scope fence and an
// L1 invalidate): before a block exits, so that none leaves while another still reads its shared memory.
// Those reads have completed, since their values were used.
__device__ __forceinline__ void ClusterSyncExit() {
  ClusterArriveRelaxed();
  ClusterWait();
}
// Shared address `addr` of this block as seen in cluster block `rank`.
__device__ __forceinline__ uint32_t MapaShared(uint32_t addr, int rank) {
  uint32_t remote = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
#endif
  return remote;
}
// 4 bytes into the shared memory of another cluster block (remote address), completing on its mbarrier `rbar`.
__device__ __forceinline__ void StAsyncF32(uint32_t remote, float v, uint32_t rbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote),
               "r"(__float_as_uint(v)), "r"(rbar)
               : "memory");
#endif
}
// Reads a float4 at shared address `addr` of cluster block `rank`.
__device__ __forceinline__ float4 LdClusterF4(uint32_t addr, int rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t remote = MapaShared(addr, rank);
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

}  // namespace flashq::ptx
