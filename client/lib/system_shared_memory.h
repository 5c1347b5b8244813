// A POSIX shared-memory object of this process, mapped read-write, for Triton's
// system shared-memory extension (what tritonclient.utils.shared_memory creates):
//
//   auto shm = SystemSharedMemory::Create("/my_region", bytes);     // StatusOr
//   client->SystemSharedMemoryRegister(0, "my_region", (*shm)->key(), 0, bytes);
//   (*shm)->Unlink();   // optional: the server keeps what it opened
//
// Create() reserves the object's pages (posix_fallocate), so that a full /dev/shm is
// an error here instead of a SIGBUS at the first write. The destructor unmaps the
// object and unlinks its name if Unlink() has not.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace flashq::client {

class SystemSharedMemory {
 public:
  // `key` is a shared-memory object name such as "/my_region"; it must not exist yet.
  static absl::StatusOr<std::unique_ptr<SystemSharedMemory>> Create(const std::string& key, size_t byte_size);
  ~SystemSharedMemory();
  SystemSharedMemory(const SystemSharedMemory&) = delete;
  SystemSharedMemory& operator=(const SystemSharedMemory&) = delete;

  const std::string& key() const { return key_; }
  char* data() const { return data_; }
  size_t size() const { return size_; }
  // Removes the name. The mapping stays, and so do mappings that a server made from the
  // name earlier: the object lives until the last of them goes.
  void Unlink();

 private:
  SystemSharedMemory(std::string key, char* data, size_t size) : key_(std::move(key)), data_(data), size_(size) {}
  std::string key_;
  char* data_;
  size_t size_;
  bool linked_ = true;
};

}  // namespace flashq::client
