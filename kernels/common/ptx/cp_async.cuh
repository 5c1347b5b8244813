// cp.async (sm_80+): 16-byte global -> shared copies, their groups, and the mbarrier arrive that tracks them.
// Every wrapper clobbers "memory": the copies write shared memory behind the compiler's back.
#pragma once

#include <cstdint>

namespace flashq::ptx {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !pred the destination is zero-filled and src is not read.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool pred) {
  const int src_size = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}
// cp.async of 16 bytes; when `copy` is false no instruction is issued (predicated, no branch).
__device__ __forceinline__ void CpAsync16If(uint32_t smem, const void* gmem, bool copy) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(smem),
      "l"(gmem), "r"(int(copy))
      : "memory");
}
// Predicated cp.async of 16 bytes that zero-fills the destination when `fill_only` (reads nothing).
__device__ __forceinline__ void CpAsync16IfZfill(uint32_t smem, const void* gmem, bool copy, bool fill_only) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16, %3;\n}\n" ::"r"(smem),
      "l"(gmem), "r"(int(copy)), "r"(fill_only ? 0 : 16)
      : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}

}  // namespace flashq::ptx
