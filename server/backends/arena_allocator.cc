#include "server/backends/arena_allocator.h"

#include <algorithm>

namespace flashq::server {

ArenaAllocator::ArenaAllocator(size_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<size_t> ArenaAllocator::Allocate(size_t bytes) {
  // Every range starts and ends on kAlignment, so rounding the size keeps all offsets aligned.
  const size_t size = std::max<size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  if (size < bytes) return std::nullopt;  // overflow
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const size_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left > 0) free_[offset + size] = left;
    live_[offset] = size;
    used_ += size;
    return offset;
  }
  return std::nullopt;
}

bool ArenaAllocator::Free(size_t offset) {
  std::lock_guard<std::mutex> l(mu_);
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  const size_t end = offset + live->second;
  size_t start = offset, size = live->second;
  used_ -= live->second;
  live_.erase(live);
  // Merge with the free range that ends here and the one that starts where this ends.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == end) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
  return true;
}

size_t ArenaAllocator::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return used_;
}

size_t ArenaAllocator::largest_free() const {
  std::lock_guard<std::mutex> l(mu_);
  size_t best = 0;
  for (const auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace flashq::server
