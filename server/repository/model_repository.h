// A model repository: one folder per model holding config.pbtxt (Triton's
// ModelConfig in protobuf text format) and, for linear layers, model.safetensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model_config.pb.h"
#include "server/core/config_params.h"

namespace flashq::server {

struct ModelEntry {
  std::string dir;                 // absolute path of the model's folder
  inference::ModelConfig config;   // parsed and checked; name defaults to the folder name
};

// Reads every sub-folder that holds a config.pbtxt. A malformed config is an error that
// names the file and the line (the server refuses to start on it).
absl::StatusOr<std::vector<ModelEntry>> ScanModelRepository(const std::string& root);

// Parses and checks one config.pbtxt; `folder` is the model folder's name (the default
// model name). Errors read "<path>:<line>:<column>: <message>".
absl::StatusOr<inference::ModelConfig> ParseModelConfigFile(const std::string& path, const std::string& folder);


}  // namespace flashq::server
