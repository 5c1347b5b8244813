// CreateModel refuses, at load and with a message naming the file, the tensor or the
// parameter, the configs and weights that would otherwise load and then crash or
// allocate without bound on the first request.
#include "server/models/model_factory.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "kernels/gemm/quant_formats.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

std::string Param(const std::string& k, const std::string& v) {
  return "parameters { key: \"" + k + "\" value: { string_value: \"" + v + "\" } }\n";
}

class ModelFactoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flashq-factory-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    BackendOptions o;
    o.cpu_threads = 1;
    backend_ = std::make_unique<CpuBackend>(o);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& text) {
    ModelEntry e;
    e.dir = dir_.string();
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &e.config)) << text;
    return CreateModel(e, *backend_, {});
  }

  void ExpectRefused(const std::string& text, const std::vector<std::string>& words, const std::string& what) {
    SCOPED_TRACE(what);
    auto m = Load(text);
    ASSERT_FALSE(m.ok()) << "loaded";
    EXPECT_TRUE(Has(m.status(), dir_.string() + "/config.pbtxt")) << m.status();
    for (const auto& w : words) EXPECT_TRUE(Has(m.status(), w)) << "lacks '" << w << "': " << m.status();
  }

  fs::path dir_;
  std::unique_ptr<CpuBackend> backend_;
};

const char* kAttentionIo =
    "output [ { name: \"O\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]\n";

TEST_F(ModelFactoryTest, AttentionWithOptionalQIsRefused) {
  ExpectRefused("name: \"a\" input [ { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] optional: true },\n"
                "{ name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]\n" +
                    std::string(kAttentionIo) + Param("kind", "attention"),
                {"input 'Q' is marked optional", "always needs it"}, "optional Q");
}

TEST_F(ModelFactoryTest, AttentionWithInputsAKVIsRefused) {
  ExpectRefused("name: \"a\" input [ { name: \"A\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]\n" +
                    std::string(kAttentionIo) + Param("kind", "attention"),
                {"no input 'A'", "Q, K, V, CU_SEQLENS_Q, CU_SEQLENS_K"}, "A, K, V");
}

TEST_F(ModelFactoryTest, LinearWithInputZIsRefused) {
  ExpectRefused("name: \"l\" input [ { name: \"Z\" data_type: TYPE_FP16 dims: [ -1, 16 ] } ]\n"
                "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, 8 ] } ]\n" +
                    Param("kind", "linear"),
                {"no input 'Z'", "its inputs are X"}, "Z for X");
}

TEST_F(ModelFactoryTest, WrongTensorTypesAreRefused) {
  ExpectRefused("name: \"a\" input [ { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
                "{ name: \"CU_SEQLENS_Q\" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]\n" +
                    std::string(kAttentionIo) + Param("kind", "attention"),
                {"'CU_SEQLENS_Q' has data_type TYPE_FP32", "TYPE_INT32"}, "float cu_seqlens");
  ExpectRefused("name: \"kv\" input [ { name: \"Q\" data_type: TYPE_FP32 dims: [ -1, 4, 64 ] },\n"
                "{ name: \"K\" data_type: TYPE_FP16 dims: [ -1, 2, 64 ] },\n"
                "{ name: \"V\" data_type: TYPE_FP16 dims: [ -1, 2, 64 ] } ]\n" +
                    std::string(kAttentionIo) + Param("kind", "kv_attention"),
                {"'Q' has data_type TYPE_FP32", "TYPE_FP16, TYPE_BF16"}, "kv FP32");
}

// GPTQ weights with act-order, one g_idx entry set to `bad` if given.
class GptqLoadTest : public ModelFactoryTest {
 protected:
  std::string WriteGptq(std::optional<int32_t> bad) {
    constexpr int K = 64, N = 16, G = 32;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    std::vector<float> w(N * K);
    for (float& x : w) x = nd(rng);
    std::vector<int32_t> g_idx(K);
    for (int k = 0; k < K; ++k) g_idx[k] = (k * 7 % K) / G;
    auto q = gemm::QuantizeInt4(w.data(), N, K, G, /*symmetric=*/true, g_idx.data());
    auto t = gemm::PackGptq(q, /*v1=*/true);
    if (bad) t.g_idx[3] = *bad;
    auto bytes = [](const auto& v) {
      return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
    };
    EXPECT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                                 {{"qweight", "I32", {(K + 7) / 8, N}, bytes(t.qweight)},
                                  {"qzeros", "I32", {K / G, N / 8}, bytes(t.qzeros)},
                                  {"scales", "F16", {K / G, N}, bytes(t.scales_f16)},
                                  {"g_idx", "I32", {K}, bytes(t.g_idx)}})
                    .ok());
    return "name: \"l\" input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, 64 ] } ]\n"
           "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, 16 ] } ]\n" +
           Param("kind", "linear") + Param("weight_format", "gptq") + Param("group_size", "32");
  }
};

TEST_F(GptqLoadTest, GoodGIdxLoads) {
  auto m = Load(WriteGptq(std::nullopt));
  EXPECT_TRUE(m.ok()) << m.status();
}

TEST_F(GptqLoadTest, GIdxOutsideTheGroupsIsRefusedBeforeAllocating) {
  for (int32_t bad : {std::numeric_limits<int32_t>::max(), 250000000, 2, -1}) {
    ExpectRefused(WriteGptq(bad), {"g_idx entry " + std::to_string(bad), "outside 0..1"}, std::to_string(bad));
  }
}

TEST_F(ModelFactoryTest, Fp8ScaleThatIsNotFiniteIsRefused) {
  constexpr int K = 32, N = 16;
  std::string w(N * K, '\x38');  // E4M3 1.0
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), 0.0f}) {
    std::vector<float> scale(N, 0.5f);
    scale[5] = bad;
    ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                                 {{"weight", "F8_E4M3", {N, K}, w},
                                  {"weight_scale", "F32", {N},
                                   std::string_view(reinterpret_cast<const char*>(scale.data()), N * 4)}})
                    .ok());
    ExpectRefused("name: \"l\" input [ { name: \"X\" data_type: TYPE_BF16 dims: [ -1, 32 ] } ]\n"
                  "output [ { name: \"Y\" data_type: TYPE_BF16 dims: [ -1, 16 ] } ]\n" +
                      Param("kind", "linear") + Param("weight_format", "fp8"),
                  {"'weight_scale'", "element 5", "finite and > 0"}, std::to_string(bad));
  }
}

}  // namespace
}  // namespace flashq::server
