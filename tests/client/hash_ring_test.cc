// Consistent hashing of sequence ids: stable, balanced, and adding or removing an
// endpoint moves only the keys that must move.
#include "client/lib/hash_ring.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

namespace flashq::client {
namespace {

HashRing Ring(int n) {
  HashRing r;
  for (int i = 0; i < n; ++i) r.Add("10.0.0." + std::to_string(i + 1) + ":8001");
  return r;
}

TEST(HashRing, SameIdSameEndpoint) {
  HashRing a = Ring(4), b = Ring(4);
  for (uint64_t id = 1; id < 20000; id += 7) {
    EXPECT_EQ(a.Lookup(id), a.Lookup(id));
    EXPECT_EQ(a.LookupName(id), b.LookupName(id));  // another client process agrees
  }
}

TEST(HashRing, EmptyRing) {
  HashRing r;
  EXPECT_EQ(r.Lookup(5), -1);
  EXPECT_TRUE(r.LookupName(5).empty());
}

TEST(HashRing, Balanced) {
  HashRing r = Ring(4);
  std::map<int, int> count;
  const int n = 100000;
  for (uint64_t id = 1; id <= n; ++id) count[r.Lookup(id)]++;
  ASSERT_EQ(count.size(), 4u);
  for (auto& [e, c] : count) EXPECT_NEAR(c / double(n), 0.25, 0.05) << e;  // 160 virtual nodes: within a few %
}

TEST(HashRing, AddingAnEndpointMovesOnlyItsShare) {
  HashRing before = Ring(4), after = Ring(5);
  const int n = 100000;
  int moved = 0;
  for (uint64_t id = 1; id <= n; ++id) {
    const std::string_view a = before.LookupName(id), b = after.LookupName(id);
    if (a != b) {
      ++moved;
      EXPECT_EQ(b, "10.0.0.5:8001") << "a key moved between two old endpoints";
    }
  }
  EXPECT_NEAR(moved / double(n), 1.0 / 5.0, 0.05);  // the ideal is 1/(n+1)
}

TEST(HashRing, RemovingAnEndpointMovesOnlyItsKeys) {
  HashRing r = Ring(5);
  std::vector<std::string> owner;
  for (uint64_t id = 1; id <= 50000; ++id) owner.emplace_back(r.LookupName(id));
  r.Remove("10.0.0.3:8001");
  for (uint64_t id = 1; id <= 50000; ++id) {
    const std::string_view now = r.LookupName(id);
    EXPECT_NE(now, "10.0.0.3:8001");
    if (owner[id - 1] != "10.0.0.3:8001") EXPECT_EQ(now, owner[id - 1]);
  }
  r.Add("10.0.0.3:8001");  // coming back restores the original mapping
  for (uint64_t id = 1; id <= 50000; ++id) EXPECT_EQ(r.LookupName(id), owner[id - 1]);
}

}  // namespace
}  // namespace flashq::client
