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
  // One line per field the config sets that flashq ignores (config_policy.h), with its
  // file and line; the server logs them at load.
  std::vector<std::string> warnings;
};

// Reads every sub-folder that holds a config.pbtxt. A malformed config is an error that
// names the file and the line (the server refuses to start on it).
absl::StatusOr<std::vector<ModelEntry>> ScanModelRepository(const std::string& root);

// Parses and checks one config.pbtxt; `folder` is the model folder's name (the default
// model name). Errors read "<path>:<line>:<column>: <message>" (syntax) or
// "<path>:<line>: <field> is refused: <why>" (config_policy.h). Fields accepted but
// ignored are described in `warnings` (may be null).
absl::StatusOr<inference::ModelConfig> ParseModelConfigFile(const std::string& path, const std::string& folder,
                                                            std::vector<std::string>* warnings = nullptr);


}  // namespace flashq::server
