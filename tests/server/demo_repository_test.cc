#include "server/repository/demo_repository.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "kernels/common/dtype.h"
#include "kernels/gemm/quant_formats.h"
#include "server/repository/model_repository.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::vector<T> Copy(const SafeTensor& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

uint16_t Bf16At(const SafeTensor& t, size_t i) {
  uint16_t v;
  std::memcpy(&v, t.data.data() + 2 * i, 2);
  return v;
}

std::unique_ptr<SafetensorsFile> Weights(const std::string& root, const std::string& model) {
  auto f = SafetensorsFile::Open(root + "/" + model + "/model.safetensors");
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

void CheckLayoutAndConfigs(const std::string& root) {
  EXPECT_EQ(fs::path(root).filename(), "demo-v2-20261122");
  EXPECT_TRUE(fs::exists(fs::path(root) / "STAMP"));

  auto models = ScanModelRepository(root);
  ASSERT_TRUE(models.ok()) << models.status();
  std::map<std::string, inference::ModelConfig> by_name;
  for (const auto& m : *models) by_name[m.config.name()] = m.config;
  const std::vector<std::string> expected = {"attention",     "down_proj_bf16", "down_proj_fp8",
                                             "down_proj_int4", "kv_attention",   "up_proj_bf16",
                                             "up_proj_fp8",   "up_proj_int4"};
  std::vector<std::string> names;
  for (const auto& [n, c] : by_name) names.push_back(n);
  EXPECT_EQ(names, expected);

  const auto& att = by_name["attention"];
  EXPECT_EQ(ConfigParam(att, "kind", ""), "attention");
  EXPECT_EQ(att.max_batch_size(), 0);
  ASSERT_EQ(att.input_size(), 5);
  EXPECT_EQ(att.input(0).name(), "Q");
  EXPECT_EQ(att.input(0).data_type(), inference::TYPE_FP16);
  EXPECT_EQ(att.input(0).dims_size(), 3);
  EXPECT_EQ(att.input(3).name(), "CU_SEQLENS_Q");
  EXPECT_EQ(att.input(3).data_type(), inference::TYPE_INT32);
  EXPECT_TRUE(att.input(3).optional());
  EXPECT_TRUE(att.input(4).optional());
  ASSERT_EQ(att.output_size(), 2);
  EXPECT_EQ(att.output(1).name(), "LSE");
  EXPECT_EQ(att.output(1).data_type(), inference::TYPE_FP32);
  EXPECT_EQ(att.dynamic_batching().max_queue_delay_microseconds(), 0u);
  EXPECT_EQ(att.dynamic_batching().default_queue_policy().max_queue_size(), 1024u);
  EXPECT_EQ(*ConfigIntParam(att, "max_batch_tokens", 0), 16384);

  const auto& kv = by_name["kv_attention"];
  EXPECT_EQ(ConfigParam(kv, "kind", ""), "kv_attention");
  EXPECT_TRUE(kv.has_sequence_batching());
  EXPECT_FALSE(kv.has_dynamic_batching());
  EXPECT_EQ(kv.sequence_batching().max_sequence_idle_microseconds(), 600000000u);
  EXPECT_EQ(kv.input(0).dims(1), 32);
  EXPECT_EQ(kv.input(1).dims(1), 8);
  EXPECT_EQ(kv.output(0).dims(2), 128);
  const std::map<std::string, int64_t> kv_params = {
      {"num_heads_q", 32},   {"num_heads_kv", 8},       {"head_dim", 128},
      {"page_size", 16},     {"num_blocks", 512},       {"max_tokens_per_sequence", 8192},
      {"session_idle_timeout_s", 600}, {"max_queue_delay_us", 0}, {"max_queue_size", 1024}};
  for (const auto& [key, value] : kv_params) EXPECT_EQ(*ConfigIntParam(kv, key, -1), value) << key;

  for (const char* prefix : {"up_proj", "down_proj"}) {
    const int K = std::string(prefix) == "up_proj" ? 4096 : 14336;
    const int N = std::string(prefix) == "up_proj" ? 14336 : 4096;
    for (const char* fmt : {"bf16", "int4", "fp8"}) {
      const auto& c = by_name[std::string(prefix) + "_" + fmt];
      EXPECT_EQ(ConfigParam(c, "kind", ""), "linear");
      EXPECT_EQ(*ConfigIntParam(c, "max_batch_tokens", 0), 4096);
      ASSERT_EQ(c.input_size(), 1);
      EXPECT_EQ(c.input(0).name(), "X");
      EXPECT_EQ(c.input(0).dims(0), -1);
      EXPECT_EQ(c.input(0).dims(1), K);
      EXPECT_EQ(c.output(0).name(), "Y");
      EXPECT_EQ(c.output(0).dims(1), N);
      EXPECT_EQ(c.output(0).data_type(), inference::TYPE_FP16);
    }
    const auto& i4 = by_name[std::string(prefix) + "_int4"];
    EXPECT_EQ(ConfigParam(i4, "weight_format", ""), "gptq");
    EXPECT_EQ(ConfigParam(i4, "group_size", ""), "128");
    EXPECT_EQ(ConfigParam(i4, "symmetric", ""), "false");
    EXPECT_EQ(ConfigParam(i4, "gptq_version", ""), "2");
    const auto& f8 = by_name[std::string(prefix) + "_fp8"];
    EXPECT_EQ(ConfigParam(f8, "weight_format", ""), "fp8");
    EXPECT_EQ(ConfigParam(f8, "fp8_activation", ""), "bf16");
    EXPECT_EQ(ConfigParam(by_name[std::string(prefix) + "_bf16"], "weight_format", ""), "bf16");
  }
}

void CheckTensorDtypesAndShapes(const std::string& root) {
  for (const auto& [prefix, K, N] : {std::tuple{"up_proj", 4096, 14336}, std::tuple{"down_proj", 14336, 4096}}) {
    const std::string p = prefix;
    auto bf16 = Weights(root, p + "_bf16");
    ASSERT_TRUE(bf16);
    auto w = bf16->Get("weight", "BF16");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->shape, (std::vector<int64_t>{N, K}));

    auto i4 = Weights(root, p + "_int4");
    ASSERT_TRUE(i4);
    const int64_t G = K / 128;
    auto qw = i4->Get("qweight", "I32");
    auto qz = i4->Get("qzeros", "I32");
    auto sc = i4->Get("scales", "F16");
    ASSERT_TRUE(qw.ok() && qz.ok() && sc.ok());
    EXPECT_EQ(qw->shape, (std::vector<int64_t>{K / 8, N}));
    EXPECT_EQ(qz->shape, (std::vector<int64_t>{G, N / 8}));
    EXPECT_EQ(sc->shape, (std::vector<int64_t>{G, N}));

    auto f8 = Weights(root, p + "_fp8");
    ASSERT_TRUE(f8);
    auto fw = f8->Get("weight", "F8_E4M3");
    auto fs_ = f8->Get("weight_scale", "F32");
    ASSERT_TRUE(fw.ok() && fs_.ok());
    EXPECT_EQ(fw->shape, (std::vector<int64_t>{N, K}));
    EXPECT_EQ(fs_->shape, (std::vector<int64_t>{N}));
  }
}

// The three formats of a layer approximate the same N(0, 1/K) matrix.
void CheckFormatsAgreeAndWeightsAreNormal(const std::string& root) {
  const int K = 4096, N = 14336;
  auto bf16_file = Weights(root, "up_proj_bf16");
  auto i4_file = Weights(root, "up_proj_int4");
  auto f8_file = Weights(root, "up_proj_fp8");
  ASSERT_TRUE(bf16_file && i4_file && f8_file);
  const SafeTensor w = *bf16_file->Get("weight", "BF16");

  // Moments over the first 64 rows (262144 samples): std within 1% of 1/sqrt(K).
  double sum = 0, sum2 = 0;
  const size_t count = size_t(64) * K;
  for (size_t i = 0; i < count; ++i) {
    double v = Bf16ToFloat(Bf16At(w, i));
    sum += v;
    sum2 += v * v;
  }
  const double mean = sum / count, stddev = std::sqrt(sum2 / count - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5e-4);
  EXPECT_NEAR(stddev * std::sqrt(double(K)), 1.0, 0.01);

  // GPTQ v2 unpacks and dequantizes to within a quantization step (half a step, except where
  // the group's extremes clamp at 0 or 15), plus bf16 rounding of the reference.
  gemm::GptqTensors g;
  g.K = K;
  g.N = N;
  g.group_size = 128;
  g.v1 = false;
  g.qweight = Copy<int32_t>(*i4_file->Get("qweight", "I32"));
  g.qzeros = Copy<int32_t>(*i4_file->Get("qzeros", "I32"));
  g.scales_f16 = Copy<uint16_t>(*i4_file->Get("scales", "F16"));
  gemm::Int4Weights q;
  Status s = gemm::UnpackGptq(g, &q);
  ASSERT_TRUE(s.ok()) << s.message();
  const int G = q.num_groups();
  ASSERT_EQ(G, K / 128);

  const SafeTensor fw = *f8_file->Get("weight", "F8_E4M3");
  const std::vector<float> fscale = Copy<float>(*f8_file->Get("weight_scale", "F32"));
  for (int n : {0, 1, 777, N - 1}) {
    float amax = 0;
    for (int k = 0; k < K; ++k) {
      const float ref = Bf16ToFloat(Bf16At(w, size_t(n) * K + k));
      amax = std::max(amax, std::fabs(ref));
      const int grp = k / 128;
      const float scale = q.scales[size_t(n) * G + grp];
      const float deq = (float(q.q[size_t(n) * K + k]) - q.zeros[size_t(n) * G + grp]) * scale;
      ASSERT_LE(std::fabs(deq - ref), 1.01f * scale + std::fabs(ref) * 0x1p-8f) << "n=" << n << " k=" << k;
      const float f8 = Fp8E4M3ToFloat(uint8_t(fw.data[size_t(n) * K + k])) * fscale[n];
      ASSERT_LE(std::fabs(f8 - ref), std::fabs(ref) * (0x1p-4f + 0x1p-8f) + fscale[n] * 0x1p-9f)
          << "n=" << n << " k=" << k;
    }
    EXPECT_NEAR(fscale[n] * 448.0f, amax, amax * 0x1p-7f) << "per-channel scale is amax/448, n=" << n;
  }
}

// Fixed seed -> fixed bits, on every machine: these values were recorded once.
void CheckWeightsAreDeterministic(const std::string& root) {
  auto bf16_file = Weights(root, "down_proj_bf16");
  ASSERT_TRUE(bf16_file);
  const SafeTensor w = *bf16_file->Get("weight", "BF16");
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the first two rows
  for (size_t i = 0; i < 2 * 14336 * 2; ++i) h = (h ^ uint8_t(w.data[i])) * 1099511628211ull;

  EXPECT_EQ(h, 0x95fe1de372ca1d40ull);
  EXPECT_EQ(Bf16At(w, 0), 0xbc68);
  EXPECT_EQ(Bf16At(w, 1), 0xbc79);
}

// One test, so that ctest (one process per test) generates the repository only once.
TEST(DemoRepositoryTest, GeneratesValidatesAndReuses) {
  const fs::path cache = fs::temp_directory_path() / ("fq_demo_" + std::to_string(getpid()));
  fs::remove_all(cache);
  const auto t0 = std::chrono::steady_clock::now();
  auto path = EnsureDemoRepository(cache.string(), 20261122);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(path.ok()) << path.status();
  std::printf("demo repository generated in %.2f s\n", seconds);
  const std::string root = *path;
  EXPECT_EQ(fs::path(root).parent_path(), cache);
  // Nothing left behind but the repository itself.
  EXPECT_EQ(std::distance(fs::directory_iterator(cache), fs::directory_iterator{}), 1);

  {
    SCOPED_TRACE("layout and configs");
    CheckLayoutAndConfigs(root);
  }
  {
    SCOPED_TRACE("tensor dtypes and shapes");
    CheckTensorDtypesAndShapes(root);
  }
  {
    SCOPED_TRACE("formats agree");
    CheckFormatsAgreeAndWeightsAreNormal(root);
  }
  {
    SCOPED_TRACE("deterministic bits");
    CheckWeightsAreDeterministic(root);
  }

  // A second call finds the stamp and returns at once without rewriting anything.
  const fs::path weights = fs::path(root) / "up_proj_bf16" / "model.safetensors";
  const auto mtime = fs::last_write_time(weights);
  const auto t1 = std::chrono::steady_clock::now();
  auto again = EnsureDemoRepository(cache.string(), 20261122);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, root);
  EXPECT_LT(dt, 0.5);
  EXPECT_EQ(fs::last_write_time(weights), mtime);
  fs::remove_all(cache);
}

}  // namespace
}  // namespace flashq::server
