// The embedded demo repository. Layout of <cache_dir>/demo-v3-<seed>/:
//   checkpoints/llama-3-8b-gptq/  a Hugging Face folder as GPTQModel writes it: config.json
//       and quantize_config.json (gptq, 4 bits, group 128, asymmetric, gptq_v2), two shards
//       (layer 0's up_proj, then its down_proj) and model.safetensors.index.json;
//   checkpoints/llama-3-8b-fp8/   the same layers as compressed-tensors float-quantized FP8
//       (per-channel weight scales, 16-bit activations: W8A16);
//   checkpoints/llama-3-8b/       the same layers in BF16;
//   attention/, kv_attention/ and {up,down}_proj_{bf16,int4,fp8}/config.pbtxt, each linear
//       model naming its checkpoint and tensor prefix, so that the first run reads real
//       checkpoint folders; STAMP.
// Llama-3-8B MLP shapes: up K=4096 -> N=14336, down K=14336 -> N=4096. Weights are
// N(0, 1/K) (keeps activations O(1) through the layer) from splitmix64 + Marsaglia's
// polar method with our own log, so the bits are the same on every machine and
// compiler (only IEEE-exact operations: + - * / sqrt and bit operations; no libm).
// Each float row is generated once and the BF16, GPTQ-int4 (v2, asymmetric, group 128)
// and FP8 (per-channel scale) variants are derived from it, so the three formats of a
// layer approximate the same weights: 470 MB, a few seconds on two cores.
// The folder is built under a temporary name and renamed into place, so a reader never
// sees half of it; STAMP (version + seed) is written last.
#include "server/repository/demo_repository.h"

#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "kernels/gemm/quant_formats.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr int kDemoVersion = 3;  // bump when the generated content or layout changes
constexpr int kGroupSize = 128;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Natural log for x in (0, 1], to ~1e-12 relative (the result is rounded to float):
// x = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(z), z = (m - 1) / (m + 1),
// |z| < 0.172, as an odd series to z^13. The exponent is split off with bit operations.
double PortableLog(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, 8);
  int e = int((bits >> 52) & 0x7ff) - 1022;  // x is normal here: x >= 2^-104
  bits = (bits & 0x800fffffffffffffull) | (uint64_t(1022) << 52);
  double m;
  std::memcpy(&m, &bits, 8);  // [0.5, 1)
  if (m < 0.70710678118654752) {
    m *= 2.0;
    e -= 1;
  }
  const double z = (m - 1.0) / (m + 1.0), z2 = z * z;
  double p = 1.0 / 13;
  for (int k = 11; k >= 1; k -= 2) p = p * z2 + 1.0 / k;
  return 2.0 * z * p + e * 0.69314718055994530942;
}

// Row `row` of matrix `tag` gets its own stream: rows can be generated in any order or
// in parallel with the same result.
void FillNormalRow(uint64_t seed, uint64_t tag, uint64_t row, double stddev, float* out, int n) {
  uint64_t state = seed ^ (tag * 0xd1b54a32d192ed03ull) ^ (row * 0x8cb92ba72f3d8dd7ull);
  SplitMix64(state);
  int i = 0;
  while (i < n) {
    double u, v, s;
    do {
      u = double(SplitMix64(state) >> 11) * 0x1.0p-52 - 1.0;  // [-1, 1), multiples of 2^-52
      v = double(SplitMix64(state) >> 11) * 0x1.0p-52 - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * PortableLog(s) / s) * stddev;
    out[i++] = float(u * f);
    if (i < n) out[i++] = float(v * f);
  }
}

template <typename T>
std::string_view Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

std::string Param(const std::string& key, const std::string& value) {
  return absl::StrCat("parameters { key: \"", key, "\" value: { string_value: \"", value, "\" } }\n");
}

constexpr const char* kDynamicBatching =
    "dynamic_batching {\n  max_queue_delay_microseconds: 0\n  default_queue_policy { max_queue_size: 1024 }\n}\n";

std::string AttentionConfig() {
  return absl::StrCat(
      "# Varlen attention over ragged batches (several sequences per request).\n"
      "name: \"attention\"\nbackend: \"flashq\"\nmax_batch_size: 0\n"
      "input [\n"
      "  { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"CU_SEQLENS_Q\" data_type: TYPE_INT32 dims: [ -1 ] optional: true },\n"
      "  { name: \"CU_SEQLENS_K\" data_type: TYPE_INT32 dims: [ -1 ] optional: true }\n"
      "]\n"
      "output [\n"
      "  { name: \"O\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"LSE\" data_type: TYPE_FP32 dims: [ -1, -1 ] }\n"
      "]\n",
      kDynamicBatching, Param("kind", "attention"), Param("max_batch_tokens", "16384"));
}

std::string KvAttentionConfig() {
  return absl::StrCat(
      "# Stateful attention over a paged KV cache keyed by sequence_id (Llama-3-8B heads).\n"
      "name: \"kv_attention\"\nbackend: \"flashq\"\nmax_batch_size: 0\n"
      "input [\n"
      "  { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, 32, 128 ] },\n"
      "  { name: \"K\" data_type: TYPE_FP16 dims: [ -1, 8, 128 ] },\n"
      "  { name: \"V\" data_type: TYPE_FP16 dims: [ -1, 8, 128 ] }\n"
      "]\n"
      "output [\n"
      "  { name: \"O\" data_type: TYPE_FP16 dims: [ -1, 32, 128 ] }\n"
      "]\n"
      "# sequence_batching and dynamic_batching are a oneof: the queue settings are parameters.\n"
      "sequence_batching { max_sequence_idle_microseconds: 600000000 }\n",
      Param("kind", "kv_attention"), Param("num_heads_q", "32"), Param("num_heads_kv", "8"),
      Param("head_dim", "128"), Param("page_size", "16"), Param("num_blocks", "512"),
      Param("max_tokens_per_sequence", "8192"), Param("session_idle_timeout_s", "600"),
      Param("max_queue_delay_us", "0"), Param("max_queue_size", "1024"));
}

std::string LinearConfig(const std::string& name, const std::string& checkpoint, const std::string& tensor, int K,
                         int N) {
  return absl::StrCat("# Llama-3-8B MLP projection, random weights (demo), read from a Hugging Face checkpoint folder.\n"
                      "name: \"", name, "\"\nbackend: \"flashq\"\nmax_batch_size: 0\n"
                      "input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, ", K, " ] } ]\n"
                      "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, ", N, " ] } ]\n",
                      kDynamicBatching, Param("kind", "linear"), Param("checkpoint", "../checkpoints/" + checkpoint),
                      Param("tensor", tensor), Param("in_features", std::to_string(K)),
                      Param("out_features", std::to_string(N)), Param("max_batch_tokens", "4096"));
}

// config.json as transformers writes it for a Llama-3-8B-shaped model of one decoder layer.
std::string HfConfig(const std::string& torch_dtype, const std::string& quantization_config) {
  return absl::StrCat(
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,\n"
      "  \"intermediate_size\": 14336,\n  \"num_hidden_layers\": 1,\n  \"num_attention_heads\": 32,\n"
      "  \"num_key_value_heads\": 8,\n  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": 1e-05,\n"
      "  \"vocab_size\": 128256,\n  \"torch_dtype\": \"", torch_dtype, "\"",
      quantization_config.empty() ? "" : ",\n  \"quantization_config\": " + quantization_config, "\n}\n");
}

// GPTQModel's quantize_config.json (also config.json's quantization_config).
constexpr const char* kGptqConfig =
    "{\"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": false, \"lm_head\": false, "
    "\"quant_method\": \"gptq\", \"checkpoint_format\": \"gptq_v2\", \"damp_percent\": 0.01, "
    "\"true_sequential\": true}";
// compressed-tensors FP8 weights with a scale per output channel and unquantized activations.
constexpr const char* kFp8Config =
    "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"quantization_status\": "
    "\"compressed\", \"ignore\": [\"lm_head\"], \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
    "\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, \"dynamic\": false, "
    "\"strategy\": \"channel\"}, \"input_activations\": null, \"output_activations\": null, "
    "\"format\": \"float-quantized\"}}}";

// One weight matrix W [N][K] in the three checkpoint formats.
struct LinearFormats {
  std::vector<uint16_t> bf16;                       // [N][K]
  std::vector<int32_t> qweight, qzeros;             // GPTQ v2: [K/8][N], [G][N/8]
  std::vector<uint16_t> scales_f16;                 // [G][N]
  std::vector<uint8_t> fp8;                         // [N][K] E4M3
  std::vector<float> fp8_scale;                     // [N]
};

// Every format is row-wise (int4 groups run along K, FP8 scales are per output channel),
// so the matrix is made in chunks of rows, on two threads, without ever holding all of W
// in float; the result does not depend on the chunking.
LinearFormats MakeLinearFormats(uint64_t seed, uint64_t tag, int K, int N) {
  constexpr int kChunkRows = 64;  // a multiple of 8 (qzeros pack 8 columns)
  const int K8 = (K + 7) / 8, G = (K + kGroupSize - 1) / kGroupSize;
  LinearFormats out;
  out.bf16.resize(size_t(N) * K);
  out.qweight.resize(size_t(K8) * N);
  out.qzeros.resize(size_t(G) * (N / 8));
  out.scales_f16.resize(size_t(G) * N);
  out.fp8.resize(size_t(N) * K);
  out.fp8_scale.resize(N);
  const double stddev = 1.0 / std::sqrt(double(K));
  std::atomic<int> next_chunk{0};
  auto worker = [&] {
    std::vector<float> w;
    for (;;) {
      const int n0 = next_chunk.fetch_add(1) * kChunkRows;
      if (n0 >= N) return;
      const int nc = std::min(kChunkRows, N - n0);
      w.resize(size_t(nc) * K);
      for (int r = 0; r < nc; ++r) FillNormalRow(seed, tag, uint64_t(n0 + r), stddev, w.data() + size_t(r) * K, K);
      for (size_t i = 0; i < w.size(); ++i) out.bf16[size_t(n0) * K + i] = FloatToBf16(w[i]);

      const gemm::GptqTensors g =
          gemm::PackGptq(gemm::QuantizeInt4(w.data(), nc, K, kGroupSize, /*symmetric=*/false), /*v1=*/false);
      for (int r = 0; r < K8; ++r)
        std::memcpy(&out.qweight[size_t(r) * N + n0], &g.qweight[size_t(r) * nc], size_t(nc) * 4);
      for (int gi = 0; gi < G; ++gi) {
        std::memcpy(&out.qzeros[size_t(gi) * (N / 8) + n0 / 8], &g.qzeros[size_t(gi) * (nc / 8)], size_t(nc / 8) * 4);
        std::memcpy(&out.scales_f16[size_t(gi) * N + n0], &g.scales_f16[size_t(gi) * nc], size_t(nc) * 2);
      }

      const gemm::Fp8Weights f = gemm::QuantizeFp8(w.data(), nc, K, /*per_channel=*/true);
      std::memcpy(&out.fp8[size_t(n0) * K], f.w.data(), f.w.size());
      for (int r = 0; r < nc; ++r) out.fp8_scale[n0 + r] = f.scale_of(r);
    }
  };
  // Exceptions (bad_alloc) are carried out of the threads and rethrown to Generate's handler.
  std::exception_ptr errors[2];
  std::thread helper([&] {
    try {
      worker();
    } catch (...) {
      errors[1] = std::current_exception();
      next_chunk = N;  // stop the other worker early
    }
  });
  try {
    worker();
  } catch (...) {
    errors[0] = std::current_exception();
    next_chunk = N;
  }
  helper.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

// The three checkpoints, each sharded by layer as save_pretrained splits them.
constexpr const char* kCheckpoints[3] = {"llama-3-8b", "llama-3-8b-gptq", "llama-3-8b-fp8"};
constexpr const char* kSuffixes[3] = {"bf16", "int4", "fp8"};

std::string ShardName(int shard) { return absl::StrCat("model-0000", shard, "-of-00002.safetensors"); }

// Writes shard `shard` of each checkpoint (one projection W [N][K] of layer 0) and the
// configs of <proj>_bf16, <proj>_int4 and <proj>_fp8; appends to each index's weight map.
absl::Status WriteLinearModels(const fs::path& root, const std::string& proj, int shard, uint64_t seed, uint64_t tag,
                               int K, int N, std::string (&weight_maps)[3]) {
  const LinearFormats m = MakeLinearFormats(seed, tag, K, N);
  const int G = (K + kGroupSize - 1) / kGroupSize;
  std::vector<int32_t> g_idx(K);  // written by the GPTQ tools even without act-order
  for (int k = 0; k < K; ++k) g_idx[k] = k / kGroupSize;
  const std::string p = "model.layers.0.mlp." + proj + ".";
  const std::vector<SafeTensorToWrite> tensors[3] = {
      {{p + "weight", "BF16", {N, K}, Bytes(m.bf16)}},
      {{p + "g_idx", "I32", {K}, Bytes(g_idx)},
       {p + "qweight", "I32", {(K + 7) / 8, N}, Bytes(m.qweight)},
       {p + "qzeros", "I32", {G, N / 8}, Bytes(m.qzeros)},
       {p + "scales", "F16", {G, N}, Bytes(m.scales_f16)}},
      {{p + "weight", "F8_E4M3", {N, K}, Bytes(m.fp8)}, {p + "weight_scale", "F32", {N, 1}, Bytes(m.fp8_scale)}},
  };
  for (int c = 0; c < 3; ++c) {
    const fs::path dir = root / "checkpoints" / kCheckpoints[c];
    fs::create_directories(dir);
    absl::Status s = WriteSafetensors((dir / ShardName(shard)).string(), tensors[c]);
    if (!s.ok()) return s;
    for (const SafeTensorToWrite& t : tensors[c]) {
      if (!weight_maps[c].empty()) weight_maps[c] += ",\n";
      absl::StrAppend(&weight_maps[c], "    \"", t.name, "\": \"", ShardName(shard), "\"");
    }
    const std::string name = proj + "_" + kSuffixes[c];
    fs::create_directories(root / name);
    s = WriteText(root / name / "config.pbtxt", LinearConfig(name, kCheckpoints[c], "model.layers.0.mlp." + proj, K, N));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpointMetadata(const fs::path& root, const std::string (&weight_maps)[3]) {
  const std::string configs[3] = {HfConfig("bfloat16", ""), HfConfig("float16", kGptqConfig),
                                  HfConfig("bfloat16", kFp8Config)};
  for (int c = 0; c < 3; ++c) {
    const fs::path dir = root / "checkpoints" / kCheckpoints[c];
    absl::Status s = WriteText(dir / "config.json", configs[c]);
    if (s.ok()) {
      std::error_code ec;
      uint64_t total = 0;
      for (int shard = 1; shard <= 2; ++shard) total += fs::file_size(dir / ShardName(shard), ec);
      s = WriteText(dir / "model.safetensors.index.json",
                    absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total, "},\n  \"weight_map\": {\n",
                                 weight_maps[c], "\n  }\n}\n"));
    }
    if (!s.ok()) return s;
  }
  return WriteText(root / "checkpoints" / kCheckpoints[1] / "quantize_config.json", std::string(kGptqConfig) + "\n");
}

std::string StampText(uint64_t seed) {
  return absl::StrCat("flashq demo repository\nversion ", kDemoVersion, "\nseed ", seed, "\n");
}

bool StampMatches(const fs::path& dir, uint64_t seed) {
  std::ifstream f(dir / "STAMP", std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str() == StampText(seed);
}

absl::Status Generate(const fs::path& tmp, uint64_t seed) {
  fs::create_directories(tmp / "attention");
  fs::create_directories(tmp / "kv_attention");
  absl::Status s = WriteText(tmp / "attention" / "config.pbtxt", AttentionConfig());
  if (s.ok()) s = WriteText(tmp / "kv_attention" / "config.pbtxt", KvAttentionConfig());
  std::string weight_maps[3];
  if (s.ok()) s = WriteLinearModels(tmp, "up_proj", 1, seed, /*tag=*/1, /*K=*/4096, /*N=*/14336, weight_maps);
  if (s.ok()) s = WriteLinearModels(tmp, "down_proj", 2, seed, /*tag=*/2, /*K=*/14336, /*N=*/4096, weight_maps);
  if (s.ok()) s = WriteCheckpointMetadata(tmp, weight_maps);
  if (!s.ok()) return s;
  return WriteText(tmp / "STAMP", StampText(seed));  // last: marks the folder complete
}

}  // namespace

absl::StatusOr<std::string> EnsureDemoRepository(const std::string& cache_dir, uint64_t seed) {
  const fs::path root = fs::path(cache_dir) / absl::StrCat("demo-v", kDemoVersion, "-", seed);
  if (StampMatches(root, seed)) return root.string();

  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create cache folder ", cache_dir, ": ", ec.message()));
  static std::atomic<int> counter{0};
  const fs::path tmp =
      fs::path(cache_dir) / absl::StrCat(".demo-v", kDemoVersion, "-", seed, ".tmp-", getpid(), "-", counter++);
  fs::remove_all(tmp, ec);
  absl::Status s;
  try {
    s = Generate(tmp, seed);
  } catch (const std::exception& e) {
    s = absl::InternalError(e.what());
  }
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return absl::Status(s.code(), absl::StrCat("generating the demo repository in ", tmp.string(), ": ", s.message()));
  }
  if (fs::exists(root, ec) && !StampMatches(root, seed)) {
    // A folder without a valid stamp (written by hand or by an older, broken run): set it aside.
    const fs::path stale = fs::path(cache_dir) / absl::StrCat(".stale-", root.filename().string(), "-", getpid());
    fs::rename(root, stale, ec);
    fs::remove_all(stale, ec);
  }
  fs::rename(tmp, root, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove_all(tmp, ec);
    // Another process may have finished first; its folder is as good as ours.
    if (StampMatches(root, seed)) return root.string();
    return absl::InternalError(absl::StrCat("cannot move the demo repository into ", root.string(), ": ", why));
  }
  return root.string();
}

}  // namespace flashq::server
