// Triton's model_warmup: sample requests that a model runs at load, through its own
// request path (Prepare, Admit, Execute), before the server reports ready. The kernels
// are warmed up by the backend regardless; the samples add the shapes an operator expects
// to serve first, and a sample the model refuses stops the load with the model's error.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/core/model.h"

namespace flashq::server {

// Runs every sample of model.config().model_warmup(), each `count` times (at least once).
// Inputs: zero_data zeros; random_data uniform in [-1, 1) for float types and zeros for
// integer ones (a random length table would be refused); input_data_file the raw bytes of
// `<dir>/warmup/<file>`, as in Triton. A kv_attention sample runs as a one-request sequence.
absl::Status RunModelWarmup(Model& model, const std::string& dir);

}  // namespace flashq::server
