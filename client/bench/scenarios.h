// Named scenarios (presets) and the construction of their workloads. A scenario
// is a model plus the shape distributions of its requests; flags given on the
// command line override a preset's fields.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench/workload.h"

namespace flashq::bench {

struct ScenarioSpec {
  enum class Kind { kAttention, kKv, kLinear };
  std::string name;
  Kind kind = Kind::kAttention;
  std::string model;
  std::string dtype = "fp16";
  std::string concurrency;  // the preset's own sweep, used when neither --concurrency nor --request-rate is given
  // attention and kv_attention
  int heads_q = 8, heads_kv = 2, head_dim = 64;
  // attention
  std::string seq_len = "fixed:128", seqs_per_request = "fixed:1", kv_extra = "fixed:0";
  bool causal = true;
  bool cu_seqlens = true;
  // kv_attention
  std::string prefill_len = "fixed:128", decode_steps = "fixed:16";
  // linear
  std::string m = "fixed:8";
  int64_t k = 0;  // 0: from ModelMetadata (X's last dimension), else by name
  int64_t n = 0;  // 0: from ModelMetadata (Y's last dimension), else unknown
  bool resident_inputs = false;  // see workload.h
};

struct PresetInfo {
  std::string name, help;
};
const std::vector<PresetInfo>& Presets();
absl::StatusOr<ScenarioSpec> Preset(std::string_view name);
// The workload kind a model name implies: attention, kv_attention, anything else is a linear layer.
ScenarioSpec::Kind KindForModel(std::string_view model);
absl::StatusOr<ScenarioSpec::Kind> ParseKind(std::string_view s);
absl::StatusOr<std::unique_ptr<Workload>> BuildWorkload(const ScenarioSpec& spec, uint64_t seed);

}  // namespace flashq::bench
