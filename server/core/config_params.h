// Typed access to a model config's string parameters (config.pbtxt `parameters`).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model_config.pb.h"

namespace flashq::server {

// String parameter of a model config, with a default.
std::string ConfigParam(const inference::ModelConfig& config, const std::string& key, const std::string& def);
// An integer parameter, checked against [lo, hi] before anything narrows or allocates
// with it; the error names the parameter, its value and the range.
absl::StatusOr<int64_t> ConfigIntParam(const inference::ModelConfig& config, const std::string& key, int64_t def,
                                       int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);

}  // namespace flashq::server
