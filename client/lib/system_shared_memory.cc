#include "client/lib/system_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace flashq::client {

absl::StatusOr<std::unique_ptr<SystemSharedMemory>> SystemSharedMemory::Create(const std::string& key,
                                                                              size_t byte_size) {
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat("shared-memory object ", key, ": size 0"));
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("cannot create shared-memory object ", key, ": ", std::strerror(e));
    return e == EEXIST ? absl::AlreadyExistsError(why) : absl::UnavailableError(why);
  }
  auto fail = [&](const char* what, int e) {
    close(fd);
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shared-memory object ", key, " of ", byte_size, " bytes: ", what, ": ", std::strerror(e)));
  };
  if (ftruncate(fd, off_t(byte_size)) != 0) return fail("ftruncate", errno);
  // tmpfs allocates pages on first touch: reserve them now (posix_fallocate returns the error).
  if (int e = posix_fallocate(fd, 0, off_t(byte_size)); e != 0) return fail("posix_fallocate", e);
  void* p = mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", errno);
  close(fd);  // the mapping keeps the object open
  return std::unique_ptr<SystemSharedMemory>(new SystemSharedMemory(key, static_cast<char*>(p), byte_size));
}

SystemSharedMemory::~SystemSharedMemory() {
  munmap(data_, size_);
  Unlink();
}

void SystemSharedMemory::Unlink() {
  if (linked_) shm_unlink(key_.c_str());
  linked_ = false;
}

}  // namespace flashq::client
