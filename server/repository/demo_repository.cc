// The embedded demo repository. Layout of <cache_dir>/demo-v1-<seed>/:
//   attention/config.pbtxt, kv_attention/config.pbtxt,
//   {up,down}_proj_{bf16,int4,fp8}/{config.pbtxt,model.safetensors}, STAMP.
// Llama-3-8B MLP shapes: up K=4096 -> N=14336, down K=14336 -> N=4096. Weights are
// N(0, 1/K) (keeps activations O(1) through the layer) from splitmix64 + Marsaglia's
// polar method with our own log, so the bits are the same on every machine and
// compiler (only IEEE-exact operations: + - * / sqrt and bit operations; no libm).
// Each float row is generated once and the BF16, GPTQ-int4 (v2, asymmetric, group 128)
// and FP8 (per-channel scale, W8A16) variants are derived from it, so the three formats
// of a layer approximate the same weights: 470 MB, a few seconds on two cores.
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
#include "kernels/common/dtype.h"
#include "kernels/gemm/quant_formats.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr int kDemoVersion = 2;  // bump when the generated content changes
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

std::string LinearConfig(const std::string& name, int K, int N, const std::string& extra_params) {
  return absl::StrCat("# Llama-3-8B MLP projection, random weights (demo).\n"
                      "name: \"", name, "\"\nbackend: \"flashq\"\nmax_batch_size: 0\n"
                      "input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, ", K, " ] } ]\n"
                      "output [ { name: \"Y\" data_type: TYPE_FP16 dims: [ -1, ", N, " ] } ]\n",
                      kDynamicBatching, Param("kind", "linear"), Param("in_features", std::to_string(K)),
                      Param("out_features", std::to_string(N)), Param("max_batch_tokens", "4096"), extra_params);
}

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

// Writes <prefix>_bf16, <prefix>_int4 and <prefix>_fp8 for one weight matrix W [N][K].
absl::Status WriteLinearModels(const fs::path& root, const std::string& prefix, uint64_t seed, uint64_t tag, int K,
                               int N) {
  const LinearFormats m = MakeLinearFormats(seed, tag, K, N);
  const int G = (K + kGroupSize - 1) / kGroupSize;
  struct Out {
    std::string name;
    std::vector<SafeTensorToWrite> tensors;
    std::string params;
  };
  const std::vector<Out> outs = {
      {prefix + "_bf16", {{"weight", "BF16", {N, K}, Bytes(m.bf16)}}, Param("weight_format", "bf16")},
      {prefix + "_int4",
       {{"qweight", "I32", {(K + 7) / 8, N}, Bytes(m.qweight)},
        {"qzeros", "I32", {G, N / 8}, Bytes(m.qzeros)},
        {"scales", "F16", {G, N}, Bytes(m.scales_f16)}},
       absl::StrCat(Param("weight_format", "gptq"), Param("group_size", std::to_string(kGroupSize)),
                    Param("symmetric", "false"), Param("gptq_version", "2"))},
      {prefix + "_fp8",
       {{"weight", "F8_E4M3", {N, K}, Bytes(m.fp8)}, {"weight_scale", "F32", {N}, Bytes(m.fp8_scale)}},
       absl::StrCat(Param("weight_format", "fp8"), Param("fp8_activation", "bf16"))},
  };
  for (const Out& o : outs) {
    fs::create_directories(root / o.name);
    absl::Status s = WriteSafetensors((root / o.name / "model.safetensors").string(), o.tensors);
    if (s.ok()) s = WriteText(root / o.name / "config.pbtxt", LinearConfig(o.name, K, N, o.params));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
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
  if (s.ok()) s = WriteLinearModels(tmp, "up_proj", seed, /*tag=*/1, /*K=*/4096, /*N=*/14336);
  if (s.ok()) s = WriteLinearModels(tmp, "down_proj", seed, /*tag=*/2, /*K=*/14336, /*N=*/4096);
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
