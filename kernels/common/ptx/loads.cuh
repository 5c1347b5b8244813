// 16-byte loads with explicit cache behaviour: ld.global.nc with and without L1 allocation, and ld.shared by address.
#pragma once

#include <cstdint>

namespace flashq::ptx {

// Streaming 16-byte load of read-only data that is used once (no L1 allocation).
__device__ __forceinline__ uint4 LdStream(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}
// Read-only 16-byte load that may stay in L1 (data that every block reads).
__device__ __forceinline__ uint4 LdCached16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint4 LdShared16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

}  // namespace flashq::ptx
