#include "server/backends/cuda/cuda_backend.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/backends/cuda/device_context.h"
#include "server/backends/cuda/executors.h"

namespace flashq::server {
namespace {

// Shared-memory regions on the GPUs: system regions page-locked for DMA, CUDA regions
// opened from their IPC handles.
class CudaDeviceMemory : public DeviceMemoryAccess {
 public:
  explicit CudaDeviceMemory(int devices) : devices_(devices) {}

  std::shared_ptr<void> PinHost(void* data, size_t size) override {
    if (cudaHostRegister(data, size, cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();  // not sticky; the region is used as ordinary host memory
      return nullptr;
    }
    return std::shared_ptr<void>(data, [](void* p) { cudaHostUnregister(p); });
  }

  absl::StatusOr<OpenedIpc> OpenIpc(const std::string& raw_handle, int device, uint64_t byte_size) override {
    cudaIpcMemHandle_t handle;
    if (raw_handle.size() != sizeof(handle)) {
      return absl::InvalidArgumentError(absl::StrCat("raw_handle is ", raw_handle.size(),
                                                     " bytes; a CUDA IPC memory handle is ", sizeof(handle)));
    }
    if (device >= devices_) {
      return absl::NotFoundError(absl::StrCat("device_id ", device, " is not a GPU of this server (it uses ", devices_,
                                              devices_ == 1 ? " GPU: 0)" : absl::StrCat(" GPUs: 0-", devices_ - 1, ")")));
    }
    std::memcpy(&handle, raw_handle.data(), sizeof(handle));
    FQ_CUDA_OK(cudaSetDevice(device));
    void* ptr = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat("cannot open the CUDA IPC handle on GPU ", device, ": ",
                                                     cudaGetErrorString(e)));
    }
    std::shared_ptr<void> opened(ptr, [device](void* p) {
      cudaSetDevice(device);
      cudaIpcCloseMemHandle(p);
    });
    // The handle maps the client's whole allocation; the region must lie inside it.
    // (The driver API through the runtime's entry point: the server does not link libcuda,
    // so that a CUDA build still starts on a host without a driver.)
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn)(&base, &size, CUdeviceptr(ptr)) != CUDA_SUCCESS) {
      return absl::InvalidArgumentError("cannot read the size of the allocation behind the CUDA IPC handle");
    }
    const uint64_t available = uint64_t(base + size - CUdeviceptr(ptr));
    if (byte_size > available) {
      return absl::InvalidArgumentError(absl::StrCat("byte_size ", byte_size, " is past the end of the allocation behind "
                                                     "the CUDA IPC handle (", available, " bytes from its start)"));
    }
    return OpenedIpc{static_cast<char*>(ptr), std::move(opened)};
  }

  absl::Status Copy(void* dst, const void* src, size_t n) override {
    FQ_CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
    return absl::OkStatus();
  }

 private:
  const int devices_;
};

// ---- the backend --------------------------------------------------------------
class CudaBackend : public Backend {
 public:
  CudaBackend(const BackendOptions& o, ServerMetrics& m, Contexts ctx)
      : options_(o), metrics_(m), ctx_(std::move(ctx)), device_memory_(int(ctx_.size())) {
    for (auto& d : ctx_) {
      mem_gauges_.push_back(&m.BackendGauge("flashq_gpu_memory_used_bytes", "Device memory in use per GPU",
                                            {{"gpu", std::to_string(d->device())}}));
      arena_gauges_.push_back(&m.BackendGauge("flashq_gpu_arena_used_bytes", "Bytes carved from the start-up arena",
                                              {{"gpu", std::to_string(d->device())}}));
    }
    UpdateGauges();
    poller_ = std::thread([this] {
      while (!stop_) {
        for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        UpdateGauges();
      }
    });
  }
  ~CudaBackend() override {
    stop_ = true;
    poller_.join();
  }

  std::string name() const override {
    return absl::StrCat("cuda (", ctx_.size(), " GPU", ctx_.size() > 1 ? "s" : "", ": ", ctx_[0]->name(), ")");
  }

  int devices() const override { return int(ctx_.size()); }

  absl::StatusOr<std::unique_ptr<AttentionExecutor>> CreateAttention() override {
    return CreateCudaAttention(ctx_, metrics_);
  }
  absl::StatusOr<std::unique_ptr<KvAttentionExecutor>> CreateKvAttention(const KvGeometry& g) override {
    return CreateCudaKvAttention(ctx_, metrics_, g);
  }
  absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights weights) override {
    return CreateCudaLinear(ctx_, metrics_, std::move(weights), options_.batch_invariant);
  }
  DeviceMemoryAccess* device_memory() override { return &device_memory_; }

 private:
  void UpdateGauges() {
    for (size_t i = 0; i < ctx_.size(); ++i) {
      size_t free_b = 0, total_b = 0;
      cudaSetDevice(ctx_[i]->device());
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) mem_gauges_[i]->Set(double(total_b - free_b));
      arena_gauges_[i]->Set(double(ctx_[i]->arena().used()));
    }
  }

  const BackendOptions options_;
  ServerMetrics& metrics_;
  Contexts ctx_;
  CudaDeviceMemory device_memory_;
  std::vector<prometheus::Gauge*> mem_gauges_, arena_gauges_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options, ServerMetrics& metrics) {
  const int n = CudaDeviceCount();
  if (n == 0) return absl::FailedPreconditionError("--backend=cuda: no CUDA device is visible");
  Contexts ctx;
  for (int i = 0; i < n; ++i) {
    auto d = DeviceContext::Create(i, std::max(1, options.streams_per_device), size_t(options.staging_bytes),
                                   size_t(options.arena_bytes));
    if (!d.ok()) return absl::Status(d.status().code(), absl::StrCat("GPU ", i, ": ", d.status().message()));
    ctx.push_back(std::move(*d));
  }
  return std::unique_ptr<Backend>(new CudaBackend(options, metrics, std::move(ctx)));
}

}  // namespace flashq::server
