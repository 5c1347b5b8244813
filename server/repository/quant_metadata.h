// What a Hugging Face checkpoint says about how its linear layers are quantized, read
// from config.json's "quantization_config" or, for checkpoints that keep it apart,
// quantize_config.json (AutoGPTQ, GPTQModel) or quant_config.json (early AutoAWQ).
// Parsing keeps the checkpoint's own words; deciding what to load (and refusing what
// the kernels cannot serve) is the linear loader's job.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/repository/json.h"

namespace flashq::server {

// compressed-tensors QuantizationArgs (one "weights" or "input_activations" entry).
struct CtQuantArgs {
  int num_bits = 0;
  std::string type;      // "int" | "float"
  std::string strategy;  // "tensor" | "channel" | "group" | "block" | "token"
  int group_size = 0;
  std::vector<int64_t> block_structure;
  bool symmetric = true;
  bool dynamic = false;
  std::string actorder;  // "" (none), "group", "weight"
};

// One compressed-tensors config group: the modules it targets and how they are stored.
struct CtGroup {
  std::string name;
  std::vector<std::string> targets;  // "Linear", "re:<regex>" or module names
  std::optional<CtQuantArgs> weights, input_activations;
  std::string format;  // the group's own format; empty: the config's
};

struct QuantMetadata {
  std::string source;        // e.g. "config.json (quantization_config)"; empty when the checkpoint has none
  std::string quant_method;  // lower case as written: gptq, awq, compressed-tensors, fp8, ...
  // GPTQ and AWQ
  int bits = 0;
  std::optional<int> group_size;  // -1: channelwise
  std::optional<bool> desc_act, sym, zero_point;
  std::string checkpoint_format;  // GPTQ: "gptq" (v1 zeros), "gptq_v2", "marlin", ...
  bool is_marlin_format = false;  // AutoGPTQ before checkpoint_format existed
  std::string version;            // AWQ kernel layout: "gemm", "gemv", ...
  // compressed-tensors
  std::string format;             // "pack-quantized", "float-quantized", "naive-quantized", ...
  std::string quantization_status;
  std::vector<CtGroup> groups;
  std::vector<std::string> ignore;
  // fp8 (vLLM / AutoFP8 / DeepSeek-V3)
  std::string activation_scheme;  // "static" | "dynamic"
  std::vector<int64_t> weight_block_size;
  std::string fmt;                // "e4m3" where given

  bool empty() const { return source.empty(); }
};

// Reads the metadata of the checkpoint folder `dir`. A folder without any of the three
// files (or whose config.json has no quantization_config) gives an empty QuantMetadata.
// A malformed file, or a field of the wrong JSON type, is INVALID_ARGUMENT naming the
// file and the field.
absl::StatusOr<QuantMetadata> ReadQuantMetadata(const std::string& dir);

// Parses one quantization config object (tests; `source` names it in errors).
absl::StatusOr<QuantMetadata> ParseQuantMetadata(const JsonValue& config, const std::string& source);

// The compressed-tensors group whose targets match the module `module` (a tensor prefix
// such as "model.layers.7.mlp.up_proj"), or null when none does or `ignore` lists it.
// Matching follows compressed-tensors: "Linear" matches every linear layer, "re:<regex>"
// matches from the start of the name, anything else is a module name.
const CtGroup* FindCtGroup(const QuantMetadata& m, const std::string& module);

}  // namespace flashq::server
