// One GPU as the CUDA backend sees it: a device-memory arena allocated once at
// start-up, and a pool of streams, each with pinned host staging and a device
// staging buffer carved from the arena. A batch takes a stream for its whole
// H2D -> kernels -> D2H sequence; with several streams consecutive batches overlap
// their copies and kernels. Nothing here calls cudaMalloc after start-up.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gemm/gemm.h"
#include "server/backends/arena_allocator.h"

namespace flashq::server {

absl::Status CudaError(cudaError_t e, const char* what);
absl::Status FromKernel(const Status& s);
#define FQ_CUDA_OK(call)                                                       \
  do {                                                                         \
    if (absl::Status s_ = ::flashq::server::CudaError((call), #call); !s_.ok()) \
      return s_;                                                               \
  } while (0)

// One cudaMalloc, carved by an ArenaAllocator. Allocation happens only while models
// load; a model's executors Free what they took when the model is destroyed (unload),
// so that later loads reuse it.
class DeviceArena {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceArena>> Create(int device, size_t bytes);
  ~DeviceArena();
  absl::StatusOr<char*> Allocate(size_t bytes, const std::string& what);  // 256-byte aligned
  // Returns an allocation; null is ignored. Nothing may still use it on the device.
  void Free(const void* p);
  size_t used() const { return alloc_ ? alloc_->used() : 0; }
  size_t capacity() const { return bytes_; }

 private:
  DeviceArena() = default;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  std::unique_ptr<ArenaAllocator> alloc_;
};

struct StreamSlot {
  int index = 0;
  cudaStream_t stream = nullptr;
  char* host = nullptr;     // pinned staging
  char* device = nullptr;   // device staging (from the arena)
  size_t bytes = 0;
  cudaEvent_t start = nullptr, stop = nullptr;  // kernel timing
};

class DeviceContext {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceContext>> Create(int device, int streams, size_t staging_bytes,
                                                               size_t arena_bytes);
  ~DeviceContext();

  int device() const { return device_; }
  const std::string& name() const { return name_; }
  DeviceArena& arena() { return *arena_; }
  gemm::BlasLt* blas() { return blas_.get(); }
  int num_slots() const { return int(slots_.size()); }
  size_t staging_bytes() const { return staging_bytes_; }

  // Blocks until a stream is free. Release returns it.
  StreamSlot* Acquire();
  void Release(StreamSlot* slot);

 private:
  DeviceContext() = default;
  int device_ = 0;
  std::string name_;
  size_t staging_bytes_ = 0;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<gemm::BlasLt> blas_;
  std::vector<StreamSlot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;
};

// RAII lease of a stream slot; also makes the slot's device current on this thread.
class SlotLease {
 public:
  explicit SlotLease(DeviceContext& d) : d_(d), slot_(d.Acquire()) { cudaSetDevice(d.device()); }
  ~SlotLease() { d_.Release(slot_); }
  StreamSlot& operator*() const { return *slot_; }
  StreamSlot* operator->() const { return slot_; }

 private:
  DeviceContext& d_;
  StreamSlot* slot_;
};

// Carves 256-byte aligned pieces out of a staging buffer.
class Carver {
 public:
  Carver(char* base, size_t bytes) : base_(base), bytes_(bytes) {}
  // Returns null when it does not fit.
  char* Take(size_t n) {
    size_t off = (used_ + 255) & ~size_t(255);
    if (off + n > bytes_) return nullptr;
    used_ = off + n;
    return base_ + off;
  }
  size_t used() const { return used_; }
  // Bytes that pieces of these sizes take, carved in this order.
  static size_t Need(const std::vector<size_t>& sizes) {
    size_t t = 0;
    for (size_t s : sizes) t = ((t + 255) & ~size_t(255)) + s;
    return t;
  }

 private:
  char* base_;
  size_t bytes_, used_ = 0;
};

}  // namespace flashq::server
