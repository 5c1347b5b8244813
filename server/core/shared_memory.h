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
// Only system regions exist so far; the CUDA extension's regions will join this registry.
// The registry is passed in, never global; every method is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::server {

class SharedMemoryMapping;  // one mmap of a region and the object's descriptor

// Bytes of a registered region, mapped for as long as this (or a copy) lives.
struct SharedMemoryBuffer {
  std::shared_ptr<const SharedMemoryMapping> mapping;
  char* data = nullptr;
  size_t size = 0;
};

struct SharedMemoryRegionStatus {
  std::string name, key;
  uint64_t offset = 0, byte_size = 0;
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
  // Removes `name`; a name that is not registered is not an error (as in Triton).
  void Unregister(const std::string& name);
  void UnregisterAll();
  // Every region (name empty) or one; NOT_FOUND for a name that is not registered.
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> Status(const std::string& name) const;
  // Bytes [offset, offset + byte_size) of region `name`. NOT_FOUND: no such region.
  // INVALID_ARGUMENT: the range is outside the region. FAILED_PRECONDITION: the object
  // was shrunk below the region since it was registered. Messages name the region.
  absl::StatusOr<SharedMemoryBuffer> Find(const std::string& name, uint64_t offset, uint64_t byte_size) const;

 private:
  const int64_t max_regions_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const SharedMemoryMapping>> regions_;
};

}  // namespace flashq::server
