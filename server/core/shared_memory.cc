#include "server/core/shared_memory.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/core/client_text.h"

namespace flashq::server {

class SharedMemoryMapping {
 public:
  SharedMemoryMapping(std::string key, uint64_t offset, uint64_t byte_size, int fd, void* base, size_t length,
                      char* data)
      : key(std::move(key)), offset(offset), byte_size(byte_size), fd(fd), base(base), length(length), data(data) {}
  ~SharedMemoryMapping() {
    munmap(base, length);
    close(fd);
  }
  SharedMemoryMapping(const SharedMemoryMapping&) = delete;
  SharedMemoryMapping& operator=(const SharedMemoryMapping&) = delete;

  const std::string key;
  const uint64_t offset, byte_size;  // the region within the object, as registered
  const int fd;                      // kept open to re-check the object's size
  void* const base;                  // the mapping: from the page that holds `offset`
  const size_t length;
  char* const data;                  // base + offset % page: the region's first byte
};

namespace {

std::string ErrnoText(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string Region(const std::string& name) { return absl::StrCat("shared-memory region ", Quoted(name)); }

}  // namespace

absl::Status SharedMemoryRegistry::Register(const std::string& name, const std::string& key, uint64_t offset,
                                            uint64_t byte_size) {
  if (name.empty()) return absl::InvalidArgumentError("a shared-memory region needs a non-empty name");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": the name is ", name.size(), " bytes; the limit is ", kMaxNameBytes));
  }
  // shm_open takes "/name" (or "name"): one path component of at most NAME_MAX bytes.
  const size_t first = key.find_first_not_of('/');
  if (first == std::string::npos || key.find('\0') != std::string::npos || key.find('/', first) != std::string::npos ||
      key.size() - first > NAME_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(Region(name), ": key ", Quoted(key),
                                                   " is not a shared-memory object name such as '/my_region'"));
  }
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat(Region(name), ": byte_size is 0"));
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, byte_size, &end) || end > uint64_t(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": offset ", offset, " + byte_size ", byte_size, " is past any object's end"));
  }

  std::lock_guard<std::mutex> l(mu_);
  if (auto it = regions_.find(name); it != regions_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(Region(name), " is already registered (key ", Quoted(it->second->key),
                                                 "); unregister it first"));
  }
  if (int64_t(regions_.size()) >= max_regions_) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot register ", Region(name), ": ", regions_.size(),
                                                     " regions are registered, the limit (--max-shared-memory-regions)"));
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    std::string why =
        absl::StrCat(Region(name), ": cannot open shared-memory object ", Quoted(key), ": ", ErrnoText(e));
    return e == ENOENT ? absl::NotFoundError(why) : absl::InvalidArgumentError(why);
  }
  auto fail = [fd](absl::Status s) {
    close(fd);
    return s;
  };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": cannot stat shared-memory object ", Quoted(key), ": ", ErrnoText(errno))));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(Region(name), ": ", Quoted(key), " is not a shared-memory object")));
  }
  if (st.st_size < 0 || uint64_t(st.st_size) < end) {
    return fail(absl::InvalidArgumentError(absl::StrCat(Region(name), ": offset ", offset, " + byte_size ", byte_size,
                                                        " = ", end, " is past the end of shared-memory object ",
                                                        Quoted(key), " (", int64_t(st.st_size), " bytes)")));
  }
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset - offset % page;
  const size_t length = size_t(end - start);
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(start));
  if (base == MAP_FAILED) {
    const int e = errno;
    std::string why = absl::StrCat(Region(name), ": cannot map ", byte_size, " bytes at offset ", offset,
                                   " of shared-memory object ", Quoted(key), ": ", ErrnoText(e));
    return fail(e == ENOMEM ? absl::ResourceExhaustedError(why) : absl::InvalidArgumentError(why));
  }
  regions_.emplace(name, std::make_shared<const SharedMemoryMapping>(key, offset, byte_size, fd, base, length,
                                                                     static_cast<char*>(base) + (offset - start)));
  return absl::OkStatus();
}

void SharedMemoryRegistry::Unregister(const std::string& name) {
  std::shared_ptr<const SharedMemoryMapping> last;  // unmapped (if unused) after the lock is released
  std::lock_guard<std::mutex> l(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) return;
  last = std::move(it->second);
  regions_.erase(it);
}

void SharedMemoryRegistry::UnregisterAll() {
  std::map<std::string, std::shared_ptr<const SharedMemoryMapping>> all;
  std::lock_guard<std::mutex> l(mu_);
  all.swap(regions_);
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> SharedMemoryRegistry::Status(const std::string& name) const {
  std::vector<SharedMemoryRegionStatus> out;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [n, m] : regions_) {
    if (name.empty() || n == name) out.push_back({n, m->key, m->offset, m->byte_size});
  }
  if (!name.empty() && out.empty()) return absl::NotFoundError(absl::StrCat(Region(name), " is not registered"));
  return out;
}

absl::StatusOr<SharedMemoryBuffer> SharedMemoryRegistry::Find(const std::string& name, uint64_t offset,
                                                              uint64_t byte_size) const {
  std::shared_ptr<const SharedMemoryMapping> m;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) return absl::NotFoundError(absl::StrCat(Region(name), " is not registered"));
    m = it->second;
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, byte_size, &end) || end > m->byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " + byte_size ", byte_size, " is past the end of ",
                                                   Region(name), " (", m->byte_size, " bytes)"));
  }
  struct stat st;
  if (fstat(m->fd, &st) != 0 || st.st_size < 0 || uint64_t(st.st_size) < m->offset + m->byte_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory object ", Quoted(m->key), " of ", Region(name),
                     " no longer holds the registered offset ", m->offset, " + byte_size ", m->byte_size,
                     " (it was truncated); register the region again"));
  }
  char* data = m->data + offset;
  return SharedMemoryBuffer{std::move(m), data, size_t(byte_size)};
}

}  // namespace flashq::server
