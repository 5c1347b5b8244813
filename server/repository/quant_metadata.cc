// Quantization metadata of Hugging Face checkpoints. The field names are those the
// writers publish:
//   AutoGPTQ / GPTQModel quantize_config.json and transformers' GPTQConfig: bits,
//     group_size (-1 = channelwise), desc_act, sym, checkpoint_format ("gptq" | "gptq_v2",
//     GPTQModel also spells it "format"), is_marlin_format (AutoGPTQ < 0.8).
//   AutoAWQ (transformers' AwqConfig): bits, group_size, zero_point, version ("gemm", ...);
//     early AutoAWQ's quant_config.json: w_bit, q_group_size, zero_point, version.
//   compressed-tensors QuantizationConfig: format, quantization_status, ignore and
//     config_groups of {targets, weights, input_activations, format}, each args entry
//     {num_bits, type, strategy, group_size, block_structure, symmetric, dynamic, actorder}.
//   vLLM's Fp8Config (AutoFP8, DeepSeek-V3): activation_scheme, weight_block_size, fmt.
#include "server/repository/quant_metadata.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

class Reader {
 public:
  Reader(const JsonValue& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  absl::Status Bad(const std::string& key, const std::string& want) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": \"", key, "\" must be ", want));
  }
  absl::Status Int(const std::string& key, std::optional<int>* out) const {
    const JsonValue* v = obj_.Find(key);
    if (!v || v->is_null()) return absl::OkStatus();
    if (!v->is_int() || v->as_int() < INT32_MIN || v->as_int() > INT32_MAX) return Bad(key, "an integer");
    *out = int(v->as_int());
    return absl::OkStatus();
  }
  absl::Status Int(const std::string& key, int* out) const {
    std::optional<int> v;
    if (auto s = Int(key, &v); !s.ok()) return s;
    if (v) *out = *v;
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, std::optional<bool>* out) const {
    const JsonValue* v = obj_.Find(key);
    if (!v || v->is_null()) return absl::OkStatus();
    if (!v->is_bool()) return Bad(key, "true or false");
    *out = v->as_bool();
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, bool* out) const {
    std::optional<bool> v;
    if (auto s = Bool(key, &v); !s.ok()) return s;
    if (v) *out = *v;
    return absl::OkStatus();
  }
  // Lower-cased: the writers spell enum values in either case ("GEMM", "gemm").
  absl::Status String(const std::string& key, std::string* out) const {
    const JsonValue* v = obj_.Find(key);
    if (!v || v->is_null()) return absl::OkStatus();
    if (!v->is_string()) return Bad(key, "a string");
    *out = absl::AsciiStrToLower(v->as_string());
    return absl::OkStatus();
  }
  absl::Status Ints(const std::string& key, std::vector<int64_t>* out) const {
    const JsonValue* v = obj_.Find(key);
    if (!v || v->is_null()) return absl::OkStatus();
    if (!v->is_array()) return Bad(key, "an array of integers");
    for (const JsonValue& e : v->as_array()) {
      if (!e.is_int()) return Bad(key, "an array of integers");
      out->push_back(e.as_int());
    }
    return absl::OkStatus();
  }
  absl::Status Strings(const std::string& key, std::vector<std::string>* out) const {
    const JsonValue* v = obj_.Find(key);
    if (!v || v->is_null()) return absl::OkStatus();
    if (v->is_string()) {  // compressed-tensors accepts a single target as a string
      out->push_back(v->as_string());
      return absl::OkStatus();
    }
    if (!v->is_array()) return Bad(key, "an array of strings");
    for (const JsonValue& e : v->as_array()) {
      if (!e.is_string()) return Bad(key, "an array of strings");
      out->push_back(e.as_string());
    }
    return absl::OkStatus();
  }

 private:
  const JsonValue& obj_;
  std::string where_;
};

#define FQ_RETURN_IF(expr)             \
  do {                                 \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

absl::StatusOr<std::optional<CtQuantArgs>> ParseCtArgs(const JsonValue* v, const std::string& where) {
  if (!v || v->is_null()) return std::optional<CtQuantArgs>();
  if (!v->is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " must be an object or null"));
  Reader r(*v, where);
  CtQuantArgs a;
  std::optional<int> group;
  std::optional<bool> sym, dynamic;
  FQ_RETURN_IF(r.Int("num_bits", &a.num_bits));
  FQ_RETURN_IF(r.String("type", &a.type));
  FQ_RETURN_IF(r.String("strategy", &a.strategy));
  FQ_RETURN_IF(r.Int("group_size", &group));
  FQ_RETURN_IF(r.Ints("block_structure", &a.block_structure));
  FQ_RETURN_IF(r.Bool("symmetric", &sym));
  // "dynamic" is a bool, or the string "local" (NVFP4's local scales): either way not static.
  if (const JsonValue* d = v->Find("dynamic"); d && d->is_string()) {
    dynamic = true;
  } else {
    FQ_RETURN_IF(r.Bool("dynamic", &dynamic));
  }
  // actorder: null, false, true (= "group"), "group", "weight", "static".
  if (const JsonValue* o = v->Find("actorder"); o && o->is_bool()) {
    a.actorder = o->as_bool() ? "group" : "";
  } else {
    FQ_RETURN_IF(r.String("actorder", &a.actorder));
  }
  a.group_size = group.value_or(0);
  a.symmetric = sym.value_or(true);
  a.dynamic = dynamic.value_or(false);
  if (a.type.empty()) a.type = "int";
  return std::optional<CtQuantArgs>(std::move(a));
}

absl::Status ParseCompressedTensors(const JsonValue& c, const std::string& source, QuantMetadata* m) {
  Reader r(c, source);
  FQ_RETURN_IF(r.String("format", &m->format));
  FQ_RETURN_IF(r.String("quantization_status", &m->quantization_status));
  FQ_RETURN_IF(r.Strings("ignore", &m->ignore));
  const JsonValue* groups = c.Find("config_groups");
  if (groups && !groups->is_null()) {
    if (!groups->is_object()) return r.Bad("config_groups", "an object");
    for (const auto& [name, g] : groups->as_object()) {
      const std::string where = absl::StrCat(source, ": config_groups.", name);
      if (!g.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
      Reader gr(g, where);
      CtGroup group;
      group.name = name;
      FQ_RETURN_IF(gr.Strings("targets", &group.targets));
      FQ_RETURN_IF(gr.String("format", &group.format));
      auto w = ParseCtArgs(g.Find("weights"), where + ".weights");
      if (!w.ok()) return w.status();
      auto in = ParseCtArgs(g.Find("input_activations"), where + ".input_activations");
      if (!in.ok()) return in.status();
      group.weights = *w;
      group.input_activations = *in;
      m->groups.push_back(std::move(group));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JsonValue> ReadJsonFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << f.rdbuf();
  auto doc = ParseJson(text.str());
  if (!doc.ok()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", doc.status().message()));
  if (!doc->is_object()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
  return doc;
}

bool MatchesTarget(const std::string& target, const std::string& module) {
  if (target == "Linear") return true;  // every served model is a linear layer
  if (target.rfind("re:", 0) == 0) {
    try {  // std::regex reports a bad pattern by throwing; keep it here
      return std::regex_search(module, std::regex(target.substr(3)), std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;
    }
  }
  return target == module;
}

}  // namespace

absl::StatusOr<QuantMetadata> ParseQuantMetadata(const JsonValue& c, const std::string& source) {
  if (!c.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": must be a JSON object"));
  Reader r(c, source);
  QuantMetadata m;
  m.source = source;
  FQ_RETURN_IF(r.String("quant_method", &m.quant_method));
  // GPTQ / AWQ fields (early AutoAWQ spells them w_bit and q_group_size).
  FQ_RETURN_IF(r.Int("bits", &m.bits));
  if (m.bits == 0) FQ_RETURN_IF(r.Int("w_bit", &m.bits));
  FQ_RETURN_IF(r.Int("group_size", &m.group_size));
  if (!m.group_size) FQ_RETURN_IF(r.Int("q_group_size", &m.group_size));
  FQ_RETURN_IF(r.Bool("desc_act", &m.desc_act));
  FQ_RETURN_IF(r.Bool("sym", &m.sym));
  FQ_RETURN_IF(r.Bool("zero_point", &m.zero_point));
  FQ_RETURN_IF(r.String("checkpoint_format", &m.checkpoint_format));
  if (m.checkpoint_format.empty() && m.quant_method != "compressed-tensors") FQ_RETURN_IF(r.String("format", &m.checkpoint_format));
  FQ_RETURN_IF(r.Bool("is_marlin_format", &m.is_marlin_format));
  FQ_RETURN_IF(r.String("version", &m.version));
  // fp8
  FQ_RETURN_IF(r.String("activation_scheme", &m.activation_scheme));
  FQ_RETURN_IF(r.Ints("weight_block_size", &m.weight_block_size));
  FQ_RETURN_IF(r.String("fmt", &m.fmt));
  if (m.quant_method == "compressed-tensors") {
    m.version.clear();  // compressed-tensors' "version" is its library version, not a layout
    FQ_RETURN_IF(ParseCompressedTensors(c, source, &m));
  }
  return m;
}

absl::StatusOr<QuantMetadata> ReadQuantMetadata(const std::string& dir) {
  std::error_code ec;
  const fs::path root(dir);
  // transformers and vLLM read config.json's quantization_config first.
  if (fs::is_regular_file(root / "config.json", ec)) {
    auto doc = ReadJsonFile(root / "config.json");
    if (!doc.ok()) return doc.status();
    if (const JsonValue* q = doc->Find("quantization_config"); q && !q->is_null()) {
      return ParseQuantMetadata(*q, (root / "config.json").string() + " (quantization_config)");
    }
  }
  for (const char* name : {"quantize_config.json", "quant_config.json"}) {
    if (!fs::is_regular_file(root / name, ec)) continue;
    auto doc = ReadJsonFile(root / name);
    if (!doc.ok()) return doc.status();
    auto m = ParseQuantMetadata(*doc, (root / name).string());
    if (!m.ok()) return m.status();
    // These files predate quant_method: quantize_config.json is GPTQ's, quant_config.json AWQ's.
    if (m->quant_method.empty()) m->quant_method = std::string(name) == "quantize_config.json" ? "gptq" : "awq";
    return m;
  }
  return QuantMetadata{};
}

const CtGroup* FindCtGroup(const QuantMetadata& m, const std::string& module) {
  for (const std::string& ig : m.ignore)
    if (MatchesTarget(ig, module)) return nullptr;
  for (const CtGroup& g : m.groups)
    for (const std::string& t : g.targets)
      if (MatchesTarget(t, module)) return &g;
  return nullptr;
}

}  // namespace flashq::server
