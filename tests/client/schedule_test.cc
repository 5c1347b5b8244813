// Open-loop schedules: constant spacing without drift, and Poisson arrivals with
// exponential gaps (mean 1/rate, coefficient of variation 1, Poisson counts).
#include "client/bench/schedule.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

TEST(Schedule, ConstantRateIsExactAndDoesNotDrift) {
  ArrivalSchedule s(Arrival::kConstant, 300.0, 1);  // 3.333... ms: not a whole number of ns
  for (int i = 0; i < 1000000; ++i) {
    const int64_t t = s.NextOffsetNs();
    if (i % 99999 == 0) EXPECT_EQ(t, std::llround(i * 1e9 / 300.0)) << i;
  }
}

TEST(Schedule, PoissonGapsAreExponential) {
  const double rate = 250.0;
  ArrivalSchedule s(Arrival::kPoisson, rate, 42);
  const int n = 200000;
  std::vector<double> gaps;
  int64_t prev = s.NextOffsetNs();
  EXPECT_EQ(prev, 0);
  for (int i = 0; i < n; ++i) {
    const int64_t t = s.NextOffsetNs();
    ASSERT_GE(t, prev);
    gaps.push_back(double(t - prev) / 1e9);
    prev = t;
  }
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= n;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= n;
  EXPECT_NEAR(mean, 1.0 / rate, 0.01 / rate);
  EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.02);  // exponential: CV = 1
  // P(gap > mean) = e^-1 for an exponential distribution.
  int above = 0;
  for (double g : gaps) above += g > 1.0 / rate;
  EXPECT_NEAR(above / double(n), std::exp(-1.0), 0.01);
}

TEST(Schedule, PoissonCountsPerIntervalHaveVarianceEqualToMean) {
  const double rate = 1000.0;
  ArrivalSchedule s(Arrival::kPoisson, rate, 7);
  const int64_t interval = 10'000'000;  // 10 ms: expected 10 arrivals
  std::vector<int> counts(20000, 0);
  for (;;) {
    const int64_t t = s.NextOffsetNs();
    const size_t bin = size_t(t / interval);
    if (bin >= counts.size()) break;
    counts[bin]++;
  }
  double mean = 0, var = 0;
  for (int c : counts) mean += c;
  mean /= double(counts.size());
  for (int c : counts) var += (c - mean) * (c - mean);
  var /= double(counts.size());
  EXPECT_NEAR(mean, 10.0, 0.1);
  EXPECT_NEAR(var / mean, 1.0, 0.05);  // index of dispersion of a Poisson process
}

TEST(Schedule, SeedsReproduce) {
  ArrivalSchedule a(Arrival::kPoisson, 100, 9), b(Arrival::kPoisson, 100, 9), c(Arrival::kPoisson, 100, 10);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const int64_t x = a.NextOffsetNs(), y = b.NextOffsetNs(), z = c.NextOffsetNs();
    EXPECT_EQ(x, y);
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace flashq::bench
