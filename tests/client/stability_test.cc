#include "client/bench/stability.h"

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

TEST(Stability, NeedsEnoughWindows) {
  EXPECT_FALSE(IsStable({{100, 10}, {100, 10}}, 3, 10));
  EXPECT_TRUE(IsStable({{100, 10}, {100, 10}, {100, 10}}, 3, 10));
}

TEST(Stability, EachWindowWithinPctOfTheAverage) {
  // average throughput 100: 91 and 109 are inside +-10%, 89 is not.
  EXPECT_TRUE(IsStable({{91, 10}, {100, 10}, {109, 10}}, 3, 10));
  EXPECT_FALSE(IsStable({{88, 10}, {100, 10}, {112, 10}}, 3, 10));
  // latency too
  EXPECT_TRUE(IsStable({{100, 9.2}, {100, 10}, {100, 10.8}}, 3, 10));
  EXPECT_FALSE(IsStable({{100, 8}, {100, 10}, {100, 12}}, 3, 10));
  // a tighter threshold rejects what a looser one accepts
  EXPECT_FALSE(IsStable({{95, 10}, {100, 10}, {105, 10}}, 3, 2));
}

TEST(Stability, OnlyTheLastWindowsCount) {
  EXPECT_TRUE(IsStable({{10, 500}, {1000, 1}, {100, 10}, {101, 10}, {99, 10}}, 3, 5));
  EXPECT_FALSE(IsStable({{100, 10}, {101, 10}, {99, 10}, {50, 10}}, 3, 5));
}

TEST(Stability, EmptyWindowsAreNeverStable) {
  EXPECT_FALSE(IsStable({{0, 0}, {0, 0}, {0, 0}}, 3, 10));
}

}  // namespace
}  // namespace flashq::bench
