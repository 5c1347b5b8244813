// Loads a linear layer's weights from a checkpoint into the canonical host form the
// backends take (LinearWeights), reading each tensor once from its mapped file.
//
// Where the weights come from (config.pbtxt parameters):
//   checkpoint  a Hugging Face folder (sharded through model.safetensors.index.json, or
//               one model.safetensors) or one .safetensors file; relative to the model
//               folder. Its quantization metadata (config.json's quantization_config,
//               quantize_config.json) says the format.
//   tensor      the tensor prefix, e.g. "model.layers.7.mlp.up_proj"; several prefixes
//               separated by commas make one fused model, concatenated along N
//               (q,k,v -> qkv_proj; gate,up -> gate_up_proj).
// Without `checkpoint`: the model folder's model.safetensors with bare names (weight,
// qweight, ...), in the format the `weight_format` parameter names; no metadata.
//
// Parameters that restate the format (weight_format, group_size, symmetric) must agree
// with the metadata: a contradiction is refused. gptq_version and fp8_activation may
// override it; each override is reported in `notes` (the server logs them).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model_config.pb.h"
#include "server/backends/backend.h"
#include "server/repository/checkpoint.h"

namespace flashq::server {

struct LinearLoad {
  LinearWeights weights;
  std::vector<float> bias;         // [N]; empty when the checkpoint has none
  std::vector<std::string> notes;  // what was detected or overridden, for the log
};

// `cache` maps each file once for every model that reads it.
absl::StatusOr<LinearLoad> LoadLinear(const std::string& model_dir, const inference::ModelConfig& config,
                                      CheckpointCache& cache);

}  // namespace flashq::server
