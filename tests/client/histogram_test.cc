// Percentiles from the log-bucketed histogram against exact nearest-rank
// percentiles of the sorted samples: the relative error is bounded by the bucket
// width (1/128) for any distribution.
#include "client/bench/histogram.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

int64_t ExactPercentile(std::vector<int64_t> v, double p) {
  std::sort(v.begin(), v.end());
  int64_t rank = int64_t(std::ceil(p / 100.0 * double(v.size())));
  rank = std::clamp<int64_t>(rank, 1, int64_t(v.size()));
  return v[size_t(rank - 1)];
}

void ExpectPercentilesClose(const std::vector<int64_t>& samples) {
  Histogram h;
  for (int64_t s : samples) h.Record(s);
  ASSERT_EQ(h.count(), int64_t(samples.size()));
  for (double p : {0.0, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0}) {
    const double exact = double(ExactPercentile(samples, p));
    const double got = double(h.Percentile(p));
    EXPECT_LE(std::fabs(got - exact), exact / 128.0 + 0.5) << "p" << p << " exact " << exact << " got " << got;
  }
  EXPECT_EQ(h.min(), *std::min_element(samples.begin(), samples.end()));
  EXPECT_EQ(h.max(), *std::max_element(samples.begin(), samples.end()));
  double mean = 0;
  for (int64_t s : samples) mean += double(s);
  EXPECT_NEAR(h.mean(), mean / double(samples.size()), 1e-6 * mean / double(samples.size()) + 1e-9);
}

TEST(Histogram, BucketsTileTheLineWithBoundedWidth) {
  for (int i = 0; i + 1 < Histogram::NumBuckets(); ++i) {
    ASSERT_EQ(Histogram::BucketHigh(i), Histogram::BucketLow(i + 1)) << i;
    const int64_t lo = Histogram::BucketLow(i), w = Histogram::BucketHigh(i) - lo;
    ASSERT_TRUE(w == 1 || double(w) / double(lo) <= 1.0 / 128.0) << i;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const int64_t v = int64_t(rng() >> (17 + rng() % 46));
    const int b = Histogram::BucketIndex(v);
    ASSERT_LE(Histogram::BucketLow(b), v);
    ASSERT_LT(v, Histogram::BucketHigh(b));
  }
}

TEST(Histogram, SmallValuesAreExact) {
  Histogram h;
  for (int v = 0; v < 256; ++v) h.Record(v);
  for (int p = 1; p <= 100; ++p) EXPECT_EQ(h.Percentile(p), ExactPercentile([] {
    std::vector<int64_t> v(256);
    for (int i = 0; i < 256; ++i) v[i] = i;
    return v;
  }(), p));
}

TEST(Histogram, LognormalLatenciesMatchSortedSamples) {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> d(std::log(2e6), 0.8);  // ~2 ms median, heavy tail
  std::vector<int64_t> s(200000);
  for (auto& x : s) x = int64_t(d(rng));
  ExpectPercentilesClose(s);
}

TEST(Histogram, UniformAndBimodalMatchSortedSamples) {
  std::mt19937_64 rng(2);
  std::vector<int64_t> u(50000), b(50000);
  for (auto& x : u) x = std::uniform_int_distribution<int64_t>(1000, 5000000)(rng);
  for (size_t i = 0; i < b.size(); ++i) b[i] = (i % 10 == 0 ? 900000000 : 300000) + int64_t(rng() % 1000);
  ExpectPercentilesClose(u);
  ExpectPercentilesClose(b);
}

TEST(Histogram, FewSamplesAndEmpty) {
  Histogram h;
  EXPECT_EQ(h.Percentile(50), 0);
  EXPECT_EQ(h.count(), 0);
  ExpectPercentilesClose({123456789});
  ExpectPercentilesClose({5, 1000000, 3000000000});
}

TEST(Histogram, MergeEqualsRecordingEverything) {
  std::mt19937_64 rng(3);
  Histogram a, b, all;
  for (int i = 0; i < 10000; ++i) {
    const int64_t v = int64_t(rng() % 100000000);
    (i % 3 ? a : b).Record(v);
    all.Record(v);
  }
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.min(), all.min());
  EXPECT_EQ(a.max(), all.max());
  EXPECT_DOUBLE_EQ(a.mean(), all.mean());
  for (double p : {50.0, 90.0, 99.0, 99.9}) EXPECT_EQ(a.Percentile(p), all.Percentile(p));
  a.Reset();
  EXPECT_EQ(a.count(), 0);
}

}  // namespace
}  // namespace flashq::bench
