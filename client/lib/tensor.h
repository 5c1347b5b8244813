// Tensor helpers for KServe v2 requests: FP16/BF16/FP32/INT32 encoding into
// raw_input_contents (row-major, little-endian), decoding of raw outputs, and the
// request parameters flashq understands (causal, softmax_scale, Triton's sequence
// parameters). Everything works on the generated inference:: messages, so a caller
// can mix these helpers with hand-written protobuf code.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "common/dtype.h"

namespace flashq::client {

// Encodes floats into the bytes of `dtype` (FP16/BF16 round to nearest even; FP32 copies).
std::string EncodeFloats(std::span<const float> values, DType dtype);
// Decodes raw bytes of `dtype` (FP16, BF16 or FP32) into floats.
absl::StatusOr<std::vector<float>> DecodeFloats(std::string_view raw, DType dtype);
// Parses a KServe datatype string ("FP16", "BF16", "FP32", "INT32", ...).
absl::StatusOr<DType> ParseDType(std::string_view name);

int64_t NumElements(std::span<const int64_t> shape);

// Appends an input whose bytes travel in raw_input_contents. `raw` must hold
// NumElements(shape) * DTypeSize(dtype) bytes; that is checked.
absl::Status AddRawInput(inference::ModelInferRequest& req, std::string_view name, DType dtype,
                         std::span<const int64_t> shape, std::string raw);
// Convenience: encodes `values` as `dtype` and appends the input.
absl::Status AddFloatInput(inference::ModelInferRequest& req, std::string_view name, DType dtype,
                           std::span<const int64_t> shape, std::span<const float> values);
absl::Status AddInt32Input(inference::ModelInferRequest& req, std::string_view name,
                           std::span<const int64_t> shape, std::span<const int32_t> values);
void RequestOutput(inference::ModelInferRequest& req, std::string_view name);

// Triton's shared-memory parameters (shared_memory_region, shared_memory_byte_size,
// shared_memory_offset): the tensor's bytes are [offset, offset + byte_size) of a
// registered region instead of the message. An input so placed has no
// raw_input_contents entry: the entries are one per input outside shared memory.
struct SharedMemoryRef {
  std::string region;
  int64_t byte_size = 0;
  int64_t offset = 0;
};
void SetSharedMemory(inference::ModelInferRequest::InferInputTensor& input, const SharedMemoryRef& ref);
void SetSharedMemory(inference::ModelInferRequest::InferRequestedOutputTensor& output, const SharedMemoryRef& ref);
// The region a tensor's parameters name, if any (malformed parameters read as none).
std::optional<SharedMemoryRef> SharedMemoryOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& params);

// Triton's sequence parameters, used by stateful models such as kv_attention.
void SetSequence(inference::ModelInferRequest& req, uint64_t sequence_id, bool start, bool end);
// Returns the request's sequence_id parameter, or 0 when it has none (0 means "no sequence").
uint64_t SequenceId(const inference::ModelInferRequest& req);

void SetBoolParam(inference::ModelInferRequest& req, std::string_view key, bool v);
void SetDoubleParam(inference::ModelInferRequest& req, std::string_view key, double v);

// A decoded view of one output tensor of a response.
struct OutputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string_view raw;  // points into the response; valid while it lives
};
absl::StatusOr<OutputTensor> FindOutput(const inference::ModelInferResponse& resp, std::string_view name);
absl::StatusOr<std::vector<float>> OutputAsFloats(const inference::ModelInferResponse& resp,
                                                  std::string_view name);

}  // namespace flashq::client
