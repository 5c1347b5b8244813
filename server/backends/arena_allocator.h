// Offsets within one preallocated block (the CUDA backend's device arena): first-fit
// allocation from a free list that coalesces neighbours on Free, so that a model's
// weights, workspaces and KV pages go back to the arena when the model is unloaded
// and the next model can reuse them. Pure host bookkeeping, no device calls: the
// caller owns the memory and adds the offsets to its base. Thread-safe. Allocation
// happens while models load, never on the request path.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>

namespace flashq::server {

class ArenaAllocator {
 public:
  static constexpr size_t kAlignment = 256;
  explicit ArenaAllocator(size_t capacity);

  // The offset of `bytes` (kAlignment-aligned), or nullopt if no free range holds them.
  std::optional<size_t> Allocate(size_t bytes);
  // Returns the allocation at `offset`; false if nothing was allocated there.
  bool Free(size_t offset);

  size_t capacity() const { return capacity_; }
  size_t used() const;          // bytes allocated and not freed (with alignment padding)
  size_t largest_free() const;  // the largest allocation that would succeed now

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, disjoint, never adjacent
  std::map<size_t, size_t> live_;  // offset -> bytes
  size_t used_ = 0;
};

}  // namespace flashq::server
