// CPU reference tests (no GPU; CI runs these): float accumulation against float64, closed-form
// cases, masking edge cases, paged == varlen, and the validation helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention/attention_ref.h"

namespace flashq::attention {
namespace {

std::vector<float> RandomVec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> Cu(const std::vector<int>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

struct RefCase {
  int hq, hkv, d;
  bool causal;
};

class VarlenRefTest : public ::testing::TestWithParam<RefCase> {};

TEST_P(VarlenRefTest, FloatMatchesDouble) {
  const RefCase c = GetParam();
  const std::vector<int> lq = {1, 17, 0, 40, 5}, lk = {1, 33, 3, 40, 2};
  auto cuq = Cu(lq), cuk = Cu(lk);
  const int tq = cuq.back(), tk = cuk.back();
  AttentionShape s{int(lq.size()), c.hq, c.hkv, c.d, 1.0f / std::sqrt(float(c.d)), c.causal};
  ASSERT_TRUE(CheckShape(s).ok());
  auto q = RandomVec(size_t(tq) * c.hq * c.d, 1), k = RandomVec(size_t(tk) * c.hkv * c.d, 2),
       v = RandomVec(size_t(tk) * c.hkv * c.d, 3);
  std::vector<float> o32(q.size(), NAN), o64(q.size(), NAN), l32(size_t(tq) * c.hq, NAN), l64(l32.size(), NAN);
  VarlenAttentionRef<float>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o32.data(), l32.data());
  VarlenAttentionRef<double>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o64.data(), l64.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < o32.size(); ++i) {
    ASSERT_FALSE(std::isnan(o32[i])) << i;
    num += (o32[i] - o64[i]) * double(o32[i] - o64[i]);
    den += double(o64[i]) * o64[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  for (size_t i = 0; i < l32.size(); ++i) {
    ASSERT_FALSE(std::isnan(l32[i])) << i;
    if (std::isinf(l64[i])) EXPECT_EQ(l32[i], l64[i]);
    else EXPECT_NEAR(l32[i], l64[i], 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, VarlenRefTest,
                         ::testing::Values(RefCase{2, 2, 16, false}, RefCase{4, 1, 32, true}, RefCase{8, 2, 64, true},
                                           RefCase{8, 1, 128, false}));

TEST(VarlenRef, SingleKeyReturnsItsValue) {
  const int d = 8;
  std::vector<int32_t> cuq = {0, 1}, cuk = {0, 1};
  auto q = RandomVec(d, 4), k = RandomVec(d, 5), v = RandomVec(d, 6);
  std::vector<float> o(d), lse(1);
  AttentionShape s{1, 1, 1, d, 0.5f, false};
  VarlenAttentionRef<double>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o.data(), lse.data());
  double dot = 0;
  for (int i = 0; i < d; ++i) dot += double(q[i]) * k[i];
  for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(o[i], v[i]);
  EXPECT_NEAR(lse[0], 0.5 * dot, 1e-5);
}

TEST(VarlenRef, UniformScoresAverageValues) {
  // q = 0 gives equal weights: o is the mean of the visible values, lse = log(#visible).
  const int d = 4, lk = 5, lq = 3;
  std::vector<int32_t> cuq = {0, lq}, cuk = {0, lk};
  std::vector<float> q(size_t(lq) * d, 0.0f);
  auto k = RandomVec(size_t(lk) * d, 7), v = RandomVec(size_t(lk) * d, 8);
  std::vector<float> o(q.size()), lse(lq);
  AttentionShape s{1, 1, 1, d, 1.0f, true};
  VarlenAttentionRef<double>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o.data(), lse.data());
  for (int i = 0; i < lq; ++i) {
    const int visible = i + lk - lq + 1;  // bottom-right aligned causal
    EXPECT_NEAR(lse[i], std::log(double(visible)), 1e-6);
    for (int c = 0; c < d; ++c) {
      double mean = 0;
      for (int j = 0; j < visible; ++j) mean += v[size_t(j) * d + c];
      EXPECT_NEAR(o[size_t(i) * d + c], mean / visible, 1e-6);
    }
  }
}

TEST(VarlenRef, CausalRowWithNoKeyIsZeroAndMinusInf) {
  // lq = 4 > lk = 2: rows 0 and 1 see no key under bottom-right alignment.
  const int d = 8, lq = 4, lk = 2;
  std::vector<int32_t> cuq = {0, lq}, cuk = {0, lk};
  auto q = RandomVec(size_t(lq) * d, 9), k = RandomVec(size_t(lk) * d, 10), v = RandomVec(size_t(lk) * d, 11);
  std::vector<float> o(q.size(), NAN), lse(lq, NAN);
  AttentionShape s{1, 1, 1, d, 0.3f, true};
  VarlenAttentionRef<float>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o.data(), lse.data());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity());
    for (int c = 0; c < d; ++c) EXPECT_EQ(o[size_t(i) * d + c], 0.0f);
  }
  for (int c = 0; c < d; ++c) EXPECT_FLOAT_EQ(o[size_t(2) * d + c], v[c]);  // row 2 sees key 0 only
  EXPECT_TRUE(std::isfinite(lse[3]));
}

TEST(PagedRef, MatchesVarlenOnShuffledPages) {
  const int hq = 8, hkv = 2, d = 32, page = 16, max_blocks = 8;
  const std::vector<int> lk = {1, 50, 128, 0}, lq = {1, 3, 7, 0};
  const int batch = int(lk.size());
  auto cuq = Cu(lq), cuk = Cu(lk);
  const int tq = cuq.back(), tk = cuk.back();
  auto q = RandomVec(size_t(tq) * hq * d, 12), k = RandomVec(size_t(tk) * hkv * d, 13),
       v = RandomVec(size_t(tk) * hkv * d, 14);
  const int num_blocks = batch * max_blocks;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(15));
  std::vector<int32_t> table(perm.begin(), perm.end());
  auto kc = RandomVec(size_t(num_blocks) * page * hkv * d, 16), vc = RandomVec(kc.size(), 17);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < lk[b]; ++j)
      for (int h = 0; h < hkv; ++h)
        for (int c = 0; c < d; ++c) {
          const int64_t dst = ((int64_t(table[b * max_blocks + j / page]) * page + j % page) * hkv + h) * d + c;
          const int64_t src = ((int64_t(cuk[b]) + j) * hkv + h) * d + c;
          kc[size_t(dst)] = k[size_t(src)];
          vc[size_t(dst)] = v[size_t(src)];
        }
  AttentionShape s{batch, hq, hkv, d, 0.2f, true};
  ASSERT_TRUE(CheckPaged(table.data(), max_blocks, page, num_blocks, lk.data(), cuq.data(), batch).ok());
  std::vector<float> o1(q.size()), o2(q.size()), l1(size_t(tq) * hq), l2(l1.size());
  PagedAttentionRef<double>(q.data(), kc.data(), vc.data(), table.data(), max_blocks, page, lk.data(), cuq.data(), s,
                            o1.data(), l1.data());
  VarlenAttentionRef<double>(q.data(), k.data(), v.data(), cuq.data(), cuk.data(), s, o2.data(), l2.data());
  for (size_t i = 0; i < o1.size(); ++i) ASSERT_EQ(o1[i], o2[i]) << i;
  for (size_t i = 0; i < l1.size(); ++i) ASSERT_EQ(l1[i], l2[i]) << i;
}

TEST(AttentionChecks, RejectBadInput) {
  EXPECT_FALSE(CheckShape({1, 6, 4, 64, 0.1f, false}).ok());
  EXPECT_FALSE(CheckShape({1, 8, 2, 64, NAN, false}).ok());
  EXPECT_TRUE(CheckShape({0, 8, 2, 64, 0.1f, true}).ok());
  std::vector<int32_t> table = {0, 5}, lk = {20}, cuq = {0, 1};
  EXPECT_FALSE(CheckPaged(table.data(), 2, 16, 4, lk.data(), cuq.data(), 1).ok());  // block 5 >= 4
  EXPECT_TRUE(CheckPaged(table.data(), 2, 16, 6, lk.data(), cuq.data(), 1).ok());
}

}  // namespace
}  // namespace flashq::attention
