// GPU memory for Triton's CUDA shared-memory extension (what
// tritonclient.utils.cuda_shared_memory creates): cudaMalloc'd memory whose
// cudaIpcMemHandle_t a server on the same host opens, so tensors reach its GPU with no
// copy through the message or the host.
//
//   auto cuda = CudaRuntime::Load(/*device=*/0);                     // StatusOr
//   auto mem = CudaSharedMemory::Create(*cuda, bytes);
//   client->CudaSharedMemoryRegister(0, "r", (*mem)->ipc_handle(), 0, bytes);
//   (*mem)->Write(0, host_bytes, n);
//
// libcudart is loaded at run time (dlopen): the client library neither links CUDA nor
// needs it unless this is used, and a missing libcudart, driver or GPU is an error
// from Load() that names what is missing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace flashq::client {

class CudaRuntime {
 public:
  // Loads libcudart (libcudart.so, else .so.13, .so.12) and checks that GPU `device` exists.
  static absl::StatusOr<std::shared_ptr<CudaRuntime>> Load(int device);
  int device() const { return device_; }
  const std::string& library() const { return library_; }

  // cudart's C entry points, resolved once. cudaError_t is an int enum; 0 is success.
  struct Api {
    int (*GetDeviceCount)(int*) = nullptr;
    int (*SetDevice)(int) = nullptr;
    int (*Malloc)(void**, size_t) = nullptr;
    int (*Free)(void*) = nullptr;
    int (*Memcpy)(void*, const void*, size_t, int) = nullptr;
    int (*IpcGetMemHandle)(void*, void*) = nullptr;
    int (*MallocHost)(void**, size_t) = nullptr;
    int (*FreeHost)(void*) = nullptr;
    int (*StreamSynchronize)(void*) = nullptr;
    const char* (*GetErrorString)(int) = nullptr;
  };
  const Api& api() const { return api_; }
  // "cudaMemcpy: <cudart's message>" for a failed call, else OK.
  absl::Status Check(int err, const char* call) const;

 private:
  CudaRuntime() = default;
  Api api_;
  int device_ = 0;
  std::string library_;
};

class CudaSharedMemory {
 public:
  static absl::StatusOr<std::unique_ptr<CudaSharedMemory>> Create(std::shared_ptr<CudaRuntime> cuda, size_t byte_size);
  ~CudaSharedMemory();
  CudaSharedMemory(const CudaSharedMemory&) = delete;
  CudaSharedMemory& operator=(const CudaSharedMemory&) = delete;

  const std::string& ipc_handle() const { return handle_; }  // the cudaIpcMemHandle_t's 64 bytes
  int device() const { return cuda_->device(); }
  size_t size() const { return size_; }
  // Synchronous copies between host memory and [offset, offset + n) of this memory: complete
  // on the GPU when they return. They go through a page-locked mirror of the memory when one
  // could be allocated (DMA at full speed), else from pageable memory.
  absl::Status Write(size_t offset, const void* src, size_t n);
  absl::Status Read(size_t offset, void* dst, size_t n);

 private:
  CudaSharedMemory(std::shared_ptr<CudaRuntime> cuda, void* ptr, void* host, size_t size, std::string handle)
      : cuda_(std::move(cuda)), ptr_(ptr), host_(static_cast<char*>(host)), size_(size), handle_(std::move(handle)) {}
  absl::Status InRange(size_t offset, size_t n) const;
  std::shared_ptr<CudaRuntime> cuda_;
  void* ptr_;
  char* host_;  // page-locked mirror, or null
  size_t size_;
  std::string handle_;
};

}  // namespace flashq::client
