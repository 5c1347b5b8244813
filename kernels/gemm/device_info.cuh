// The launchers' view of the current device (compute capability and SM count, cached per device: they ask on every
// call) and the programmatic-dependent-launch attribute they add where dispatch.h says so.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/gemm/dispatch.h"

namespace flashq::gemm::detail {

constexpr int kMaxDevices = 64;  // per-device host caches of the launchers
// Compute capability major and SM count of the current device (0 if they cannot be read).
inline DeviceInfo CurrentDevice() {
  static std::atomic<uint64_t> cache[kMaxDevices] = {};  // (major + 1) << 32 | sms once known
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return {};
  if (dev < kMaxDevices) {
    if (const uint64_t known = cache[dev].load(std::memory_order_relaxed))
      return {int(known >> 32) - 1, int(known & 0xffffffffu)};
  }
  DeviceInfo d;
  if (cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return {};
  if (dev < kMaxDevices) cache[dev].store(uint64_t(d.major + 1) << 32 | uint32_t(d.sms), std::memory_order_relaxed);
  return d;
}

// Appends the programmatic-serialization attribute to cfg (whose attrs array has room) when PDL is on.
inline void AddPdl(cudaLaunchConfig_t* cfg, const GemmTuning& t, const DeviceInfo& d) {
  if (!UsePdl(t, d)) return;
  cudaLaunchAttribute& a = cfg->attrs[cfg->numAttrs++];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
}

}  // namespace flashq::gemm::detail
