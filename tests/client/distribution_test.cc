// Workload length generators: bounds and moments of each distribution, and the
// empirical distribution of a lengths file.
#include "client/bench/distribution.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

namespace flashq::bench {
namespace {

struct Moments {
  double mean = 0, var = 0;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
};
Moments Sample(const IntDistribution& d, int n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  Moments m;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t v = d.Sample(rng);
    s += double(v);
    s2 += double(v) * double(v);
    m.lo = std::min(m.lo, v);
    m.hi = std::max(m.hi, v);
  }
  m.mean = s / n;
  m.var = s2 / n - m.mean * m.mean;
  return m;
}

TEST(Distribution, Fixed) {
  for (const char* spec : {"fixed:128", "128"}) {
    auto d = IntDistribution::Parse(spec);
    ASSERT_TRUE(d.ok()) << d.status();
    Moments m = Sample(*d, 1000);
    EXPECT_EQ(m.lo, 128);
    EXPECT_EQ(m.hi, 128);
  }
}

TEST(Distribution, UniformBoundsAndMoments) {
  auto d = IntDistribution::Parse("uniform:16:512");
  ASSERT_TRUE(d.ok());
  Moments m = Sample(*d, 200000);
  EXPECT_EQ(m.lo, 16);
  EXPECT_EQ(m.hi, 512);
  const double n = 512 - 16 + 1;
  EXPECT_NEAR(m.mean, (16 + 512) / 2.0, 1.0);
  EXPECT_NEAR(m.var, (n * n - 1) / 12.0, 0.02 * (n * n - 1) / 12.0);
}

TEST(Distribution, LognormalMedianMeanAndClamp) {
  auto d = IntDistribution::Parse("lognormal:200:0.5");
  ASSERT_TRUE(d.ok());
  std::mt19937_64 rng(5);
  std::vector<int64_t> v(200000);
  double s = 0;
  for (auto& x : v) s += double(x = d->Sample(rng));
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  EXPECT_NEAR(double(v[v.size() / 2]), 200.0, 3.0);
  EXPECT_NEAR(s / double(v.size()), 200.0 * std::exp(0.125), 2.0);  // median * exp(sigma^2/2)

  auto c = IntDistribution::Parse("lognormal:96:0.6:16:512");
  ASSERT_TRUE(c.ok());
  Moments m = Sample(*c, 100000);
  EXPECT_EQ(m.lo, 16);  // the clamp is reached at both ends with this many samples
  EXPECT_EQ(m.hi, 512);
  EXPECT_EQ(c->min(), 16);
  EXPECT_EQ(c->max(), 512);
}

TEST(Distribution, FileIsTheEmpiricalDistribution) {
  const std::string path = ::testing::TempDir() + "/flashq_lengths.txt";
  {
    std::ofstream f(path);
    f << "# production trace\n100\n200 200\n\n300  # three\n";
  }
  auto d = IntDistribution::Parse("file:" + path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values(), (std::vector<int64_t>{100, 200, 200, 300}));
  EXPECT_EQ(d->min(), 100);
  EXPECT_EQ(d->max(), 300);
  std::mt19937_64 rng(3);
  std::map<int64_t, int> count;
  const int n = 100000;
  for (int i = 0; i < n; ++i) count[d->Sample(rng)]++;
  ASSERT_EQ(count.size(), 3u);
  EXPECT_NEAR(count[100] / double(n), 0.25, 0.01);
  EXPECT_NEAR(count[200] / double(n), 0.50, 0.01);
  EXPECT_NEAR(count[300] / double(n), 0.25, 0.01);
  std::remove(path.c_str());
}

TEST(Distribution, BadSpecsAreErrors) {
  for (const char* spec : {"", "uniform:5", "uniform:9:3", "lognormal:0:1", "lognormal:10:-1", "lognormal:10:1:50:20",
                           "gauss:1:2", "fixed:x", "file:/nonexistent/lengths"})
    EXPECT_FALSE(IntDistribution::Parse(spec).ok()) << spec;
  const std::string empty = ::testing::TempDir() + "/flashq_empty.txt";
  { std::ofstream f(empty); f << "# nothing\n"; }
  EXPECT_FALSE(IntDistribution::Parse("file:" + empty).ok());
  const std::string junk = ::testing::TempDir() + "/flashq_junk.txt";
  { std::ofstream f(junk); f << "12 abc\n"; }
  EXPECT_FALSE(IntDistribution::Parse("file:" + junk).ok());
}

}  // namespace
}  // namespace flashq::bench
