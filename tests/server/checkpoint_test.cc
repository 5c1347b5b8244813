// Checkpoint folders (index resolution, one mapping per file, lying indexes and headers),
// quantization metadata, every refusal of the linear loader (each message names the
// tensor or the field and the constraint), and parallel model loading.
#include "server/repository/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "kernels/gemm/quant_formats.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/inference_server.h"
#include "server/metrics/metrics.h"
#include "server/models/model_factory.h"
#include "server/repository/json.h"
#include "server/repository/quant_metadata.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

template <typename T>
std::string_view Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

void WriteText(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string Param(const std::string& k, const std::string& v) {
  return "parameters { key: \"" + k + "\" value: { string_value: \"" + v + "\" } }\n";
}

// ---- JSON ---------------------------------------------------------------------------------

TEST(JsonTest, FullJsonAndTheHeaderDialect) {
  auto v = ParseJson(R"({"a": true, "b": null, "c": -1, "d": 0.01, "e": [1e3, "x"], "f": {"g": false}})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->Find("a")->as_bool());
  EXPECT_TRUE(v->Find("b")->is_null());
  EXPECT_EQ(v->Find("c")->as_int(), -1);
  EXPECT_DOUBLE_EQ(v->Find("d")->as_number(), 0.01);
  EXPECT_DOUBLE_EQ(v->Find("e")->as_array()[0].as_number(), 1000.0);
  EXPECT_FALSE(v->Find("f")->Find("g")->as_bool());
  EXPECT_EQ(v->Find("zz"), nullptr);
  for (const char* bad : {"{\"a\": tru}", "[1,]", "{\"a\" 1}", "01", "1.", "\"x", "{} {}"})
    EXPECT_FALSE(ParseJson(bad).ok()) << bad;
  EXPECT_TRUE(Has(ParseJson("[true]", JsonDialect::kSafetensorsHeader).status(), "unexpected character"));
  EXPECT_TRUE(Has(ParseJson("[-1]", JsonDialect::kSafetensorsHeader).status(), "negative"));
}

// ---- checkpoint folders -----------------------------------------------------------------

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fq_ckpt_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointTest, ShardsResolveThroughTheIndexAndMapOnce) {
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  fs::create_directories(dir_ / "ck");
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/model-00001-of-00002.safetensors").string(), {{"x.a", "F32", {2}, Bytes(a)}}).ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/model-00002-of-00002.safetensors").string(), {{"x.b", "F32", {3}, Bytes(b)}}).ok());
  WriteText(dir_ / "ck/model.safetensors.index.json",
            R"({"metadata": {"total_size": 20}, "weight_map": {"x.a": "model-00001-of-00002.safetensors",
               "x.b": "model-00002-of-00002.safetensors"}})");
  CheckpointCache cache;
  auto c = cache.Open((dir_ / "ck").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->quant().empty());
  EXPECT_EQ(cache.files_mapped(), 0) << "shards map on first use";
  for (int i = 0; i < 3; ++i) {
    auto ta = (*c)->Get("x.a");
    auto tb = (*c)->Get("x.b");
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_EQ(std::memcmp(ta->data.data(), a.data(), 8), 0);
    EXPECT_EQ(tb->shape, (std::vector<int64_t>{3}));
  }
  EXPECT_EQ(cache.files_mapped(), 2);
  // The same folder under another spelling is the same checkpoint.
  auto again = cache.Open((dir_ / "ck" / "." ).string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), c->get());
  EXPECT_EQ(*(*c)->Has("x.b"), true);
  EXPECT_EQ(*(*c)->Has("x.c"), false);
  auto missing = (*c)->Get("x.c");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Has(missing.status(), "'x.c'")) << missing.status();
}

TEST_F(CheckpointTest, AnIndexThatLiesIsRefused) {
  const std::vector<float> a = {1, 2};
  fs::create_directories(dir_ / "ck");
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/one.safetensors").string(), {{"x.a", "F32", {2}, Bytes(a)}}).ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/two.safetensors").string(), {{"x.b", "F32", {2}, Bytes(a)}}).ok());
  WriteText(dir_ / "ck/model.safetensors.index.json", R"({"weight_map": {"x.a": "two.safetensors"}})");
  CheckpointCache cache;
  auto c = cache.Open((dir_ / "ck").string());
  ASSERT_TRUE(c.ok()) << c.status();
  auto t = (*c)->Get("x.a");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(t.status(), "places tensor 'x.a' in")) << t.status();
  EXPECT_TRUE(Has(t.status(), "two.safetensors")) << t.status();

  WriteText(dir_ / "ck/model.safetensors.index.json", R"({"weight_map": {"x.a": "../outside.safetensors"}})");
  CheckpointCache cache2;
  auto escape = cache2.Open((dir_ / "ck").string());
  EXPECT_TRUE(Has(escape.status(), "not a file name in the folder")) << escape.status();

  fs::remove(dir_ / "ck/model.safetensors.index.json");
  CheckpointCache cache3;
  auto two = cache3.Open((dir_ / "ck").string());
  EXPECT_TRUE(Has(two.status(), "holds 2 .safetensors files")) << two.status();
}

// A header whose offsets do not tile the data section (a hole) is refused naming the file.
TEST_F(CheckpointTest, AHeaderThatLiesAboutOffsetsIsRefused) {
  const std::string header = R"({"w.weight":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = char((n >> (8 * i)) & 0xff);
  file += header + std::string(16, '\0');
  WriteText(dir_ / "model.safetensors", file);
  CheckpointCache cache;
  auto c = cache.Open((dir_ / "model.safetensors").string());
  ASSERT_TRUE(c.ok()) << c.status();
  auto t = (*c)->Get("w.weight");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(t.status(), "model.safetensors")) << t.status();
  EXPECT_TRUE(Has(t.status(), "tensor 'w.weight' starts at data offset 8")) << t.status();
}

// ---- metadata ---------------------------------------------------------------------------------

TEST_F(CheckpointTest, MetadataFromEachFileTheWritersUse) {
  WriteText(dir_ / "a/config.json", R"({"model_type": "llama", "quantization_config": {"quant_method": "awq",
      "zero_point": true, "group_size": 64, "bits": 4, "version": "GEMM"}})");
  auto a = ReadQuantMetadata((dir_ / "a").string());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->quant_method, "awq");
  EXPECT_EQ(a->version, "gemm");
  EXPECT_EQ(*a->group_size, 64);

  WriteText(dir_ / "b/config.json", R"({"model_type": "llama"})");
  WriteText(dir_ / "b/quantize_config.json", R"({"bits": 4, "group_size": -1, "desc_act": true, "sym": false,
      "checkpoint_format": "gptq_v2", "damp_percent": 0.01})");
  auto b = ReadQuantMetadata((dir_ / "b").string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->quant_method, "gptq");
  EXPECT_EQ(*b->group_size, -1);
  EXPECT_TRUE(*b->desc_act);
  EXPECT_FALSE(*b->sym);
  EXPECT_EQ(b->checkpoint_format, "gptq_v2");

  WriteText(dir_ / "c/quant_config.json", R"({"zero_point": true, "q_group_size": 128, "w_bit": 4, "version": "GEMM"})");
  auto c = ReadQuantMetadata((dir_ / "c").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant_method, "awq");
  EXPECT_EQ(c->bits, 4);
  EXPECT_EQ(*c->group_size, 128);

  WriteText(dir_ / "d/config.json", R"({"quantization_config": {"quant_method": "compressed-tensors",
      "format": "pack-quantized", "ignore": ["lm_head", "re:.*mlp.gate$"], "config_groups": {
      "attn": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}},
      "rest": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
               "group_size": 128, "symmetric": false, "actorder": "group"}, "input_activations": null}}}})");
  auto d = ReadQuantMetadata((dir_ / "d").string());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->groups.size(), 2u);
  EXPECT_EQ(FindCtGroup(*d, "model.layers.0.self_attn.q_proj")->name, "attn");
  EXPECT_EQ(FindCtGroup(*d, "model.layers.0.mlp.up_proj")->name, "rest");
  EXPECT_FALSE(FindCtGroup(*d, "model.layers.0.mlp.up_proj")->weights->symmetric);
  EXPECT_EQ(FindCtGroup(*d, "model.layers.0.mlp.up_proj")->weights->actorder, "group");
  EXPECT_EQ(FindCtGroup(*d, "model.layers.0.mlp.gate"), nullptr);
  EXPECT_EQ(FindCtGroup(*d, "lm_head"), nullptr);

  WriteText(dir_ / "e/config.json", R"({"quantization_config": {"quant_method": "gptq", "bits": "four"}})");
  auto e = ReadQuantMetadata((dir_ / "e").string());
  EXPECT_TRUE(Has(e.status(), "\"bits\" must be an integer")) << e.status();
  EXPECT_TRUE(Has(e.status(), "config.json")) << e.status();
  EXPECT_TRUE(ReadQuantMetadata((dir_ / "none").string())->empty());
}

// ---- the linear loader: formats and refusals -----------------------------------------------

constexpr int kK = 64, kN = 32, kG = 32;

// A GPTQ layer (v1 or v2 zeros) under `prefix` in `folder`, with the metadata given.
struct GptqFixture {
  gemm::GptqTensors t;
  GptqFixture(bool sym, bool v1, bool act_order) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> w(kN * kK);
    for (float& x : w) x = nd(rng);
    std::vector<int32_t> g_idx(kK);
    for (int k = 0; k < kK; ++k) g_idx[k] = act_order ? (k * 7 % kK) / kG : k / kG;
    t = gemm::PackGptq(gemm::QuantizeInt4(w.data(), kN, kK, kG, sym, g_idx.data()), v1);
  }
  std::vector<SafeTensorToWrite> Tensors(const std::string& p, bool with_g_idx = true) const {
    std::vector<SafeTensorToWrite> out = {{p + ".qweight", "I32", {kK / 8, kN}, Bytes(t.qweight)},
                                          {p + ".qzeros", "I32", {kK / kG, kN / 8}, Bytes(t.qzeros)},
                                          {p + ".scales", "F16", {kK / kG, kN}, Bytes(t.scales_f16)}};
    if (with_g_idx) out.push_back({p + ".g_idx", "I32", {kK}, Bytes(t.g_idx)});
    return out;
  }
};

constexpr const char* kPrefix = "model.layers.0.mlp.up_proj";

class LoaderTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    BackendOptions o;
    o.cpu_threads = 1;
    backend_ = std::make_unique<CpuBackend>(o);
  }

  std::string Config(const std::string& extra, int k = -1, int n = -1) {
    return "name: \"m\" input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, " + std::to_string(k) +
           " ] } ]\noutput [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, " + std::to_string(n) + " ] } ]\n" +
           Param("kind", "linear") + Param("checkpoint", "../ck") + Param("tensor", kPrefix) + extra;
  }

  absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& config_text, std::vector<std::string>* notes = nullptr) {
    ModelEntry e;
    e.dir = (dir_ / "m").string();
    fs::create_directories(e.dir);
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(config_text, &e.config)) << config_text;
    ModelLoadOptions o;
    o.log = [notes](const std::string&, const std::string& line) {
      if (notes) notes->push_back(line);
    };
    return CreateModel(e, *backend_, o);
  }

  void Write(const std::vector<SafeTensorToWrite>& tensors, const std::string& quantize_config,
             const std::string& config_json = "") {
    fs::remove_all(dir_ / "ck");
    fs::create_directories(dir_ / "ck");
    ASSERT_TRUE(WriteSafetensors((dir_ / "ck/model.safetensors").string(), tensors).ok());
    if (!quantize_config.empty()) WriteText(dir_ / "ck/quantize_config.json", quantize_config);
    if (!config_json.empty()) WriteText(dir_ / "ck/config.json", config_json);
  }

  void ExpectRefused(const std::string& config_text, const std::vector<std::string>& words, const std::string& what) {
    SCOPED_TRACE(what);
    auto m = Load(config_text);
    ASSERT_FALSE(m.ok()) << "loaded";
    for (const auto& w : words) EXPECT_TRUE(Has(m.status(), w)) << "lacks '" << w << "': " << m.status();
  }

  std::unique_ptr<CpuBackend> backend_;
};

const std::string kGptqV1Sym = R"({"bits": 4, "group_size": 32, "desc_act": false, "sym": true, "quant_method": "gptq", "checkpoint_format": "gptq"})";

TEST_F(LoaderTest, GptqLoadsAndDetectsV2ZerosUnderV1Metadata) {
  GptqFixture v1(/*sym=*/true, /*v1=*/true, false), v2(true, false, false);
  Write(v1.Tensors(kPrefix), kGptqV1Sym);
  std::vector<std::string> notes;
  auto m = Load(Config(""), &notes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(notes.empty()) << notes[0];

  Write(v2.Tensors(kPrefix), kGptqV1Sym);
  notes.clear();
  m = Load(Config(""), &notes);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(Has(absl::InternalError(notes[0]), "stored as 8")) << notes[0];
  // A parameter the stored zeros contradict is refused.
  ExpectRefused(Config(Param("gptq_version", "1")), {"qzeros", "parameter gptq_version is 1", "stored as 8"},
                "gptq_version 1 on v2 zeros");
}

TEST_F(LoaderTest, EveryRefusalNamesTheTensorOrFieldAndTheConstraint) {
  GptqFixture g(/*sym=*/true, /*v1=*/true, /*act_order=*/true);
  const std::string p = kPrefix;
  // Missing tensor.
  {
    auto t = g.Tensors(p);
    t.erase(t.begin() + 1);  // qzeros
    Write(t, kGptqV1Sym);
    ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.qzeros'", "has no tensor"}, "missing qzeros");
  }
  // desc_act needs g_idx.
  Write(g.Tensors(p, /*with_g_idx=*/false),
        R"({"bits": 4, "group_size": 32, "desc_act": true, "sym": true, "quant_method": "gptq"})");
  ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.g_idx'", "desc_act"}, "desc_act without g_idx");
  // Unexpected dtype.
  {
    std::vector<float> scales32(kK / kG * kN, 0.1f);
    auto t = g.Tensors(p);
    t[2] = {p + ".scales", "F32", {kK / kG, kN}, Bytes(scales32)};
    Write(t, kGptqV1Sym);
    ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.scales'", "dtype F32", "expected F16 or BF16"}, "F32 scales");
  }
  // Unexpected shape.
  {
    auto t = g.Tensors(p);
    t[1].shape = {kK / kG * 2, kN / 16};
    Write(t, kGptqV1Sym);
    ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.qzeros'", "shape [4, 2]", "[ceil(K/group_size), N/8] = [2, 4]"},
                  "qzeros shape");
  }
  // A group size the kernels cannot take.
  Write(g.Tensors(p), R"({"bits": 4, "group_size": 16, "sym": true, "quant_method": "gptq"})");
  ExpectRefused(Config(""), {"group_size 16", "multiple of 32", "channelwise"}, "group 16");
  // Unknown quant_method, and methods the kernels do not serve.
  Write(g.Tensors(p), "", R"({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true}})");
  ExpectRefused(Config(""), {"unknown quant_method 'bitsandbytes'", "gptq, awq, compressed-tensors and fp8"}, "bnb");
  Write(g.Tensors(p), R"({"bits": 8, "group_size": 32, "quant_method": "gptq"})");
  ExpectRefused(Config(""), {"bits is 8", "only 4-bit GPTQ"}, "gptq 8 bits");
  Write(g.Tensors(p), R"({"bits": 4, "group_size": 32, "quant_method": "gptq", "checkpoint_format": "marlin"})");
  ExpectRefused(Config(""), {"checkpoint_format is 'marlin'"}, "marlin");
  Write(g.Tensors(p), "", R"({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}})");
  ExpectRefused(Config(""), {"version is 'gemv'", "GEMM"}, "awq gemv");
  Write(g.Tensors(p), "", R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}}})");
  ExpectRefused(Config(""), {"config_groups.g", "type int with 8 bits"}, "ct int8");
  // Parameters that contradict the metadata.
  Write(g.Tensors(p), kGptqV1Sym);
  ExpectRefused(Config(Param("weight_format", "awq")), {"parameter weight_format is 'awq'", "the weights are gptq"},
                "weight_format");
  ExpectRefused(Config(Param("group_size", "64")), {"parameter group_size is '64'", "group_size 32"}, "group_size");
  ExpectRefused(Config(Param("symmetric", "false")), {"parameter symmetric is 'false'", "sym true"}, "symmetric");
  // K and N the config declares differently.
  ExpectRefused(Config("", 128, kN), {"declares K = 128", "have K = 64"}, "K mismatch");
  // sym metadata whose zeros are neither v1 nor v2 symmetric.
  GptqFixture asym(/*sym=*/false, /*v1=*/false, false);
  Write(asym.Tensors(p), kGptqV1Sym);
  ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.qzeros'", "sym is true", "not all 7"}, "asym zeros under sym");
}

TEST_F(LoaderTest, Fp8RefusalsBlockScalesAndBadScaleShapes) {
  std::string w(kN * kK, '\x38');
  std::vector<float> inv(1, 1.0f), scale(kN, 0.5f), two(2, 1.0f);
  const std::string p = kPrefix;
  Write({{p + ".weight", "F8_E4M3", {kN, kK}, w}, {p + ".weight_scale_inv", "F32", {1, 1}, Bytes(inv)}}, "",
        R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [128, 128]}})");
  ExpectRefused(Config(""), {"weight_block_size [128, 128]", "block-wise FP8 is not served"}, "block metadata");
  Write({{p + ".weight", "F8_E4M3", {kN, kK}, w}, {p + ".weight_scale_inv", "F32", {1, 1}, Bytes(inv)}}, "",
        R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})");
  ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.weight_scale_inv'", "block-wise"}, "block tensor");
  Write({{p + ".weight", "F8_E4M3", {kN, kK}, w}, {p + ".weight_scale", "F32", {2}, Bytes(two)}}, "",
        R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})");
  ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.weight_scale'", "shape [2]", "per output channel"},
                "scale shape");
  Write({{p + ".weight", "F8_E4M3", {kN, kK}, w}, {p + ".weight_scale", "F32", {kN}, Bytes(scale)}}, "",
        R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})");
  ExpectRefused(Config(""), {"'model.layers.0.mlp.up_proj.input_scale'", "static activation scaling"},
                "static without input_scale");
}

TEST_F(LoaderTest, FusedPartsMustShareKAndGrouping) {
  GptqFixture a(true, true, /*act_order=*/true), b(true, true, /*act_order=*/false);
  auto t = a.Tensors("x.q_proj");
  auto u = b.Tensors("x.k_proj");
  t.insert(t.end(), u.begin(), u.end());
  Write(t, kGptqV1Sym);
  const std::string fused = "name: \"m\" input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]\n"
                            "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]\n" +
                            Param("kind", "linear") + Param("checkpoint", "../ck") + Param("tensor", "x.q_proj, x.k_proj");
  ExpectRefused(fused, {"'x.q_proj' and 'x.k_proj' differ in g_idx"}, "different act-order");
}

// ---- parallel loading --------------------------------------------------------------------------

// A CPU backend whose CreateLinear waits (up to 10 s) until another CreateLinear is running:
// loads that run one after another never see two at once.
class OverlapBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  absl::StatusOr<std::unique_ptr<LinearExecutor>> CreateLinear(LinearWeights w) override {
    {
      std::unique_lock<std::mutex> l(mu_);
      max_ = std::max(max_, ++running_);
      cv_.notify_all();
      cv_.wait_for(l, std::chrono::seconds(10), [&] { return max_ >= 2; });
    }
    auto e = CpuBackend::CreateLinear(std::move(w));
    std::lock_guard<std::mutex> l(mu_);
    --running_;
    return e;
  }
  int max_concurrent() {
    std::lock_guard<std::mutex> l(mu_);
    return max_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0, max_ = 0;
};

TEST_F(LoaderTest, ModelsLoadInParallelAndShareOneMappingPerShard) {
  // Four layers in two shards, one model per layer.
  std::vector<GptqFixture> layers;
  for (int i = 0; i < 4; ++i) layers.emplace_back(true, true, false);
  fs::create_directories(dir_ / "ck");
  std::vector<SafeTensorToWrite> s1, s2;
  std::string index = R"({"weight_map": {)";
  for (int i = 0; i < 4; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.up_proj";
    for (auto& t : layers[i].Tensors(p, false)) {
      (i < 2 ? s1 : s2).push_back(t);
      index += std::string(index.back() == '{' ? "" : ",") + "\"" + t.name + "\": \"" +
               (i < 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
    }
  }
  index += "}}";
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/model-00001-of-00002.safetensors").string(), s1).ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "ck/model-00002-of-00002.safetensors").string(), s2).ok());
  WriteText(dir_ / "ck/model.safetensors.index.json", index);
  WriteText(dir_ / "ck/quantize_config.json", kGptqV1Sym);
  std::vector<ModelEntry> entries;
  for (int i = 0; i < 4; ++i) {
    ModelEntry e;
    e.dir = (dir_ / ("m" + std::to_string(i))).string();
    const std::string text = "name: \"m" + std::to_string(i) +
                             "\" input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, 64 ] } ]\n"
                             "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, 32 ] } ]\n" +
                             Param("kind", "linear") + Param("checkpoint", (dir_ / "ck").string()) +
                             Param("tensor", "model.layers." + std::to_string(i) + ".mlp.up_proj");
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &e.config));
    entries.push_back(e);
  }
  BackendOptions bo;
  bo.cpu_threads = 1;
  OverlapBackend backend(bo);
  ServerMetrics metrics(std::make_shared<prometheus::Registry>());
  CheckpointCache cache;
  InferenceServerOptions opts;
  opts.load_threads = 4;
  opts.load.checkpoints = &cache;
  const auto t0 = std::chrono::steady_clock::now();
  auto server = InferenceServer::Create(entries, backend, metrics, opts);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_GE(backend.max_concurrent(), 2) << "models loaded one after another";
  EXPECT_EQ(cache.files_mapped(), 2) << "each shard is mapped once for the four models";
  ASSERT_EQ((*server)->load_seconds().size(), 4u);
  EXPECT_EQ((*server)->load_seconds()[0].first, "m0") << "reported in repository order";
  EXPECT_EQ((*server)->load_seconds()[3].first, "m3");
}

}  // namespace
}  // namespace flashq::server
