#include "client/lib/hash_ring.h"

#include <algorithm>

namespace flashq::client {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Hash64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return Mix64(h);
}

void HashRing::Add(std::string_view endpoint) {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == endpoint) {
      live_[i] = true;
      Rebuild();
      return;
    }
  }
  names_.emplace_back(endpoint);
  live_.push_back(true);
  Rebuild();
}

void HashRing::Remove(std::string_view endpoint) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == endpoint) live_[i] = false;
  Rebuild();
}

void HashRing::Rebuild() {
  points_.clear();
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!live_[i]) continue;
    for (int v = 0; v < virtual_nodes_; ++v)
      points_.emplace_back(Hash64(names_[i] + "#" + std::to_string(v)), int(i));
  }
  std::sort(points_.begin(), points_.end());
}

int HashRing::Lookup(uint64_t key) const {
  if (points_.empty()) return -1;
  const uint64_t h = Mix64(key);
  auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(h, -1));
  if (it == points_.end()) it = points_.begin();  // wrap around the ring
  return it->second;
}

std::string_view HashRing::LookupName(uint64_t key) const {
  int i = Lookup(key);
  return i < 0 ? std::string_view() : std::string_view(names_[i]);
}

}  // namespace flashq::client
