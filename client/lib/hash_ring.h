// Consistent hashing of sequence ids onto endpoints: a ring of virtual nodes
// (Karger et al.). Each endpoint owns `virtual_nodes` points on a 64-bit ring;
// a key maps to the first point at or after its hash. Adding an endpoint moves
// only the keys that the new endpoint's points take over (about 1/(n+1) of them),
// so sessions on other endpoints stay where their KV cache is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashq::client {

uint64_t Hash64(std::string_view bytes);  // FNV-1a followed by a splitmix64 finalizer
uint64_t Mix64(uint64_t x);                // splitmix64 finalizer

class HashRing {
 public:
  explicit HashRing(int virtual_nodes = 160) : virtual_nodes_(virtual_nodes) {}

  // Endpoints are identified by name (e.g. "host:port"); the index returned by
  // Lookup is the order of insertion.
  void Add(std::string_view endpoint);
  void Remove(std::string_view endpoint);
  bool empty() const { return points_.empty(); }
  size_t size() const { return names_.size(); }
  const std::string& name(int index) const { return names_[index]; }

  // Index of the endpoint that owns `key`; -1 when the ring is empty.
  int Lookup(uint64_t key) const;
  std::string_view LookupName(uint64_t key) const;

 private:
  void Rebuild();
  int virtual_nodes_;
  std::vector<std::string> names_;
  std::vector<bool> live_;
  std::vector<std::pair<uint64_t, int>> points_;  // sorted by hash
};

}  // namespace flashq::client
