// Grid-level ordering: programmatic dependent launch, global atomics with acquire / release semantics, named
// barriers, register allocation hand-over between warp groups, and the global timer.
#pragma once

#include <cstdint>

namespace flashq::ptx {

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic-serialization attribute may start
// while the previous kernel in the stream finishes; it must wait before it reads what that kernel wrote or writes
// what it may still read. Elsewhere: no-ops.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// atomicAdd with acquire-release semantics at GPU scope: returns the old value.
__device__ __forceinline__ int AtomicAddAcqRel(int* ptr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(ptr), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void RedAddRelease(int* ptr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}
__device__ __forceinline__ int LdAcquireGpu(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Named barriers: `count` threads (a multiple of 32) meet at barrier `id`; arrive does not wait.
__device__ __forceinline__ void NamedBarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// setmaxnreg (sm_90a): a warp group gives up registers (producers) or takes them (consumers).
template <int kRegs>
__device__ __forceinline__ void SetMaxNRegDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNRegInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace flashq::ptx
