#include "server/backends/cuda/device_context.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace flashq::server {

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status FromKernel(const Status& s) {
  if (s.ok()) return absl::OkStatus();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return absl::InvalidArgumentError(s.message());
    case StatusCode::kNotFound: return absl::NotFoundError(s.message());
    case StatusCode::kResourceExhausted: return absl::ResourceExhaustedError(s.message());
    case StatusCode::kUnimplemented: return absl::UnimplementedError(s.message());
    default: return absl::InternalError(s.message());
  }
}

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(int device, size_t bytes) {
  std::unique_ptr<DeviceArena> a(new DeviceArena());
  FQ_CUDA_OK(cudaSetDevice(device));
  FQ_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&a->base_), bytes));
  a->bytes_ = bytes;
  a->alloc_ = std::make_unique<ArenaAllocator>(bytes);
  return a;
}

DeviceArena::~DeviceArena() {
  if (base_) cudaFree(base_);
}

absl::StatusOr<char*> DeviceArena::Allocate(size_t bytes, const std::string& what) {
  auto offset = alloc_->Allocate(bytes);
  if (!offset) {
    return absl::ResourceExhaustedError(absl::StrCat("GPU arena full: ", what, " needs ", bytes, " bytes; ",
                                                     bytes_ - alloc_->used(), " of ", bytes_,
                                                     " are free, the largest free range is ", alloc_->largest_free(),
                                                     " (raise --gpu-arena-mb)"));
  }
  return base_ + *offset;
}

void DeviceArena::Free(const void* p) {
  if (p) alloc_->Free(size_t(static_cast<const char*>(p) - base_));
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Create(int device, int streams, size_t staging_bytes,
                                                                     size_t arena_bytes) {
  std::unique_ptr<DeviceContext> d(new DeviceContext());
  d->device_ = device;
  d->staging_bytes_ = staging_bytes;
  FQ_CUDA_OK(cudaSetDevice(device));
  cudaDeviceProp prop;
  FQ_CUDA_OK(cudaGetDeviceProperties(&prop, device));
  d->name_ = prop.name;
  auto arena = DeviceArena::Create(device, arena_bytes);
  if (!arena.ok()) return arena.status();
  d->arena_ = std::move(*arena);
  // 64 MB per stream as in the gemm benchmark: the algorithms cuBLASLt picks (and the batch-invariant pin) depend on the
  // workspace limit; with 32 MB the pinned FP8 tensor-wise GEMM was up to 20% slower at M = 4096 on the H200
  // (docs/perf/gemm.md).
  if (auto s = FromKernel(gemm::BlasLt::Create(size_t(64) << 20, &d->blas_)); !s.ok()) return s;
  d->slots_.resize(streams);
  for (int i = 0; i < streams; ++i) {
    StreamSlot& s = d->slots_[i];
    s.index = i;
    s.bytes = staging_bytes;
    FQ_CUDA_OK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    if (auto st = FromKernel(d->blas_->ReserveStream(s.stream)); !st.ok()) return st;  // its own cuBLASLt workspace
    FQ_CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&s.host), staging_bytes, cudaHostAllocDefault));
    auto dev = d->arena_->Allocate(staging_bytes, "stream staging");
    if (!dev.ok()) return dev.status();
    s.device = *dev;
    FQ_CUDA_OK(cudaEventCreate(&s.start));
    FQ_CUDA_OK(cudaEventCreate(&s.stop));
    d->free_.push_back(i);
  }
  return d;
}

DeviceContext::~DeviceContext() {
  cudaSetDevice(device_);
  for (auto& s : slots_) {
    if (s.stream) cudaStreamSynchronize(s.stream), cudaStreamDestroy(s.stream);
    if (s.host) cudaFreeHost(s.host);
    if (s.start) cudaEventDestroy(s.start);
    if (s.stop) cudaEventDestroy(s.stop);
  }
  blas_.reset();
  arena_.reset();
}

StreamSlot* DeviceContext::Acquire() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !free_.empty(); });
  int i = free_.back();
  free_.pop_back();
  return &slots_[i];
}

void DeviceContext::Release(StreamSlot* slot) {
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(slot->index);
  }
  cv_.notify_one();
}

}  // namespace flashq::server
