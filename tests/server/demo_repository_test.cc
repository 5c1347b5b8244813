#include "server/repository/demo_repository.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "common/dtype.h"
#include "kernels/gemm/quant_formats.h"
#include "server/repository/checkpoint.h"
#include "server/repository/model_repository.h"
#include "server/repository/quant_metadata.h"
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

// The shard of a demo checkpoint that holds layer 0's `proj` (up_proj: shard 1, down_proj: 2).
std::unique_ptr<SafetensorsFile> Shard(const std::string& root, const std::string& checkpoint, const std::string& proj) {
  auto f = SafetensorsFile::Open(root + "/checkpoints/" + checkpoint + "/model-0000" + (proj == "up_proj" ? "1" : "2") +
                                 "-of-00002.safetensors");
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

std::string Prefix(const std::string& proj) { return "model.layers.0.mlp." + proj + "."; }

void CheckLayoutAndConfigs(const std::string& root) {
  EXPECT_EQ(fs::path(root).filename(), "demo-v3-20261122");
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
    // Every linear model names its checkpoint folder and tensor prefix; the format is the
    // checkpoint's own metadata, so no format parameter is set.
    for (const auto& [fmt, ckpt] : {std::pair{"int4", "llama-3-8b-gptq"}, std::pair{"fp8", "llama-3-8b-fp8"},
                                    std::pair{"bf16", "llama-3-8b"}}) {
      const auto& c = by_name[std::string(prefix) + "_" + fmt];
      EXPECT_EQ(ConfigParam(c, "checkpoint", ""), std::string("../checkpoints/") + ckpt);
      EXPECT_EQ(ConfigParam(c, "tensor", ""), std::string("model.layers.0.mlp.") + prefix);
      for (const char* p : {"weight_format", "group_size", "gptq_version", "fp8_activation"})
        EXPECT_EQ(ConfigParam(c, p, "unset"), "unset") << p;
    }
  }
  // The checkpoints' metadata says what the formats are.
  auto gptq = ReadQuantMetadata(root + "/checkpoints/llama-3-8b-gptq");
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(gptq->quant_method, "gptq");
  EXPECT_EQ(gptq->bits, 4);
  EXPECT_EQ(*gptq->group_size, 128);
  EXPECT_FALSE(*gptq->sym);
  EXPECT_FALSE(*gptq->desc_act);
  EXPECT_EQ(gptq->checkpoint_format, "gptq_v2");
  EXPECT_TRUE(fs::exists(fs::path(root) / "checkpoints/llama-3-8b-gptq/quantize_config.json"));
  auto fp8 = ReadQuantMetadata(root + "/checkpoints/llama-3-8b-fp8");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->quant_method, "compressed-tensors");
  ASSERT_NE(FindCtGroup(*fp8, "model.layers.0.mlp.up_proj"), nullptr);
  EXPECT_FALSE(FindCtGroup(*fp8, "model.layers.0.mlp.up_proj")->input_activations.has_value());
  EXPECT_TRUE(ReadQuantMetadata(root + "/checkpoints/llama-3-8b")->empty());
  // Each index names both shards, and each shard holds what the index says.
  CheckpointCache cache;
  for (const char* ckpt : {"llama-3-8b", "llama-3-8b-gptq", "llama-3-8b-fp8"}) {
    auto c = cache.Open(root + "/checkpoints/" + ckpt);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->files().size(), 2u) << ckpt;
    for (const char* proj : {"up_proj", "down_proj"}) {
      auto t = (*c)->Get(Prefix(proj) + (std::string(ckpt) == "llama-3-8b-gptq" ? "qweight" : "weight"));
      EXPECT_TRUE(t.ok()) << t.status();
    }
  }
}

void CheckTensorDtypesAndShapes(const std::string& root) {
  for (const auto& [proj_c, K, N] : {std::tuple{"up_proj", 4096, 14336}, std::tuple{"down_proj", 14336, 4096}}) {
    const std::string proj = proj_c, p = Prefix(proj);
    auto bf16 = Shard(root, "llama-3-8b", proj);
    ASSERT_TRUE(bf16);
    auto w = bf16->Get(p + "weight", "BF16");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->shape, (std::vector<int64_t>{N, K}));

    auto i4 = Shard(root, "llama-3-8b-gptq", proj);
    ASSERT_TRUE(i4);
    const int64_t G = K / 128;
    auto qw = i4->Get(p + "qweight", "I32");
    auto qz = i4->Get(p + "qzeros", "I32");
    auto sc = i4->Get(p + "scales", "F16");
    auto gi = i4->Get(p + "g_idx", "I32");
    ASSERT_TRUE(qw.ok() && qz.ok() && sc.ok() && gi.ok());
    EXPECT_EQ(qw->shape, (std::vector<int64_t>{K / 8, N}));
    EXPECT_EQ(qz->shape, (std::vector<int64_t>{G, N / 8}));
    EXPECT_EQ(sc->shape, (std::vector<int64_t>{G, N}));
    EXPECT_EQ(gi->shape, (std::vector<int64_t>{K}));

    auto f8 = Shard(root, "llama-3-8b-fp8", proj);
    ASSERT_TRUE(f8);
    auto fw = f8->Get(p + "weight", "F8_E4M3");
    auto fs_ = f8->Get(p + "weight_scale", "F32");
    ASSERT_TRUE(fw.ok() && fs_.ok());
    EXPECT_EQ(fw->shape, (std::vector<int64_t>{N, K}));
    EXPECT_EQ(fs_->shape, (std::vector<int64_t>{N, 1}));
  }
}

// The three formats of a layer approximate the same N(0, 1/K) matrix.
void CheckFormatsAgreeAndWeightsAreNormal(const std::string& root) {
  const int K = 4096, N = 14336;
  auto bf16_file = Shard(root, "llama-3-8b", "up_proj");
  auto i4_file = Shard(root, "llama-3-8b-gptq", "up_proj");
  auto f8_file = Shard(root, "llama-3-8b-fp8", "up_proj");
  ASSERT_TRUE(bf16_file && i4_file && f8_file);
  const std::string p = Prefix("up_proj");
  const SafeTensor w = *bf16_file->Get(p + "weight", "BF16");

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
  g.qweight = Copy<int32_t>(*i4_file->Get(p + "qweight", "I32"));
  g.qzeros = Copy<int32_t>(*i4_file->Get(p + "qzeros", "I32"));
  g.scales_f16 = Copy<uint16_t>(*i4_file->Get(p + "scales", "F16"));
  gemm::Int4Weights q;
  Status s = gemm::UnpackGptq(g, &q);
  ASSERT_TRUE(s.ok()) << s.message();
  const int G = q.num_groups();
  ASSERT_EQ(G, K / 128);

  const SafeTensor fw = *f8_file->Get(p + "weight", "F8_E4M3");
  const std::vector<float> fscale = Copy<float>(*f8_file->Get(p + "weight_scale", "F32"));
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
  auto bf16_file = Shard(root, "llama-3-8b", "down_proj");
  ASSERT_TRUE(bf16_file);
  const SafeTensor w = *bf16_file->Get(Prefix("down_proj") + "weight", "BF16");
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
  const fs::path weights = fs::path(root) / "checkpoints/llama-3-8b/model-00001-of-00002.safetensors";
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
