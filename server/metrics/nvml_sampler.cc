// GpuSampler over NVML. The library is the driver's libnvidia-ml.so.1, opened with dlopen: a
// link-time dependency would stop the server from starting on a host without a driver (CI, the
// CPU backend on a laptop). The few entry points used are declared here with the types of NVML's
// stable C ABI (nvml.h, the _v2 functions), so the build needs no NVML development package.
// Built with NVML support only with CUDA (FLASHQ_NVML); otherwise CreateNvmlSampler says so.
#include "server/metrics/gpu_metrics.h"

#include "absl/strings/str_cat.h"

#ifdef FLASHQ_NVML
#include <dlfcn.h>

#include <vector>
#endif

namespace flashq::server {

#ifdef FLASHQ_NVML
namespace {

using NvmlReturn = int;  // nvmlReturn_t; NVML_SUCCESS is 0
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu, memory;
};
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};
constexpr unsigned kUuidBytes = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

struct NvmlApi {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*count)(unsigned*);
  NvmlReturn (*handle)(unsigned, NvmlDevice*);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*power)(NvmlDevice, unsigned*);
  NvmlReturn (*power_limit)(NvmlDevice, unsigned*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
};

class NvmlSampler final : public GpuSampler {
 public:
  NvmlSampler(void* lib, NvmlApi api, std::vector<std::pair<NvmlDevice, std::string>> devices)
      : lib_(lib), api_(api), devices_(std::move(devices)) {}
  ~NvmlSampler() override {
    api_.shutdown();
    dlclose(lib_);
  }
  std::vector<GpuSample> Sample() override {
    std::vector<GpuSample> out;
    for (const auto& [dev, uuid] : devices_) {
      NvmlUtilization u{};
      NvmlMemory m{};
      unsigned mw = 0, limit_mw = 0;
      if (api_.utilization(dev, &u) != 0 || api_.memory(dev, &m) != 0 || api_.power(dev, &mw) != 0) continue;
      if (api_.power_limit(dev, &limit_mw) != 0) limit_mw = 0;
      GpuSample s;
      s.uuid = uuid;
      s.utilization = u.gpu / 100.0;
      s.power_watts = mw / 1000.0;
      s.power_limit_watts = limit_mw / 1000.0;
      s.memory_used_bytes = double(m.used);
      s.memory_total_bytes = double(m.total);
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  void* lib_;
  NvmlApi api_;
  std::vector<std::pair<NvmlDevice, std::string>> devices_;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuSampler>> CreateNvmlSampler() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return absl::UnavailableError(absl::StrCat("NVML: cannot open libnvidia-ml.so.1 (", dlerror(), ")"));
  NvmlApi a{};
  const bool ok = Resolve(lib, "nvmlInit_v2", &a.init) && Resolve(lib, "nvmlShutdown", &a.shutdown) &&
                  Resolve(lib, "nvmlErrorString", &a.error_string) &&
                  Resolve(lib, "nvmlDeviceGetCount_v2", &a.count) &&
                  Resolve(lib, "nvmlDeviceGetHandleByIndex_v2", &a.handle) &&
                  Resolve(lib, "nvmlDeviceGetUUID", &a.uuid) &&
                  Resolve(lib, "nvmlDeviceGetUtilizationRates", &a.utilization) &&
                  Resolve(lib, "nvmlDeviceGetPowerUsage", &a.power) &&
                  Resolve(lib, "nvmlDeviceGetEnforcedPowerLimit", &a.power_limit) &&
                  Resolve(lib, "nvmlDeviceGetMemoryInfo", &a.memory);
  if (!ok) {
    dlclose(lib);
    return absl::UnavailableError("NVML: libnvidia-ml.so.1 lacks an entry point (driver too old?)");
  }
  if (NvmlReturn r = a.init(); r != 0) {
    std::string why = a.error_string(r);
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat("NVML: nvmlInit_v2: ", why));
  }
  unsigned n = 0;
  std::vector<std::pair<NvmlDevice, std::string>> devices;
  if (NvmlReturn r = a.count(&n); r != 0) n = 0;
  for (unsigned i = 0; i < n; ++i) {
    NvmlDevice d = nullptr;
    char uuid[kUuidBytes] = {};
    if (a.handle(i, &d) == 0 && a.uuid(d, uuid, kUuidBytes) == 0) devices.emplace_back(d, uuid);
  }
  if (devices.empty()) {
    a.shutdown();
    dlclose(lib);
    return absl::NotFoundError("NVML: no GPU visible");
  }
  return std::unique_ptr<GpuSampler>(new NvmlSampler(lib, a, std::move(devices)));
}

#else

absl::StatusOr<std::unique_ptr<GpuSampler>> CreateNvmlSampler() {
  return absl::UnimplementedError("this build has no CUDA, so no NVML GPU metrics");
}

#endif

}  // namespace flashq::server
