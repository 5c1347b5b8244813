// Triton's system shared-memory extension: clients register byte ranges of POSIX
// shared-memory objects as named regions; tensors that name a region are read from it
// in place and outputs are written into it, instead of travelling in the gRPC message.
//
// - Register maps only what the client declared, [offset, offset + byte_size) of the
//   object, starting at the page that holds `offset` (mmap starts on a page), and only
//   after fstat shows that the object holds that range.
// - Find hands out a SharedMemoryBuffer that holds a reference to the mapping. A region
//   unregistered while requests use it leaves the registry at once (later requests get
//   NOT_FOUND and its name is free again) and is unmapped when the last of those requests
//   lets go: memory that a request reads or writes is never unmapped under it.
// - The object's size is checked again at each Find, so a client that shrank its object
//   gets an error instead of the server faulting (SIGBUS) past the object's end. A shrink
//   while a request runs is not caught: the client owns the object.
// Triton's CUDA shared-memory extension shares this registry (one namespace of names, as
// in Triton): a client registers a CUDA IPC handle of its device memory, which the backend
// opens (DeviceMemoryAccess), and tensors in such a region go between it and the kernels
// with no host copy. System regions are page-locked by the backend when it can, so that
// they too move by DMA.
// The registry is passed in, never global; every method is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/tensor.h"

namespace flashq::server {

class SharedMemoryMapping;  // one registered region: an mmap of an object, or an opened IPC handle

// Bytes of a registered region, mapped for as long as this (or a copy) lives.
struct SharedMemoryBuffer {
  std::shared_ptr<const SharedMemoryMapping> mapping;
  char* data = nullptr;
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;

  // Host bytes in and out of the buffer at `offset`, whatever memory it is (device memory
  // through the backend). The caller keeps offset + n within size.
  absl::Status Write(size_t offset, const void* src, size_t n) const;
  absl::Status Read(size_t offset, void* dst, size_t n) const;
};

struct SharedMemoryRegionStatus {
  std::string name, key;  // key: system regions only
  uint64_t offset = 0, byte_size = 0;
  int device = -1;        // CUDA regions only
};

// What a backend with GPUs does for shared-memory regions. Implemented by the CUDA backend.
class DeviceMemoryAccess {
 public:
  virtual ~DeviceMemoryAccess() = default;
  // Page-locks host memory [data, data + size) for DMA; the returned handle unlocks it when
  // destroyed. Null when it cannot: the region is then used as ordinary host memory.
  virtual std::shared_ptr<void> PinHost(void* data, size_t size) = 0;
  // Opens `raw_handle` (the bytes of a cudaIpcMemHandle_t) on GPU `device` and checks that
  // the allocation holds `byte_size` bytes from the handle's address. The handle closes it.
  // INVALID_ARGUMENT (naming the cause) for a handle that cannot be opened or is too small,
  // NOT_FOUND for a device this server does not use.
  struct OpenedIpc {
    char* data = nullptr;
    std::shared_ptr<void> handle;
  };
  virtual absl::StatusOr<OpenedIpc> OpenIpc(const std::string& raw_handle, int device, uint64_t byte_size) = 0;
  // A synchronous copy between host memory and device memory (either way).
  virtual absl::Status Copy(void* dst, const void* src, size_t n) = 0;
};

class SharedMemoryRegistry {
 public:
  // Each region holds one file descriptor and one mapping until it is unregistered.
  static constexpr int64_t kDefaultMaxRegions = 256;
  static constexpr size_t kMaxNameBytes = 256;

  explicit SharedMemoryRegistry(int64_t max_regions = kDefaultMaxRegions) : max_regions_(max_regions) {}
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  // Opens the object `key` (shm_open, read-write) and maps [offset, offset + byte_size).
  // INVALID_ARGUMENT: an empty or over-long name or key, byte_size 0, a range past the
  // object's end, an object that cannot be opened or mapped for a reason other than its
  // absence. NOT_FOUND: no object `key`. ALREADY_EXISTS: `name` is registered.
  // RESOURCE_EXHAUSTED: max_regions are registered.
  absl::Status Register(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size);
  // A CUDA region: `byte_size` bytes of GPU `device` memory behind an IPC handle. The
  // errors of Register for the name and size, DeviceMemoryAccess::OpenIpc's, and
  // UNIMPLEMENTED on a server without GPUs.
  absl::Status RegisterCuda(const std::string& name, const std::string& raw_handle, int64_t device, uint64_t byte_size);
  // Called once the backend has started: `device` (null for a backend without GPUs) must
  // outlive the registry. Until then CUDA registrations are UNAVAILABLE and system
  // regions are not page-locked.
  void SetDeviceAccess(DeviceMemoryAccess* device);
  bool cuda_capable() const;
  // Removes `name` if it is a region of that kind; a name that is not registered is not an
  // error (as in Triton).
  void Unregister(const std::string& name, bool cuda = false);
  void UnregisterAll(bool cuda = false);
  // Every region of the kind (name empty) or one; NOT_FOUND for a name that is not
  // registered as that kind.
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> Status(const std::string& name, bool cuda = false) const;
  // Bytes [offset, offset + byte_size) of region `name`. NOT_FOUND: no such region.
  // INVALID_ARGUMENT: the range is outside the region. FAILED_PRECONDITION: the object
  // was shrunk below the region since it was registered. Messages name the region.
  absl::StatusOr<SharedMemoryBuffer> Find(const std::string& name, uint64_t offset, uint64_t byte_size) const;

 private:
  absl::Status CheckNewName(const std::string& name) const;  // mu_ held
  absl::Status Insert(const std::string& name, std::shared_ptr<const SharedMemoryMapping> m);

  const int64_t max_regions_;
  mutable std::mutex mu_;
  bool device_known_ = false;  // SetDeviceAccess was called
  DeviceMemoryAccess* device_ = nullptr;
  std::map<std::string, std::shared_ptr<const SharedMemoryMapping>> regions_;
};

}  // namespace flashq::server
