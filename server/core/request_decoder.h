// Generic decoding of a ModelInferRequest against the model's config: tensor names,
// datatypes, shapes and byte sizes. Model kinds add their own checks on top.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "model_config.pb.h"
#include "server/core/tensor.h"

namespace flashq::server {

struct DecodedInputs {
  std::map<std::string, InputTensor> tensors;
  std::vector<std::unique_ptr<std::string>> owned;  // typed `contents` converted to raw bytes

  const InputTensor* Find(const std::string& name) const;
};

// INVALID_ARGUMENT for: an input the model does not declare, a duplicate, an unknown
// datatype, a negative dimension, raw bytes that do not match shape x datatype, a
// count of raw_input_contents that differs from the inputs, a missing required input.
absl::StatusOr<DecodedInputs> DecodeInputs(const inference::ModelInferRequest& request,
                                           const inference::ModelConfig& config);

// Request parameters (Triton's `parameters` map). Type mismatches are INVALID_ARGUMENT.
absl::StatusOr<bool> BoolParam(const inference::ModelInferRequest& request, const std::string& key, bool def);
absl::StatusOr<std::optional<double>> DoubleParam(const inference::ModelInferRequest& request, const std::string& key);
// sequence_id may be a uint64, int64 or string parameter; empty when absent or 0.
absl::StatusOr<std::string> SequenceIdParam(const inference::ModelInferRequest& request);

// Whether the client asked for output `name`; with no `outputs` listed, `by_default` decides.
bool WantsOutput(const inference::ModelInferRequest& request, const std::string& name, bool by_default);

}  // namespace flashq::server
