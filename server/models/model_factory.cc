#include "server/models/model_factory.h"

#include <algorithm>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/models/attention_model.h"
#include "server/models/kv_attention_model.h"
#include "server/models/linear_model.h"
#include "server/models/model_warmup.h"

namespace flashq::server {
namespace {

// The tensors a model kind reads and writes. A config must declare every required one
// (an input not `optional`), may declare the optional ones, and nothing else, so that
// no request can reach a model without a tensor its code dereferences.
struct TensorRule {
  const char* name;
  bool required;
  std::initializer_list<inference::DataType> types;
};
struct KindRules {
  const char* kind;
  std::initializer_list<TensorRule> inputs, outputs;
};

constexpr auto kFloat = {inference::TYPE_FP16, inference::TYPE_BF16, inference::TYPE_FP32};
constexpr auto kHalf = {inference::TYPE_FP16, inference::TYPE_BF16};
const KindRules kRules[] = {
    {"attention",
     {{"Q", true, kFloat}, {"K", true, kFloat}, {"V", true, kFloat},
      {"CU_SEQLENS_Q", false, {inference::TYPE_INT32}}, {"CU_SEQLENS_K", false, {inference::TYPE_INT32}}},
     {{"O", true, kFloat}, {"LSE", false, {inference::TYPE_FP32}}}},
    {"kv_attention", {{"Q", true, kHalf}, {"K", true, kHalf}, {"V", true, kHalf}}, {{"O", true, kHalf}}},
    {"linear", {{"X", true, kFloat}}, {{"Y", true, kFloat}}},
};

template <typename Tensors>
absl::Status CheckTensors(const char* kind, const char* io, const Tensors& declared,
                          std::initializer_list<TensorRule> rules) {
  std::vector<std::string> names, allowed;
  for (const auto& t : declared) names.push_back(t.name());
  for (const TensorRule& r : rules) allowed.push_back(r.name);
  const std::string have = names.empty() ? "none" : absl::StrJoin(names, ", ");
  for (const auto& t : declared) {
    const TensorRule* rule = nullptr;
    for (const TensorRule& r : rules) rule = t.name() == r.name ? &r : rule;
    if (!rule) {
      return absl::InvalidArgumentError(absl::StrCat("kind ", kind, " has no ", io, " '", t.name(), "'; its ", io,
                                                     "s are ", absl::StrJoin(allowed, ", ")));
    }
    if (std::find(rule->types.begin(), rule->types.end(), t.data_type()) == rule->types.end()) {
      std::vector<std::string> types;
      for (auto d : rule->types) types.push_back(inference::DataType_Name(d));
      return absl::InvalidArgumentError(absl::StrCat(io, " '", t.name(), "' has data_type ",
                                                     inference::DataType_Name(t.data_type()), "; kind ", kind,
                                                     " takes ", absl::StrJoin(types, ", ")));
    }
  }
  for (const TensorRule& r : rules) {
    if (!r.required) continue;
    auto it = std::find_if(declared.begin(), declared.end(), [&](const auto& t) { return t.name() == r.name; });
    if (it == declared.end()) {
      return absl::InvalidArgumentError(absl::StrCat("kind ", kind, " needs ", io, " '", r.name, "'; the config declares ",
                                                     have));
    }
    if constexpr (requires { it->optional(); }) {
      if (it->optional()) {
        return absl::InvalidArgumentError(absl::StrCat(io, " '", r.name, "' is marked optional; kind ", kind,
                                                       " always needs it"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDeclaredTensors(const std::string& kind, const inference::ModelConfig& config) {
  for (const KindRules& k : kRules) {
    if (kind != k.kind) continue;
    if (auto s = CheckTensors(k.kind, "input", config.input(), k.inputs); !s.ok()) return s;
    return CheckTensors(k.kind, "output", config.output(), k.outputs);
  }
  return absl::InvalidArgumentError(absl::StrCat("parameter 'kind' is '", kind,
                                                 "'; expected attention, kv_attention or linear"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelEntry& entry, Backend& backend,
                                                   const ModelLoadOptions& options) {
  const std::string kind = ConfigParam(entry.config, "kind", "");
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (absl::Status s = CheckDeclaredTensors(kind, entry.config); !s.ok()) {
    model = s;
  } else if (kind == "attention") {
    model = AttentionModel::Create(entry.config, backend);
  } else if (kind == "kv_attention") {
    model = KvAttentionModel::Create(entry.config, backend, options.kv_cache_blocks);
  } else {
    CheckpointCache own;
    std::vector<std::string> notes;
    model = LinearModel::Create(entry.config, entry.dir, backend, options.checkpoints ? *options.checkpoints : own,
                                &notes);
    if (options.log)
      for (const std::string& n : notes) options.log(entry.config.name(), n);
  }
  if (model.ok()) {
    if (absl::Status s = RunModelWarmup(**model, entry.dir); !s.ok()) model = s;
  }
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat("loading model '", entry.config.name(), "' (", entry.dir,
                                                            "/config.pbtxt): ", model.status().message()));
  }
  return model;
}

}  // namespace flashq::server
