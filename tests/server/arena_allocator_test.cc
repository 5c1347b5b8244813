// ArenaAllocator: aligned first-fit allocation, frees that coalesce, and a model's worth
// of allocations returned and reused (what an unload on the CUDA backend relies on).
#include "server/backends/arena_allocator.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

TEST(ArenaAllocatorTest, AlignsAndFillsToCapacity) {
  ArenaAllocator a(4096);
  auto x = a.Allocate(1);
  auto y = a.Allocate(300);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 256u);
  EXPECT_EQ(*y % ArenaAllocator::kAlignment, 0u);
  EXPECT_EQ(a.used(), 256u + 512u);
  EXPECT_TRUE(a.Allocate(4096 - 768));
  EXPECT_FALSE(a.Allocate(1)) << "full";
  EXPECT_FALSE(a.Allocate(size_t(-1))) << "no overflow on huge sizes";
}

TEST(ArenaAllocatorTest, FreeCoalescesNeighboursAndIsReused) {
  ArenaAllocator a(4 * 256);
  auto p0 = a.Allocate(256), p1 = a.Allocate(256), p2 = a.Allocate(256), p3 = a.Allocate(256);
  ASSERT_TRUE(p0 && p1 && p2 && p3);
  EXPECT_FALSE(a.Allocate(256));
  EXPECT_TRUE(a.Free(*p1));
  EXPECT_TRUE(a.Free(*p2));
  EXPECT_EQ(a.largest_free(), 512u) << "p1 and p2 merged";
  EXPECT_FALSE(a.Free(*p2)) << "double free is refused";
  EXPECT_FALSE(a.Free(12345)) << "not an allocation";
  EXPECT_TRUE(a.Free(*p0));
  EXPECT_TRUE(a.Free(*p3));
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), 1024u) << "everything merged back into one range";
  EXPECT_EQ(a.Allocate(1024), std::optional<size_t>(0));
}

TEST(ArenaAllocatorTest, RepeatedLoadAndUnloadNeverExhaustsTheArena) {
  // A "model" of mixed sizes loaded and unloaded many times while another stays put.
  ArenaAllocator a(size_t(64) << 20);
  auto resident = a.Allocate(size_t(10) << 20);
  ASSERT_TRUE(resident);
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<size_t> model;
    for (int i = 0; i < 20; ++i) {
      auto p = a.Allocate(1 + rng() % (size_t(2) << 20));
      ASSERT_TRUE(p) << "round " << round << " allocation " << i;
      model.push_back(*p);
    }
    std::shuffle(model.begin(), model.end(), rng);
    for (size_t p : model) ASSERT_TRUE(a.Free(p));
    ASSERT_EQ(a.used(), size_t(10) << 20);
  }
  EXPECT_EQ(a.largest_free(), size_t(54) << 20);
}

}  // namespace
}  // namespace flashq::server
