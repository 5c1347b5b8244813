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

// The largest dimension a request may carry (INT32_MAX): shapes narrow to int safely.
constexpr int64_t kMaxDimension = 2147483647;
// The longest string sequence_id accepted.
constexpr size_t kMaxSequenceIdBytes = 256;

// INVALID_ARGUMENT for: an input the model does not declare, a duplicate, an unknown
// datatype, a dimension outside 0..kMaxDimension, raw bytes that do not match shape x
// datatype, a count of raw_input_contents that differs from the inputs, typed contents
// sent beside raw bytes, a missing required input, an output not declared or requested
// twice. RESOURCE_EXHAUSTED for a tensor over the model's max_tensor_bytes.
absl::StatusOr<DecodedInputs> DecodeInputs(const inference::ModelInferRequest& request,
                                           const inference::ModelConfig& config);

// Request parameters (Triton's `parameters` map). Type mismatches are INVALID_ARGUMENT.
absl::StatusOr<bool> BoolParam(const inference::ModelInferRequest& request, const std::string& key, bool def);
absl::StatusOr<std::optional<double>> DoubleParam(const inference::ModelInferRequest& request, const std::string& key);
// sequence_id as a key: a uint64 or int64 parameter (Triton reads an int64 as its uint64
// bits) gives its decimal digits, a string parameter gives the string in double quotes,
// so the number 42 and the string "42" are different sequences, as in Triton. Empty when
// absent, 0 or "". A string over kMaxSequenceIdBytes is INVALID_ARGUMENT.
absl::StatusOr<std::string> SequenceIdParam(const inference::ModelInferRequest& request);

// Whether the client asked for output `name`; with no `outputs` listed, `by_default` decides.
bool WantsOutput(const inference::ModelInferRequest& request, const std::string& name, bool by_default);

}  // namespace flashq::server
