// Checkpoint layouts of one linear layer, tensor names relative to its prefix (shapes are
// the writers' own; N = output features, K = input features, G = groups along K):
//   dense        weight BF16 [N, K]
//   GPTQ         qweight I32 [K/8, N], qzeros I32 [G, N/8], scales F16 [G, N], g_idx I32 [K]
//                (AutoGPTQ's pack: 8 input channels per word, low nibble first; zeros
//                likewise along N, stored minus one in checkpoint_format "gptq" (v1) and
//                as is in "gptq_v2")
//   AWQ GEMM     qweight I32 [K, N/8], qzeros I32 [G, N/8], scales F16 [G, N] (AutoAWQ's
//                pack: 8 output channels per word in the order 0,2,4,6,1,3,5,7)
//   compressed-tensors pack-quantized
//                weight_packed I32 [N, K/8], weight_scale [N, G], weight_zero_point
//                I32 [N/8, G] (asymmetric), weight_g_idx I32 [K], weight_shape I32 [2]
//   FP8          weight F8_E4M3 [N, K], weight_scale F32/BF16 [] [1] [N] or [N, 1],
//                input_scale [] or [1] (static activation scale, W8A8)
//   any          bias [N] (F16, BF16 or F32), added after the GEMM
#include "server/repository/linear_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/dtype.h"
#include "server/core/tensor.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

// K and N of a layer: int inside the kernels, and far below where N x K overflows.
constexpr int64_t kMaxFeatures = 1 << 20;
// The W4A16 kernels step through K 32 channels at a time: a group is a whole number of
// steps, or the whole row (channelwise).
constexpr int kGroupStep = 32;

enum class Layout { kBf16, kGptq, kAwq, kPackQuantized, kFp8 };

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kBf16: return "bf16";
    case Layout::kGptq: return "gptq";
    case Layout::kAwq: return "awq";
    case Layout::kPackQuantized: return "compressed-tensors";
    case Layout::kFp8: return "fp8";
  }
  return "?";
}

// What to read, after the metadata and the parameters have had their say.
struct Scheme {
  Layout layout = Layout::kBf16;
  std::string origin;               // what decided the layout, for messages
  int group_size = 128;             // -1: channelwise
  std::optional<bool> sym;
  int gptq_version = 1;
  std::string version_origin;       // "" (default), the metadata's source, or "parameter gptq_version"
  bool version_from_parameter = false;
  bool desc_act = false;
  bool w8a8 = false;                // FP8: quantize activations too
  bool static_input = false;        // FP8: the metadata promises input_scale
};

absl::Status Invalid(const std::string& s) { return absl::InvalidArgumentError(s); }

std::string Join(const std::string& prefix, const char* name) {
  return prefix.empty() ? std::string(name) : absl::StrCat(prefix, ".", name);
}

std::string Str(const std::vector<int64_t>& shape) { return ShapeString(shape); }

// ---- metadata -> scheme ---------------------------------------------------------------

absl::Status SchemeFromCompressedTensors(const QuantMetadata& m, const std::string& module, Scheme* s,
                                         std::vector<std::string>* notes) {
  const CtGroup* g = FindCtGroup(m, module);
  if (g == nullptr || !g->weights) {
    s->layout = Layout::kBf16;
    s->origin = absl::StrCat(m.source, " (no config group quantizes '", module, "')");
    notes->push_back(absl::StrCat("'", module, "' is not quantized per ", m.source, "; reading a dense BF16 weight"));
    return absl::OkStatus();
  }
  const std::string format = g->format.empty() ? m.format : g->format;
  const CtQuantArgs& w = *g->weights;
  const std::string where = absl::StrCat(m.source, " config_groups.", g->name);
  s->origin = absl::StrCat(where, " (format ", format, ")");
  if (w.strategy == "block") {
    return Invalid(absl::StrCat(where, ": weights use strategy \"block\" (block_structure [",
                                absl::StrJoin(w.block_structure, ", "),
                                "]); the kernels take one scale per tensor, per output channel or per group along K, "
                                "so block-wise scales are not served"));
  }
  if (w.type == "int" && w.num_bits == 4) {
    if (format != "pack-quantized")
      return Invalid(absl::StrCat(where, ": 4-bit weights in format '", format, "'; only pack-quantized is served"));
    if (w.strategy == "group") {
      s->group_size = w.group_size;
    } else if (w.strategy == "channel") {
      s->group_size = -1;
    } else {
      return Invalid(absl::StrCat(where, ": 4-bit weights with strategy '", w.strategy,
                                  "'; the W4A16 kernels take \"group\" or \"channel\""));
    }
    if (g->input_activations)
      return Invalid(absl::StrCat(where, ": 4-bit weights with quantized input activations (W4A",
                                  g->input_activations->num_bits, ") are not served; W4A16 is"));
    s->layout = Layout::kPackQuantized;
    s->sym = w.symmetric;
    s->desc_act = !w.actorder.empty();
    return absl::OkStatus();
  }
  if (w.type == "float" && w.num_bits == 8) {
    if (format != "float-quantized" && format != "naive-quantized")
      return Invalid(absl::StrCat(where, ": FP8 weights in format '", format,
                                  "'; float-quantized (or naive-quantized) is served"));
    if (w.strategy != "tensor" && w.strategy != "channel")
      return Invalid(absl::StrCat(where, ": FP8 weights with strategy '", w.strategy,
                                  "'; the FP8 kernels take \"tensor\" or \"channel\" scales"));
    s->layout = Layout::kFp8;
    if (const auto& in = g->input_activations) {
      if (in->type != "float" || in->num_bits != 8)
        return Invalid(absl::StrCat(where, ": input activations of type ", in->type, " with ", in->num_bits,
                                    " bits; only FP8 (W8A8) or unquantized (W8A16) activations are served"));
      s->w8a8 = true;
      s->static_input = !in->dynamic;
      if (!in->dynamic && in->strategy != "tensor")
        return Invalid(absl::StrCat(where, ": static input activation scales with strategy '", in->strategy,
                                    "'; only one static scale per tensor is served"));
      if (in->dynamic && in->strategy == "tensor")
        notes->push_back(absl::StrCat(where, " asks for dynamic per-tensor activation scales; serving dynamic "
                                      "per-token scales (batch-invariant, and at least as accurate)"));
    }
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(where, ": weights of type ", w.type, " with ", w.num_bits,
                              " bits are not served (4-bit int: W4A16; 8-bit float: FP8)"));
}

absl::Status SchemeFromMetadata(const QuantMetadata& m, const std::string& module, Scheme* s,
                                std::vector<std::string>* notes) {
  const std::string& method = m.quant_method;
  s->origin = absl::StrCat(m.source, " (quant_method ", method, ")");
  if (method == "gptq") {
    if (m.bits != 4)
      return Invalid(absl::StrCat(m.source, ": bits is ", m.bits, "; only 4-bit GPTQ is served (W4A16)"));
    if (m.is_marlin_format)
      return Invalid(absl::StrCat(m.source, ": is_marlin_format is true; Marlin-repacked GPTQ is not served, "
                                            "only the gptq and gptq_v2 layouts"));
    if (!m.checkpoint_format.empty() && m.checkpoint_format != "gptq" && m.checkpoint_format != "gptq_v2")
      return Invalid(absl::StrCat(m.source, ": checkpoint_format is '", m.checkpoint_format,
                                  "'; only \"gptq\" (v1 zero points) and \"gptq_v2\" are served"));
    s->layout = Layout::kGptq;
    s->group_size = m.group_size.value_or(128);
    s->sym = m.sym.value_or(true);  // AutoGPTQ's default
    s->desc_act = m.desc_act.value_or(false);
    s->gptq_version = m.checkpoint_format == "gptq_v2" ? 2 : 1;
    s->version_origin = absl::StrCat(m.source, " (checkpoint_format \"",
                                     m.checkpoint_format.empty() ? "gptq" : m.checkpoint_format, "\")");
    return absl::OkStatus();
  }
  if (method == "awq") {
    if (m.bits != 4) return Invalid(absl::StrCat(m.source, ": bits is ", m.bits, "; only 4-bit AWQ is served (W4A16)"));
    if (!m.zero_point.value_or(true))
      return Invalid(absl::StrCat(m.source, ": zero_point is false; AWQ GEMM checkpoints without zero points are not served"));
    if (!m.version.empty() && m.version != "gemm")
      return Invalid(absl::StrCat(m.source, ": version is '", m.version,
                                  "'; only AWQ's GEMM layout is served (qweight [K, N/8])"));
    s->layout = Layout::kAwq;
    s->group_size = m.group_size.value_or(128);
    s->sym = false;
    return absl::OkStatus();
  }
  if (method == "fp8") {
    if (!m.weight_block_size.empty())
      return Invalid(absl::StrCat(m.source, ": weight_block_size [", absl::StrJoin(m.weight_block_size, ", "),
                                  "] (block-wise weight_scale_inv): the W8A16 kernel takes one scale per tensor or per "
                                  "output channel, so block-wise FP8 is not served"));
    if (!m.fmt.empty() && m.fmt != "e4m3")
      return Invalid(absl::StrCat(m.source, ": fmt is '", m.fmt, "'; only E4M3 weights are served"));
    if (!m.activation_scheme.empty() && m.activation_scheme != "static" && m.activation_scheme != "dynamic")
      return Invalid(absl::StrCat(m.source, ": activation_scheme is '", m.activation_scheme,
                                  "'; expected \"static\" or \"dynamic\""));
    s->layout = Layout::kFp8;
    s->w8a8 = true;  // the checkpoint was made for FP8 activations (vLLM's reading)
    s->static_input = m.activation_scheme == "static";
    return absl::OkStatus();
  }
  if (method == "compressed-tensors") return SchemeFromCompressedTensors(m, module, s, notes);
  return Invalid(absl::StrCat(m.source, ": unknown quant_method '", method,
                              "'; the server reads gptq, awq, compressed-tensors and fp8 checkpoints"));
}

// The parameters, checked against (or overriding) the metadata.
absl::Status ApplyParameters(const inference::ModelConfig& c, bool have_metadata, Scheme* s,
                             std::vector<std::string>* notes) {
  auto param = [&](const char* key) -> std::optional<std::string> {
    auto it = c.parameters().find(key);
    if (it == c.parameters().end()) return std::nullopt;
    return std::string(absl::StripAsciiWhitespace(it->second.string_value()));
  };
  auto contradiction = [&](const std::string& key, const std::string& value, const std::string& says) {
    return Invalid(absl::StrCat("parameter ", key, " is '", value, "' but ", s->origin, " says ", says,
                                "; remove the parameter or fix the checkpoint's metadata"));
  };
  if (auto f = param("weight_format")) {
    static const std::pair<const char*, Layout> kFormats[] = {{"bf16", Layout::kBf16},
                                                              {"gptq", Layout::kGptq},
                                                              {"awq", Layout::kAwq},
                                                              {"compressed-tensors", Layout::kPackQuantized},
                                                              {"fp8", Layout::kFp8}};
    std::optional<Layout> want;
    for (const auto& [name, l] : kFormats)
      if (*f == name) want = l;
    if (!want)
      return Invalid(absl::StrCat("unknown weight_format '", *f, "'; expected bf16, gptq, awq, compressed-tensors or fp8"));
    if (!have_metadata) {
      s->layout = *want;
      s->origin = absl::StrCat("parameter weight_format '", *f, "'");
    } else if (*want != s->layout) {
      return contradiction("weight_format", *f, absl::StrCat("the weights are ", LayoutName(s->layout)));
    }
  }
  const bool int4 = s->layout == Layout::kGptq || s->layout == Layout::kAwq || s->layout == Layout::kPackQuantized;
  if (auto g = param("group_size")) {
    int v = 0;
    if (!absl::SimpleAtoi(*g, &v) || (v < 1 && v != -1) || v > kMaxFeatures)
      return Invalid(absl::StrCat("parameter group_size is '", *g, "'; expected -1 (channelwise) or 1..", kMaxFeatures));
    if (int4 && have_metadata && v != s->group_size)
      return contradiction("group_size", *g, absl::StrCat("group_size ", s->group_size));
    s->group_size = v;
  }
  if (auto sym = param("symmetric")) {
    if (*sym != "true" && *sym != "false")
      return Invalid(absl::StrCat("parameter symmetric is '", *sym, "'; expected true or false"));
    const bool v = *sym == "true";
    if (int4 && have_metadata && s->sym && *s->sym != v)
      return contradiction("symmetric", *sym, absl::StrCat("sym ", *s->sym ? "true" : "false"));
    s->sym = v;
  }
  if (auto ver = param("gptq_version")) {
    if (*ver != "1" && *ver != "2") return Invalid(absl::StrCat("parameter gptq_version is '", *ver, "'; expected 1 or 2"));
    const int v = *ver == "1" ? 1 : 2;
    if (s->layout == Layout::kGptq && !s->version_origin.empty() && v != s->gptq_version)
      notes->push_back(absl::StrCat("parameter gptq_version ", v, " overrides ", s->version_origin));
    s->gptq_version = v;
    s->version_origin = "parameter gptq_version";
    s->version_from_parameter = true;
  }
  if (auto a = param("fp8_activation")) {
    if (*a != "bf16" && *a != "fp8")
      return Invalid(absl::StrCat("parameter fp8_activation is '", *a, "'; expected bf16 (W8A16) or fp8 (W8A8)"));
    const bool v = *a == "fp8";
    if (s->layout == Layout::kFp8 && have_metadata && v != s->w8a8)
      notes->push_back(absl::StrCat("parameter fp8_activation ", *a, " overrides ", s->origin, ": running ",
                                    v ? "W8A8 (FP8 activations)" : "W8A16 (16-bit activations)"));
    s->w8a8 = v;
  }
  return absl::OkStatus();
}

// ---- reading tensors --------------------------------------------------------------------

class TensorReader {
 public:
  TensorReader(const Checkpoint& ckpt, std::string prefix) : ckpt_(ckpt), prefix_(std::move(prefix)) {}

  std::string Name(const char* name) const { return Join(prefix_, name); }

  absl::StatusOr<bool> Has(const char* name) const { return ckpt_.Has(Name(name)); }

  // The tensor, in one of `dtypes`.
  absl::StatusOr<SafeTensor> Get(const char* name, std::initializer_list<const char*> dtypes) const {
    auto t = ckpt_.Get(Name(name));
    if (!t.ok()) return t.status();
    for (const char* d : dtypes)
      if (t->dtype == d) return t;
    std::vector<std::string> want(dtypes.begin(), dtypes.end());
    return Invalid(absl::StrCat("tensor '", Name(name), "' of ", ckpt_.path(), " has dtype ", t->dtype, " shape ",
                                Str(t->shape), "; expected ", absl::StrJoin(want, " or ")));
  }

  absl::Status Shape(const char* name, const SafeTensor& t, const std::vector<int64_t>& want,
                     const std::string& meaning) const {
    if (t.shape == want) return absl::OkStatus();
    return Invalid(absl::StrCat("tensor '", Name(name), "' of ", ckpt_.path(), " has shape ", Str(t.shape),
                                "; expected ", meaning, " = ", Str(want)));
  }

  absl::Status Bad(const char* name, const std::string& what) const {
    return Invalid(absl::StrCat("tensor '", Name(name), "' of ", ckpt_.path(), ": ", what));
  }

  // An optional bias [N] as float.
  absl::StatusOr<std::vector<float>> Bias(int64_t N) const {
    auto has = Has("bias");
    if (!has.ok()) return has.status();
    if (!*has) return std::vector<float>();
    auto t = Get("bias", {"F16", "BF16", "F32"});
    if (!t.ok()) return t.status();
    if (auto s = Shape("bias", *t, {N}, "[N]"); !s.ok()) return s;
    std::vector<float> b(N);
    const DType dt = t->dtype == "F16" ? DType::kF16 : t->dtype == "BF16" ? DType::kBF16 : DType::kF32;
    for (int64_t i = 0; i < N; ++i) b[i] = LoadAsFloat(dt, t->data.data(), i);
    for (int64_t i = 0; i < N; ++i)
      if (!std::isfinite(b[i])) return Bad("bias", absl::StrCat("element ", i, " is ", b[i], "; it must be finite"));
    return b;
  }

 private:
  const Checkpoint& ckpt_;
  const std::string prefix_;
};

gemm::ScaleType ScaleTypeOf(const std::string& dtype) {
  return dtype == "F32" ? gemm::ScaleType::kF32 : dtype == "BF16" ? gemm::ScaleType::kBF16 : gemm::ScaleType::kF16;
}

uint32_t WordAt(const SafeTensor& t, size_t i) {
  uint32_t v;
  std::memcpy(&v, t.data.data() + 4 * i, 4);
  return v;
}

absl::Status CheckGroupSize(const TensorReader& r, const char* tensor, int group, int K, const std::string& origin) {
  if (group >= K || group % kGroupStep == 0) return absl::OkStatus();
  return r.Bad(tensor, absl::StrCat("group_size ", group, " (", origin, ") cannot be served: the W4A16 kernels take a "
                                    "group size that is a multiple of ", kGroupStep, ", or channelwise (-1)"));
}

// GPTQ's zero-point convention. AutoGPTQ's pack stores zero - 1 in each qzeros nibble
// (checkpoint_format "gptq", v1); GPTQModel's gptq_v2 stores the zero itself. Some
// writers have stored v2 zeros under checkpoint_format "gptq", and a loader that believes
// the metadata is off by one zero point (one scale) in every weight. A symmetric 4-bit
// checkpoint has a single zero point, 2^(bits-1) = 8, so its stored nibbles tell the
// convention whatever the metadata says: all 7 is v1, all 8 is v2 (the check vLLM added
// for GPTQ checkpoints whose metadata says "gptq"). Here the nibbles win over the
// metadata, with a note; a gptq_version parameter they contradict is refused, and so is
// any other stored value under sym=true. Asymmetric zeros span 0..15 in both
// conventions, so there the metadata (or the parameter) decides.
absl::Status ResolveGptqVersion(const TensorReader& r, const SafeTensor& qzeros, int N, Scheme* s,
                                std::vector<std::string>* notes) {
  if (!s->sym.value_or(false)) return absl::OkStatus();
  const int64_t G = qzeros.shape[0], N8 = qzeros.shape[1];
  bool all7 = true, all8 = true;
  uint32_t other = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int n = 0; n < N; ++n) {
      const uint32_t z = (WordAt(qzeros, size_t(g * N8 + n / 8)) >> (4 * (n % 8))) & 0xFu;
      all7 = all7 && z == 7;
      all8 = all8 && z == 8;
      if (z != 7 && z != 8) other = z;
    }
  if (!all7 && !all8) {
    return r.Bad("qzeros", absl::StrCat("sym is true (", s->origin, ") but the stored zero points are not all 7 "
                                        "(checkpoint_format gptq) or all 8 (gptq_v2); one is ", other,
                                        ". Set symmetric false if the checkpoint is asymmetric"));
  }
  const int found = all8 ? 2 : 1;
  if (found == s->gptq_version) return absl::OkStatus();
  if (s->version_from_parameter) {
    return r.Bad("qzeros", absl::StrCat("parameter gptq_version is ", s->gptq_version,
                                        " but the symmetric zero points are stored as ", all8 ? 8 : 7, ", which is ",
                                        found == 2 ? "gptq_v2" : "gptq (v1)", "; remove the parameter"));
  }
  notes->push_back(absl::StrCat("symmetric zero points stored as ", all8 ? 8 : 7, " in '", r.Name("qzeros"), "' are ",
                                found == 2 ? "gptq_v2" : "gptq (v1)", " although ",
                                s->version_origin.empty() ? "the default" : s->version_origin,
                                " says otherwise; loading them as ", found == 2 ? "gptq_v2" : "gptq (v1)"));
  s->gptq_version = found;
  s->version_origin = "the stored zero points";
  return absl::OkStatus();
}

struct Sizes {
  int64_t K = 0, N = 0;  // 0: not declared
};

absl::StatusOr<LinearLoad> LoadPart(const TensorReader& r, const Checkpoint& ckpt, Scheme scheme, Sizes declared,
                                    std::vector<std::string>* notes) {
  LinearLoad out;
  LinearWeights& w = out.weights;
  auto bad_size = [&](const char* tensor, int64_t v, const char* what) {
    return r.Bad(tensor, absl::StrCat(what, " = ", v, " is outside 1..", kMaxFeatures));
  };
  switch (scheme.layout) {
    case Layout::kBf16: {
      auto t = r.Get("weight", {"BF16"});
      if (!t.ok()) return t.status();
      if (t->shape.size() != 2) return r.Shape("weight", *t, {declared.N, declared.K}, "[N, K]");
      if (t->shape[0] < 1 || t->shape[0] > kMaxFeatures) return bad_size("weight", t->shape[0], "N");
      if (t->shape[1] < 1 || t->shape[1] > kMaxFeatures) return bad_size("weight", t->shape[1], "K");
      w.format = WeightFormat::kBf16;
      w.N = int(t->shape[0]);
      w.K = int(t->shape[1]);
      w.bf16.resize(t->data.size() / 2);
      std::memcpy(w.bf16.data(), t->data.data(), t->data.size());
      break;
    }
    case Layout::kGptq: {
      auto qw = r.Get("qweight", {"I32"});
      if (!qw.ok()) return qw.status();
      if (qw->shape.size() != 2) return r.Bad("qweight", absl::StrCat("shape ", Str(qw->shape), "; expected [K/8, N]"));
      const int64_t N = qw->shape[1];
      auto has_g_idx = r.Has("g_idx");
      if (!has_g_idx.ok()) return has_g_idx.status();
      std::optional<SafeTensor> g_idx;
      if (*has_g_idx) {
        auto t = r.Get("g_idx", {"I32"});
        if (!t.ok()) return t.status();
        g_idx = *t;
      } else if (scheme.desc_act) {
        return Invalid(absl::StrCat("checkpoint ", ckpt.path(), " has no tensor '", r.Name("g_idx"), "', which desc_act "
                                    "(act-order, ", scheme.origin, ") needs"));
      }
      // K: g_idx's length, else the declared K, else every qweight row full.
      int64_t K = g_idx && g_idx->shape.size() == 1 ? g_idx->shape[0] : declared.K > 0 ? declared.K : 8 * qw->shape[0];
      if (K < 1 || K > kMaxFeatures) return bad_size("qweight", K, "K");
      if (N < 1 || N > kMaxFeatures) return bad_size("qweight", N, "N");
      if (auto s = r.Shape("qweight", *qw, {(K + 7) / 8, N}, "[ceil(K/8), N]"); !s.ok()) return s;
      if (N % 8 != 0) return r.Bad("qweight", absl::StrCat("N = ", N, " is not a multiple of 8 (qzeros pack 8 columns per word)"));
      const int group = scheme.group_size == -1 ? int(K) : scheme.group_size;
      if (auto s = CheckGroupSize(r, "qweight", group, int(K), scheme.origin); !s.ok()) return s;
      const int64_t G = (K + group - 1) / group;
      auto qz = r.Get("qzeros", {"I32"});
      if (!qz.ok()) return qz.status();
      if (auto s = r.Shape("qzeros", *qz, {G, N / 8}, "[ceil(K/group_size), N/8]"); !s.ok()) return s;
      auto sc = r.Get("scales", {"F16", "BF16"});
      if (!sc.ok()) return sc.status();
      if (auto s = r.Shape("scales", *sc, {G, N}, "[ceil(K/group_size), N]"); !s.ok()) return s;
      if (g_idx) {
        if (auto s = r.Shape("g_idx", *g_idx, {K}, "[K]"); !s.ok()) return s;
      }
      if (auto s = ResolveGptqVersion(r, *qz, int(N), &scheme, notes); !s.ok()) return s;
      gemm::GptqView v;
      v.qweight = qw->data.data();
      v.qzeros = qz->data.data();
      v.g_idx = g_idx ? g_idx->data.data() : nullptr;
      v.scales = {sc->data.data(), ScaleTypeOf(sc->dtype)};
      v.K = int(K);
      v.N = int(N);
      v.group_size = group;
      v.v1 = scheme.gptq_version == 1;
      w.format = WeightFormat::kInt4;
      w.K = int(K);
      w.N = int(N);
      if (Status s = gemm::UnpackGptq(v, &w.int4); !s.ok()) return r.Bad("qweight", s.message());
      break;
    }
    case Layout::kAwq: {
      auto qw = r.Get("qweight", {"I32"});
      if (!qw.ok()) return qw.status();
      auto sc = r.Get("scales", {"F16", "BF16"});
      if (!sc.ok()) return sc.status();
      if (qw->shape.size() != 2) return r.Bad("qweight", absl::StrCat("shape ", Str(qw->shape), "; expected [K, N/8]"));
      const int64_t K = qw->shape[0], N = 8 * qw->shape[1];
      if (K < 1 || K > kMaxFeatures) return bad_size("qweight", K, "K");
      if (N < 1 || N > kMaxFeatures) return bad_size("qweight", N, "N");
      const int group = scheme.group_size == -1 ? int(K) : scheme.group_size;
      if (auto s = CheckGroupSize(r, "qweight", group, int(K), scheme.origin); !s.ok()) return s;
      const int64_t G = (K + group - 1) / group;
      auto qz = r.Get("qzeros", {"I32"});
      if (!qz.ok()) return qz.status();
      if (auto s = r.Shape("qzeros", *qz, {G, N / 8}, "[ceil(K/group_size), N/8]"); !s.ok()) return s;
      if (auto s = r.Shape("scales", *sc, {G, N}, "[ceil(K/group_size), N]"); !s.ok()) return s;
      gemm::AwqView v;
      v.qweight = qw->data.data();
      v.qzeros = qz->data.data();
      v.scales = {sc->data.data(), ScaleTypeOf(sc->dtype)};
      v.K = int(K);
      v.N = int(N);
      v.group_size = group;
      w.format = WeightFormat::kInt4;
      w.K = int(K);
      w.N = int(N);
      if (Status s = gemm::UnpackAwq(v, &w.int4); !s.ok()) return r.Bad("qweight", s.message());
      break;
    }
    case Layout::kPackQuantized: {
      auto wp = r.Get("weight_packed", {"I32"});
      if (!wp.ok()) return wp.status();
      if (wp->shape.size() != 2)
        return r.Bad("weight_packed", absl::StrCat("shape ", Str(wp->shape), "; expected [N, ceil(K/8)]"));
      const int64_t N = wp->shape[0];
      int64_t K = declared.K > 0 ? declared.K : 8 * wp->shape[1];
      auto has_shape = r.Has("weight_shape");
      if (!has_shape.ok()) return has_shape.status();
      if (*has_shape) {  // the unpacked [N, K], which the packing's padding hides
        auto ws = r.Get("weight_shape", {"I32", "I64"});
        if (!ws.ok()) return ws.status();
        if (ws->shape != std::vector<int64_t>{2}) return r.Shape("weight_shape", *ws, {2}, "[2]");
        int64_t v[2];
        for (int i = 0; i < 2; ++i) {
          if (ws->dtype == "I32") {
            v[i] = int32_t(WordAt(*ws, i));
          } else {
            std::memcpy(&v[i], ws->data.data() + 8 * i, 8);
          }
        }
        if (v[0] != N) return r.Bad("weight_shape", absl::StrCat("says N = ", v[0], " but weight_packed has ", N, " rows"));
        K = v[1];
      }
      if (K < 1 || K > kMaxFeatures) return bad_size("weight_packed", K, "K");
      if (N < 1 || N > kMaxFeatures) return bad_size("weight_packed", N, "N");
      if (auto s = r.Shape("weight_packed", *wp, {N, (K + 7) / 8}, "[N, ceil(K/8)]"); !s.ok()) return s;
      const int group = scheme.group_size == -1 ? int(K) : scheme.group_size;
      if (auto s = CheckGroupSize(r, "weight_packed", group, int(K), scheme.origin); !s.ok()) return s;
      const int64_t G = (K + group - 1) / group;
      auto sc = r.Get("weight_scale", {"BF16", "F16", "F32"});
      if (!sc.ok()) return sc.status();
      if (auto s = r.Shape("weight_scale", *sc, {N, G}, "[N, ceil(K/group_size)]"); !s.ok()) return s;
      std::optional<SafeTensor> zp, g_idx;
      if (!scheme.sym.value_or(true)) {
        auto t = r.Get("weight_zero_point", {"I32"});
        if (!t.ok()) return t.status();
        if (auto s = r.Shape("weight_zero_point", *t, {(N + 7) / 8, G}, "[ceil(N/8), ceil(K/group_size)]"); !s.ok())
          return s;
        zp = *t;
      }
      auto has_g_idx = r.Has("weight_g_idx");
      if (!has_g_idx.ok()) return has_g_idx.status();
      if (*has_g_idx) {
        auto t = r.Get("weight_g_idx", {"I32"});
        if (!t.ok()) return t.status();
        if (auto s = r.Shape("weight_g_idx", *t, {K}, "[K]"); !s.ok()) return s;
        g_idx = *t;
      } else if (scheme.desc_act) {
        return Invalid(absl::StrCat("checkpoint ", ckpt.path(), " has no tensor '", r.Name("weight_g_idx"),
                                    "', which actorder (", scheme.origin, ") needs"));
      }
      gemm::PackQuantizedView v;
      v.weight_packed = wp->data.data();
      v.zero_point = zp ? zp->data.data() : nullptr;
      v.g_idx = g_idx ? g_idx->data.data() : nullptr;
      v.scales = {sc->data.data(), ScaleTypeOf(sc->dtype)};
      v.K = int(K);
      v.N = int(N);
      v.group_size = group;
      w.format = WeightFormat::kInt4;
      w.K = int(K);
      w.N = int(N);
      if (Status s = gemm::UnpackPackQuantized(v, &w.int4); !s.ok()) return r.Bad("weight_packed", s.message());
      break;
    }
    case Layout::kFp8: {
      auto has_inv = r.Has("weight_scale_inv");
      if (!has_inv.ok()) return has_inv.status();
      if (*has_inv) {
        return r.Bad("weight_scale_inv", "block-wise FP8 scales (one per 128x128 block, DeepSeek-V3 style) are not "
                                         "served: the W8A16 kernel takes one scale per tensor or per output channel");
      }
      auto t = r.Get("weight", {"F8_E4M3"});
      if (!t.ok()) return t.status();
      if (t->shape.size() != 2) return r.Bad("weight", absl::StrCat("shape ", Str(t->shape), "; expected [N, K]"));
      const int64_t N = t->shape[0], K = t->shape[1];
      if (K < 1 || K > kMaxFeatures) return bad_size("weight", K, "K");
      if (N < 1 || N > kMaxFeatures) return bad_size("weight", N, "N");
      auto sc = r.Get("weight_scale", {"F32", "BF16", "F16"});
      if (!sc.ok()) return sc.status();
      const int64_t ns = sc->numel();
      const bool shape_ok = (ns == 1 && sc->shape.size() <= 1) ||
                            (sc->shape == std::vector<int64_t>{N}) || (sc->shape == std::vector<int64_t>{N, 1});
      if (!shape_ok) {
        return r.Bad("weight_scale", absl::StrCat("has shape ", Str(sc->shape), "; expected [] or [1] (per tensor), or [",
                                                  N, "] or [", N, ", 1] (per output channel)"));
      }
      w.format = WeightFormat::kFp8;
      w.K = int(K);
      w.N = int(N);
      w.fp8.K = w.K;
      w.fp8.N = w.N;
      w.fp8.w.resize(t->data.size());
      std::memcpy(w.fp8.w.data(), t->data.data(), t->data.size());
      const DType sdt = sc->dtype == "F32" ? DType::kF32 : sc->dtype == "BF16" ? DType::kBF16 : DType::kF16;
      w.fp8.scale.resize(ns);
      for (int64_t i = 0; i < ns; ++i) {
        w.fp8.scale[i] = LoadAsFloat(sdt, sc->data.data(), i);
        if (!std::isfinite(w.fp8.scale[i]) || w.fp8.scale[i] <= 0.0f) {
          return r.Bad("weight_scale", absl::StrCat("element ", i, " is ", w.fp8.scale[i], "; scales must be finite and > 0"));
        }
      }
      w.fp8_activations = scheme.w8a8;
      auto has_in = r.Has("input_scale");
      if (!has_in.ok()) return has_in.status();
      if (*has_in) {
        auto in = r.Get("input_scale", {"F32", "BF16", "F16"});
        if (!in.ok()) return in.status();
        if (in->numel() != 1 || in->shape.size() > 1)
          return r.Bad("input_scale", absl::StrCat("has shape ", Str(in->shape), "; expected [] or [1] (one static scale)"));
        const DType idt = in->dtype == "F32" ? DType::kF32 : in->dtype == "BF16" ? DType::kBF16 : DType::kF16;
        const float s = LoadAsFloat(idt, in->data.data(), 0);
        if (!std::isfinite(s) || s <= 0.0f) return r.Bad("input_scale", absl::StrCat("is ", s, "; it must be finite and > 0"));
        if (scheme.w8a8) {
          w.fp8_input_scale = s;
        } else {
          notes->push_back(absl::StrCat("'", r.Name("input_scale"), "' is unused: the model runs W8A16"));
        }
      } else if (scheme.w8a8 && scheme.static_input) {
        return Invalid(absl::StrCat("checkpoint ", ckpt.path(), " has no tensor '", r.Name("input_scale"),
                                    "', which static activation scaling (", scheme.origin, ") needs"));
      }
      break;
    }
  }
  auto bias = r.Bias(w.N);
  if (!bias.ok()) return bias.status();
  out.bias = *std::move(bias);
  return out;
}

// Concatenates the parts of a fused projection along N.
absl::StatusOr<LinearLoad> Fuse(std::vector<LinearLoad> parts, const std::vector<std::string>& prefixes,
                                std::vector<std::string>* notes) {
  if (parts.size() == 1) return std::move(parts[0]);
  LinearLoad out;
  LinearWeights& w = out.weights;
  const LinearWeights& first = parts[0].weights;
  w.format = first.format;
  w.K = first.K;
  w.fp8_activations = first.fp8_activations;
  int64_t N = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const LinearWeights& p = parts[i].weights;
    if (p.K != first.K) {
      return Invalid(absl::StrCat("fused parts differ in K: '", prefixes[0], "' has K = ", first.K, ", '", prefixes[i],
                                  "' has K = ", p.K));
    }
    N += p.N;
  }
  if (N > kMaxFeatures) return Invalid(absl::StrCat("fused N = ", N, " exceeds ", kMaxFeatures));
  w.N = int(N);
  const bool any_bias = std::any_of(parts.begin(), parts.end(), [](const LinearLoad& p) { return !p.bias.empty(); });
  for (const LinearLoad& p : parts) {
    if (!any_bias) break;
    if (p.bias.empty()) out.bias.insert(out.bias.end(), size_t(p.weights.N), 0.0f);  // a part without bias adds 0
    else out.bias.insert(out.bias.end(), p.bias.begin(), p.bias.end());
  }
  switch (w.format) {
    case WeightFormat::kBf16:
      for (const LinearLoad& p : parts) w.bf16.insert(w.bf16.end(), p.weights.bf16.begin(), p.weights.bf16.end());
      break;
    case WeightFormat::kInt4: {
      const gemm::Int4Weights& a = first.int4;
      w.int4.K = a.K;
      w.int4.N = w.N;
      w.int4.group_size = a.group_size;
      w.int4.g_idx = a.g_idx;
      for (size_t i = 0; i < parts.size(); ++i) {
        const gemm::Int4Weights& b = parts[i].weights.int4;
        if (b.group_size != a.group_size || b.g_idx != a.g_idx) {
          return Invalid(absl::StrCat("fused parts '", prefixes[0], "' and '", prefixes[i], "' differ in ",
                                      b.group_size != a.group_size ? "group size" : "g_idx (act-order)",
                                      "; one model needs one grouping of K"));
        }
        w.int4.q.insert(w.int4.q.end(), b.q.begin(), b.q.end());
        w.int4.scales.insert(w.int4.scales.end(), b.scales.begin(), b.scales.end());
        w.int4.zeros.insert(w.int4.zeros.end(), b.zeros.begin(), b.zeros.end());
      }
      break;
    }
    case WeightFormat::kFp8: {
      // One scale per part becomes one per channel (exact) unless all parts share it.
      bool same = true;
      for (const LinearLoad& p : parts) same = same && p.weights.fp8.scale.size() == 1 && p.weights.fp8.scale == first.fp8.scale;
      w.fp8.K = w.K;
      w.fp8.N = w.N;
      float in_scale = 0;
      for (const LinearLoad& p : parts) {
        const gemm::Fp8Weights& f = p.weights.fp8;
        w.fp8.w.insert(w.fp8.w.end(), f.w.begin(), f.w.end());
        if (!same)
          for (int n = 0; n < f.N; ++n) w.fp8.scale.push_back(f.scale_of(n));
        in_scale = std::max(in_scale, p.weights.fp8_input_scale);
      }
      if (same) w.fp8.scale = first.fp8.scale;
      // Activations are quantized once for the fused GEMM: the largest part's static scale
      // (vLLM's choice for fused layers) keeps every part's activations within E4M3's range.
      bool differ = false;
      for (const LinearLoad& p : parts) differ = differ || p.weights.fp8_input_scale != in_scale;
      if (differ) notes->push_back(absl::StrCat("fused parts have different input_scale; using the largest, ", in_scale));
      w.fp8_input_scale = in_scale;
      break;
    }
  }
  return out;
}

// X dims [-1, K] and Y dims [-1, N], or in_features / out_features; 0 where not declared.
absl::StatusOr<Sizes> DeclaredSizes(const inference::ModelConfig& config) {
  auto K = ConfigIntParam(config, "in_features", 0, 0, kMaxFeatures);
  auto N = ConfigIntParam(config, "out_features", 0, 0, kMaxFeatures);
  if (!K.ok()) return K.status();
  if (!N.ok()) return N.status();
  Sizes s{*K, *N};
  if (s.K == 0 && config.input_size() > 0 && config.input(0).dims_size() == 2 && config.input(0).dims(1) > 0)
    s.K = config.input(0).dims(1);
  if (s.N == 0 && config.output_size() > 0 && config.output(0).dims_size() == 2 && config.output(0).dims(1) > 0)
    s.N = config.output(0).dims(1);
  return s;
}

absl::Status CheckDeclared(const inference::ModelConfig& config, const Sizes& d, const LinearWeights& w,
                           const std::string& source) {
  auto mismatch = [&](const char* what, const char* where, int64_t declared, int64_t found) {
    return Invalid(absl::StrCat("the config declares ", what, " = ", declared, " (", where, ") but the weights in ",
                                source, " have ", what, " = ", found));
  };
  if (d.K > 0 && d.K != w.K) return mismatch("K", "in_features, or X dims [-1, K]", d.K, w.K);
  if (d.N > 0 && d.N != w.N) return mismatch("N", "out_features, or Y dims [-1, N]", d.N, w.N);
  if (config.input_size() > 0 && config.input(0).dims_size() == 2 && config.input(0).dims(1) != -1 &&
      config.input(0).dims(1) != w.K)
    return mismatch("K", "X dims [-1, K]", config.input(0).dims(1), w.K);
  if (config.output_size() > 0 && config.output(0).dims_size() == 2 && config.output(0).dims(1) != -1 &&
      config.output(0).dims(1) != w.N)
    return mismatch("N", "Y dims [-1, N]", config.output(0).dims(1), w.N);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LinearLoad> LoadLinear(const std::string& model_dir, const inference::ModelConfig& config,
                                      CheckpointCache& cache) {
  const std::string source_param = ConfigParam(config, "checkpoint", "");
  const bool bare = source_param.empty();
  std::string source = (fs::path(model_dir) / "model.safetensors").string();
  if (!bare) {
    const fs::path p(source_param);
    source = p.is_absolute() ? p.string() : (fs::path(model_dir) / p).lexically_normal().string();
  }
  auto ckpt = cache.Open(source, /*with_metadata=*/!bare);
  if (!ckpt.ok()) return ckpt.status();

  std::vector<std::string> prefixes;
  for (absl::string_view p : absl::StrSplit(ConfigParam(config, "tensor", ""), ','))
    prefixes.emplace_back(absl::StripAsciiWhitespace(p));
  if (prefixes.size() > 1 && std::any_of(prefixes.begin(), prefixes.end(), [](const std::string& p) { return p.empty(); }))
    return Invalid(absl::StrCat("parameter tensor '", ConfigParam(config, "tensor", ""), "' has an empty prefix"));

  // The bare form reads no metadata: its format is what the parameters say.
  const QuantMetadata none;
  const QuantMetadata& meta = bare ? none : (*ckpt)->quant();
  LinearLoad result;
  std::vector<LinearLoad> parts;
  auto sizes = DeclaredSizes(config);
  if (!sizes.ok()) return sizes.status();
  for (const std::string& prefix : prefixes) {
    Scheme scheme;
    scheme.origin = bare ? "the parameters" : absl::StrCat("checkpoint ", (*ckpt)->path(), " (no quantization metadata)");
    if (!meta.empty()) {
      if (auto s = SchemeFromMetadata(meta, prefix, &scheme, &result.notes); !s.ok()) return s;
    }
    if (auto s = ApplyParameters(config, !meta.empty(), &scheme, &result.notes); !s.ok()) return s;
    // A fused model's parts share K; N is theirs. A single part gets the declared N.
    Sizes part_sizes{sizes->K, prefixes.size() == 1 ? sizes->N : 0};
    auto part = LoadPart(TensorReader(**ckpt, prefix), **ckpt, scheme, part_sizes, &result.notes);
    if (!part.ok()) return part.status();
    parts.push_back(*std::move(part));
  }
  std::vector<std::string> notes = std::move(result.notes);
  auto fused = Fuse(std::move(parts), prefixes, &notes);
  if (!fused.ok()) return fused.status();
  result = *std::move(fused);
  result.notes = std::move(notes);
  if (auto s = CheckDeclared(config, *sizes, result.weights, (*ckpt)->path()); !s.ok()) return s;
  // The notes repeat per part of a fused model; keep one of each.
  std::vector<std::string> unique;
  for (const std::string& n : result.notes)
    if (std::find(unique.begin(), unique.end(), n) == unique.end()) unique.push_back(n);
  result.notes = std::move(unique);
  return result;
}

}  // namespace flashq::server
