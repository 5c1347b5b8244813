#include "client/lib/cuda_shared_memory.h"

#include <dlfcn.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace flashq::client {
namespace {

constexpr int kMemcpyHostToDevice = 1;  // cudaMemcpyKind
constexpr int kMemcpyDeviceToHost = 2;
constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace

absl::StatusOr<std::shared_ptr<CudaRuntime>> CudaRuntime::Load(int device) {
  void* lib = nullptr;
  std::string name, last_error;
  for (const char* candidate : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
    lib = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      name = candidate;
      break;
    }
    const char* e = dlerror();
    last_error = e ? e : candidate;
  }
  if (!lib) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA shared memory needs libcudart (the CUDA runtime), which could not be loaded: ", last_error,
        ". Install the CUDA runtime or add its lib directory to LD_LIBRARY_PATH"));
  }
  // The library stays loaded for the life of the process: unloading cudart while its
  // context exists can crash at exit.
  std::shared_ptr<CudaRuntime> rt(new CudaRuntime());
  rt->library_ = name;
  rt->device_ = device;
  Api& a = rt->api_;
  if (!Resolve(lib, "cudaGetDeviceCount", &a.GetDeviceCount) || !Resolve(lib, "cudaSetDevice", &a.SetDevice) ||
      !Resolve(lib, "cudaMalloc", &a.Malloc) || !Resolve(lib, "cudaFree", &a.Free) ||
      !Resolve(lib, "cudaMemcpy", &a.Memcpy) || !Resolve(lib, "cudaIpcGetMemHandle", &a.IpcGetMemHandle) ||
      !Resolve(lib, "cudaGetErrorString", &a.GetErrorString) || !Resolve(lib, "cudaMallocHost", &a.MallocHost) ||
      !Resolve(lib, "cudaFreeHost", &a.FreeHost) || !Resolve(lib, "cudaStreamSynchronize", &a.StreamSynchronize)) {
    return absl::FailedPreconditionError(absl::StrCat(name, " lacks a CUDA runtime entry point: ", dlerror()));
  }
  int count = 0;
  if (int err = a.GetDeviceCount(&count); err != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA shared memory needs a GPU, and the CUDA runtime (", name, ") finds none: cudaGetDeviceCount: ",
        a.GetErrorString(err)));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA shared memory on GPU ", device, ": this host has ", count, " GPU(s)"));
  }
  if (absl::Status s = rt->Check(a.SetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  return rt;
}

absl::Status CudaRuntime::Check(int err, const char* call) const {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " on GPU ", device_, ": ", api_.GetErrorString(err)));
}

absl::StatusOr<std::unique_ptr<CudaSharedMemory>> CudaSharedMemory::Create(std::shared_ptr<CudaRuntime> cuda,
                                                                          size_t byte_size) {
  if (byte_size == 0) return absl::InvalidArgumentError("CUDA shared memory of 0 bytes");
  const auto& a = cuda->api();
  // The current device is a per-thread setting: set it on every call.
  if (absl::Status s = cuda->Check(a.SetDevice(cuda->device()), "cudaSetDevice"); !s.ok()) return s;
  void* ptr = nullptr;
  if (int err = a.Malloc(&ptr, byte_size); err != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", byte_size, " bytes on GPU ", cuda->device(), ": ", a.GetErrorString(err)));
  }
  std::string handle(kIpcHandleBytes, '\0');
  if (int err = a.IpcGetMemHandle(handle.data(), ptr); err != 0) {
    absl::Status s = cuda->Check(err, "cudaIpcGetMemHandle");
    a.Free(ptr);
    return s;
  }
  void* host = nullptr;
  if (a.MallocHost(&host, byte_size) != 0) host = nullptr;  // then copies go from pageable memory
  return std::unique_ptr<CudaSharedMemory>(
      new CudaSharedMemory(std::move(cuda), ptr, host, byte_size, std::move(handle)));
}

CudaSharedMemory::~CudaSharedMemory() {
  cuda_->api().SetDevice(cuda_->device());
  cuda_->api().Free(ptr_);
  if (host_) cuda_->api().FreeHost(host_);
}

absl::Status CudaSharedMemory::InRange(size_t offset, size_t n) const {
  if (offset > size_ || n > size_ - offset)
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + n, ") of CUDA shared memory of ", size_));
  return absl::OkStatus();
}

absl::Status CudaSharedMemory::Write(size_t offset, const void* src, size_t n) {
  if (absl::Status s = InRange(offset, n); !s.ok()) return s;
  const auto& a = cuda_->api();
  if (absl::Status s = cuda_->Check(a.SetDevice(cuda_->device()), "cudaSetDevice"); !s.ok()) return s;
  char* dst = static_cast<char*>(ptr_) + offset;
  if (host_) {  // from page-locked memory cudaMemcpy returns when the copy is done
    std::memcpy(host_ + offset, src, n);
    return cuda_->Check(a.Memcpy(dst, host_ + offset, n, kMemcpyHostToDevice), "cudaMemcpy");
  }
  // From pageable memory it may return before the DMA lands: wait for it, so that a server
  // that reads (or overwrites) these bytes after the next RPC sees them.
  if (absl::Status s = cuda_->Check(a.Memcpy(dst, src, n, kMemcpyHostToDevice), "cudaMemcpy"); !s.ok()) return s;
  return cuda_->Check(a.StreamSynchronize(nullptr), "cudaStreamSynchronize");
}

absl::Status CudaSharedMemory::Read(size_t offset, void* dst, size_t n) {
  if (absl::Status s = InRange(offset, n); !s.ok()) return s;
  const auto& a = cuda_->api();
  if (absl::Status s = cuda_->Check(a.SetDevice(cuda_->device()), "cudaSetDevice"); !s.ok()) return s;
  const char* src = static_cast<char*>(ptr_) + offset;
  if (!host_) return cuda_->Check(a.Memcpy(dst, src, n, kMemcpyDeviceToHost), "cudaMemcpy");
  if (absl::Status s = cuda_->Check(a.Memcpy(host_ + offset, src, n, kMemcpyDeviceToHost), "cudaMemcpy"); !s.ok()) {
    return s;
  }
  std::memcpy(dst, host_ + offset, n);
  return absl::OkStatus();
}

}  // namespace flashq::client
