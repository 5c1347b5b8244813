// CPU tests (run in CI): checkpoint packers/loaders from the format definitions, the
// quantizers, and the CPU references against "dequantize, then float64 GEMM".
#include <gtest/gtest.h>

#include <algorithm>

#include "common/dtype.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_tiles.h"
#include "kernels/gemm/gemm_ref.h"
#include "kernels/gemm/quant_formats.h"
#include "tests/kernels/gemm/gemm_test_util.h"

namespace flashq::gemm {
namespace {

using testing::GemmF64;
using testing::RandomGIdx;
using testing::RandomVec;
using testing::RelErr;

void ExpectSameInt4(const Int4Weights& a, const Int4Weights& b) {
  ASSERT_EQ(a.K, b.K);
  ASSERT_EQ(a.N, b.N);
  ASSERT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zeros, b.zeros);
  EXPECT_EQ(a.g_idx, b.g_idx);
}

TEST(GemmFormats, GptqNibbleOrderFromDefinition) {
  Int4Weights w;
  w.K = 16; w.N = 8; w.group_size = 16;
  w.q.resize(16 * 8);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) w.q[n * 16 + k] = uint8_t((k + n) % 16);
  w.scales.assign(8, 0.5f);
  w.zeros.resize(8);
  for (int n = 0; n < 8; ++n) w.zeros[n] = float(n + 1);
  GptqTensors t = PackGptq(w, /*v1=*/false);
  // Row 0 of qweight, column 0: channels k = 0..7 low nibble first.
  EXPECT_EQ(uint32_t(t.qweight[0]), 0x76543210u);
  EXPECT_EQ(uint32_t(t.qweight[1 * 8 + 1]), 0x0FEDCBA9u);  // k=8..15 of column 1: 9..15, 0
  EXPECT_EQ(uint32_t(t.qzeros[0]), 0x87654321u);
  GptqTensors t1 = PackGptq(w, /*v1=*/true);
  EXPECT_EQ(uint32_t(t1.qzeros[0]), 0x76543210u);  // v1 stores zero - 1
  EXPECT_EQ(t.scales_f16[3], FloatToF16(0.5f));
}

TEST(GemmFormats, AwqInterleavedOrderFromDefinition) {
  Int4Weights w;
  w.K = 4; w.N = 8; w.group_size = 4;
  w.q.resize(4 * 8);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 4; ++k) w.q[n * 4 + k] = uint8_t(n);
  w.scales.assign(8, 1.0f);
  w.zeros.resize(8);
  for (int n = 0; n < 8; ++n) w.zeros[n] = float(7 - n);
  AwqTensors t = PackAwq(w);
  // Nibble i holds column {0,2,4,6,1,3,5,7}[i].
  EXPECT_EQ(uint32_t(t.qweight[0]), 0x75316420u);
  EXPECT_EQ(uint32_t(t.qzeros[0]), 0x02461357u);
  Int4Weights back;
  ASSERT_TRUE(UnpackAwq(t, &back).ok());
  ExpectSameInt4(w, back);
}

struct RoundTripCase { int K, N, g; bool sym; };

class GemmRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(GemmRoundTrip, GptqV2V1AwqActOrder) {
  auto c = GetParam();
  auto wf = RandomVec(size_t(c.N) * c.K, 11 + c.K);
  int g = c.g > 0 ? c.g : c.K;
  Int4Weights w = QuantizeInt4(wf.data(), c.N, c.K, g, c.sym);
  ASSERT_TRUE(w.Validate().ok());
  Int4Weights back;
  ASSERT_TRUE(UnpackGptq(PackGptq(w, false), &back).ok());
  ExpectSameInt4(w, back);
  ASSERT_TRUE(UnpackAwq(PackAwq(w), &back).ok());
  ExpectSameInt4(w, back);
  if (c.sym) {  // v1 cannot store a zero point of 0; symmetric weights (zero 8) round-trip
    ASSERT_TRUE(UnpackGptq(PackGptq(w, true), &back).ok());
    ExpectSameInt4(w, back);
  }
  if (g == c.K) return;  // channelwise has no act-order
  // Act-order: groups are a random permutation of channels.
  auto gi = RandomGIdx(c.K, g, 5);
  Int4Weights wa = QuantizeInt4(wf.data(), c.N, c.K, g, c.sym, gi.data());
  ASSERT_TRUE(wa.Validate().ok());
  ASSERT_TRUE(UnpackGptq(PackGptq(wa, false), &back).ok());
  ExpectSameInt4(wa, back);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmRoundTrip,
                         ::testing::Values(RoundTripCase{128, 64, 32, true}, RoundTripCase{256, 40, 64, false},
                                           RoundTripCase{200, 24, 128, true},  // K not a multiple of the group
                                           RoundTripCase{100, 16, 32, false},  // K not a multiple of 8
                                           RoundTripCase{96, 8, 0, false}));  // channelwise

TEST(GemmFormats, GptqV1ZeroOfZeroLoadsAs16) {
  Int4Weights w;
  w.K = 8; w.N = 8; w.group_size = 8;
  w.q.assign(64, 3);
  w.scales.assign(8, 1.0f);
  w.zeros.assign(8, 0.0f);
  Int4Weights back;
  ASSERT_TRUE(UnpackGptq(PackGptq(w, true), &back).ok());
  EXPECT_EQ(back.zeros[0], 16.0f);  // the v1 format's known limit, loaded as the format defines
}

TEST(GemmFormats, LoaderErrorsNameTheConstraint) {
  Int4Weights w = QuantizeInt4(RandomVec(12 * 64, 1).data(), 12, 64, 32, true);
  GptqTensors t = PackGptq(w, false);
  Int4Weights out;
  Status s = UnpackGptq(t, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 8"), std::string::npos) << s.message();
  Int4Weights w2 = QuantizeInt4(RandomVec(16 * 64, 1).data(), 16, 64, 32, true);
  GptqTensors t2 = PackGptq(w2, false);
  t2.qweight.pop_back();
  s = UnpackGptq(t2, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("qweight"), std::string::npos) << s.message();
  AwqTensors a = PackAwq(w2);
  a.scales_f16.resize(3);
  s = UnpackAwq(a, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("scales"), std::string::npos) << s.message();
  t2 = PackGptq(w2, false);
  t2.g_idx.assign(64, 0);  // 64 channels in one group of 32
  s = UnpackGptq(t2, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("group_size"), std::string::npos) << s.message();
}

TEST(GemmQuantizers, Int4RtnErrorWithinHalfStep) {
  const int N = 16, K = 200, g = 64;
  auto wf = RandomVec(size_t(N) * K, 3);
  for (bool sym : {true, false}) {
    Int4Weights w = QuantizeInt4(wf.data(), N, K, g, sym);
    auto d = DequantizeInt4(w);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        float s = w.scales[n * w.num_groups() + k / g];
        EXPECT_LE(std::fabs(d[n * K + k] - wf[n * K + k]), 0.5f * s * 1.01f + 1e-6f);
      }
  }
}

TEST(GemmQuantizers, Fp8RelativeError) {
  const int N = 8, K = 64;
  auto wf = RandomVec(size_t(N) * K, 4);
  for (bool pc : {true, false}) {
    Fp8Weights w = QuantizeFp8(wf.data(), N, K, pc);
    ASSERT_TRUE(w.Validate().ok());
    auto d = DequantizeFp8(w);
    for (size_t i = 0; i < d.size(); ++i) EXPECT_LE(std::fabs(d[i] - wf[i]), std::fabs(wf[i]) / 16 + w.scale_of(int(i / K)) * 0.002f);
  }
}

class GemmCpuRef : public ::testing::TestWithParam<int> {};

TEST_P(GemmCpuRef, Int4MatchesDequantizedF64) {
  const int M = GetParam(), K = 200, N = 72;
  auto x = RandomVec(size_t(M) * K, 7);
  auto wf = RandomVec(size_t(N) * K, 8);
  auto gi = RandomGIdx(K, 64, 9);
  for (const int32_t* gidx : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(gi.data())}) {
    Int4Weights w = QuantizeInt4(wf.data(), N, K, 64, false, gidx);
    auto ref = GemmF64(x, M, K, DequantizeInt4(w), N);
    std::vector<float> yf(size_t(M) * N, NAN), yd(size_t(M) * N, NAN);
    LinearRefInt4<float>(x.data(), M, w, yf.data());
    LinearRefInt4<double>(x.data(), M, w, yd.data());
    EXPECT_LT(RelErr(yd.data(), ref.data(), ref.size()), 1e-7);
    EXPECT_LT(RelErr(yf.data(), ref.data(), ref.size()), 1e-5);
  }
}

TEST_P(GemmCpuRef, Fp8AndBf16MatchF64) {
  const int M = GetParam(), K = 96, N = 40;
  auto x = RandomVec(size_t(M) * K, 17);
  auto wf = RandomVec(size_t(N) * K, 18);
  Fp8Weights w = QuantizeFp8(wf.data(), N, K, true);
  auto ref = GemmF64(x, M, K, DequantizeFp8(w), N);
  std::vector<float> y(size_t(M) * N, NAN);
  LinearRefFp8W8A16<double>(x.data(), M, w, y.data());
  EXPECT_LT(RelErr(y.data(), ref.data(), ref.size()), 1e-7);
  // W8A8: quantize x the documented way, dequantize, float64 GEMM.
  for (bool per_row : {true, false}) {
    std::vector<uint8_t> xq(size_t(M) * K);
    std::vector<float> xs(M), xd(size_t(M) * K);
    QuantizeActFp8(x.data(), M, K, per_row, xq.data(), xs.data());
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < K; ++k) xd[m * K + k] = Fp8E4M3ToFloat(xq[m * K + k]) * xs[m];
    auto ref8 = GemmF64(xd, M, K, DequantizeFp8(w), N);
    LinearRefFp8W8A8<double>(x.data(), M, w, per_row, y.data());
    EXPECT_LT(RelErr(y.data(), ref8.data(), ref8.size()), 1e-6);
    EXPECT_LT(RelErr(y.data(), ref.data(), ref.size()), 0.1);  // activation quantization error
  }
  std::vector<uint16_t> wb(size_t(N) * K);
  std::vector<float> wbf(size_t(N) * K);
  for (size_t i = 0; i < wb.size(); ++i) {
    wb[i] = FloatToBf16(wf[i]);
    wbf[i] = Bf16ToFloat(wb[i]);
  }
  auto refb = GemmF64(x, M, K, wbf, N);
  LinearRefBf16<float>(x.data(), M, K, wb.data(), N, y.data());
  EXPECT_LT(RelErr(y.data(), refb.data(), refb.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Rows, GemmCpuRef, ::testing::Values(1, 3, 17));

TEST(GemmCpuRef, LargeLayerThreadedMatchesSingleRow) {
  // Big enough to take the threaded path; row 0 alone must give the same bits.
  const int M = 4, K = 1024, N = 2048;
  auto x = RandomVec(size_t(M) * K, 21);
  Int4Weights w = QuantizeInt4(RandomVec(size_t(N) * K, 22).data(), N, K, 128, true);
  std::vector<float> y(size_t(M) * N), y1(N);
  LinearRefInt4<float>(x.data(), M, w, y.data());
  LinearRefInt4<float>(x.data(), 1, w, y1.data());
  for (int n = 0; n < N; ++n) ASSERT_EQ(y[n], y1[n]);
}

}  // namespace
}  // namespace flashq::gemm
