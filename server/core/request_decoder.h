// Generic decoding of a ModelInferRequest against the model's config: tensor names,
// datatypes, shapes and byte sizes. Model kinds add their own checks on top.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "model_config.pb.h"
#include "server/core/shared_memory.h"
#include "server/core/tensor.h"
#include "server/core/work.h"

namespace flashq::server {

// raw_input_contents left in the transport's receive buffers, each in one or more pieces.
using RawContents = std::vector<std::vector<std::string_view>>;

// Where a request's tensor bytes are, besides the message's own fields.
struct RequestBytes {
  // When not empty, the raw_input_contents (the message then holds none).
  RawContents raw;
  // The registered regions that inputs and outputs may name; null: such tensors are refused.
  const SharedMemoryRegistry* shared_memory = nullptr;
};

struct DecodedInputs {
  std::map<std::string, InputTensor> tensors;
  std::vector<std::unique_ptr<std::string>> owned;  // typed `contents` converted to raw bytes
  std::vector<SharedMemoryBuffer> regions;          // keep inputs read from shared memory mapped

  const InputTensor* Find(const std::string& name) const;
};

// The largest dimension a request may carry (INT32_MAX): shapes narrow to int safely.
constexpr int64_t kMaxDimension = 2147483647;
// The longest string sequence_id accepted.
constexpr size_t kMaxSequenceIdBytes = 256;

// A tensor's place in a shared-memory region, from Triton's tensor parameters
// shared_memory_region (string), shared_memory_byte_size (integer, required with a
// region) and shared_memory_offset (integer, default 0).
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0, byte_size = 0;
};
// nullopt when the tensor names no region. INVALID_ARGUMENT, naming the tensor, for a
// parameter of the wrong type, a negative offset or size, or one without the region.
// `kind` is "input" or "output".
absl::StatusOr<std::optional<SharedMemoryRef>> SharedMemoryParams(
    const google::protobuf::Map<std::string, inference::InferParameter>& params, const std::string& tensor,
    const char* kind);

// INVALID_ARGUMENT for: an input the model does not declare, a duplicate, an unknown
// datatype, a dimension outside 0..kMaxDimension, raw bytes that do not match shape x
// datatype, a count of raw_input_contents that differs from the inputs not in shared
// memory, typed contents sent beside raw bytes or beside a shared-memory region, a
// missing required input, an output not declared or requested twice.
// RESOURCE_EXHAUSTED for a tensor over the model's max_tensor_bytes.
// Raw bytes are read in place, from the message or from bytes.raw (fragmented FP16, BF16
// and FP32 tensors stay in fragments; others are joined). An input in a region of
// bytes.shared_memory is read in place: its shared_memory_byte_size must equal shape x
// datatype (INVALID_ARGUMENT), and the region's errors (NOT_FOUND for one not registered,
// INVALID_ARGUMENT for a range outside it) name the input too. With bytes.shared_memory
// null, such inputs are UNIMPLEMENTED.
absl::StatusOr<DecodedInputs> DecodeInputs(const inference::ModelInferRequest& request, const RequestBytes& bytes,
                                           const inference::ModelConfig& config);

// Binds the outputs that `request` asks to receive in shared-memory regions into
// work.shm_outputs, after Prepare (work.output_sizes holds each output's size). Before
// compute, so that nothing is computed for an answer that cannot be delivered:
// INVALID_ARGUMENT when a region's shared_memory_byte_size is smaller than its output,
// and the errors of SharedMemoryRegistry::Find; each names the output and the region.
absl::Status BindSharedMemoryOutputs(const inference::ModelInferRequest& request,
                                     const SharedMemoryRegistry* shared_memory, Work& work);

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
