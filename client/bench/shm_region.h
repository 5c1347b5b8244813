// flashq-bench --shared-memory: the memory that request tensors travel in instead of
// the gRPC message, as in perf_analyzer's --shared-memory=none|system|cuda.
//
// A Region is one client slot's memory, registered under one name on every endpoint
// (a request may go to any of them). A RegionFactory makes them; the gRPC one names
// them flashq-bench-<pid>-<n> and registers them through the client library:
// - system: a POSIX object, whose name is unlinked as soon as every server has opened
//   it, so that no /dev/shm object outlives flashq-bench even if it is killed;
// - cuda: cudaMalloc'd memory on GPU 0, passed as a CUDA IPC handle (libcudart loaded
//   at run time).
// Destroying a Region unregisters it from every endpoint and frees its memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "client/lib/client.h"
#include "client/lib/cuda_shared_memory.h"

namespace flashq::bench {

enum class SharedMemoryKind { kNone, kSystem, kCuda };
absl::StatusOr<SharedMemoryKind> ParseSharedMemoryKind(std::string_view s);
const char* SharedMemoryKindName(SharedMemoryKind kind);

class Region {
 public:
  virtual ~Region() = default;
  virtual const std::string& name() const = 0;
  virtual size_t size() const = 0;
  virtual absl::Status Write(size_t offset, std::string_view bytes) = 0;
  // Bytes [offset, offset + n): a view of the mapping (system), or of *scratch after a
  // copy from the GPU (cuda). Valid until the next Read or Write.
  virtual absl::StatusOr<std::string_view> Read(size_t offset, size_t n, std::string* scratch) = 0;
  // Unregisters the region from every endpoint now, keeping its memory until the Region
  // is destroyed; the destructor does it otherwise. Makes RPCs.
  virtual void Unregister() = 0;
};

class RegionFactory {
 public:
  virtual ~RegionFactory() = default;
  // A registered region of `byte_size` bytes.
  virtual absl::StatusOr<std::unique_ptr<Region>> Create(size_t byte_size) = 0;
};

// Regions on every endpoint of `client`, which must outlive the factory and its regions.
// cuda: on GPU `cuda`'s device, loaded here when null; an error names what is missing
// (libcudart, a GPU) when CUDA is unusable on this host.
absl::StatusOr<std::unique_ptr<RegionFactory>> MakeGrpcRegionFactory(client::Client& client, SharedMemoryKind kind,
                                                                     std::shared_ptr<client::CudaRuntime> cuda = nullptr);

}  // namespace flashq::bench
