// flashq-bench --input-data: request tensors from a file in perf_analyzer's JSON format
// instead of generated ones.
//
//   {"data": [{"X": {"content": [1, 2, ...], "shape": [2, 4096]}},        // values
//             {"X": {"content": {"b64": "..."}, "shape": [2, 4096]}},     // raw bytes
//             {"X": {"b64": "..."}},  {"X": [1, 2, ...]}, ...]}          // the model's fixed shape
//
// Each entry of "data" is one request; requests cycle through the entries in order.
// Values are encoded as the input's datatype from ModelMetadata (integers must be
// integral and in range; INT64/UINT64 values are exact up to 2^53, as JSON numbers are
// doubles); raw bytes must fill the shape exactly. Nested value lists are flattened.
// Not supported, and refused with a message: perf_analyzer's sequence form (an entry
// that is a list of steps), "validation_data", BYTES inputs, and --input-data's other forms
// (a directory of files, "zero", "random").
//
// Loading is two steps, so that a malformed file is refused before any server starts
// and the datatypes come from the server afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench/workload.h"
#include "grpc_service.pb.h"

namespace flashq::bench {

// One tensor of one entry as the file gives it.
struct InputDataTensor {
  std::string name;
  std::optional<std::vector<int64_t>> shape;  // absent: the model's fixed shape
  bool raw = false;                           // b64: `bytes` holds the tensor; else `values`
  std::string bytes;
  std::vector<double> values;
};

struct InputData {
  std::string path;
  std::vector<std::vector<InputDataTensor>> entries;
};

// Reads and checks the file's structure. Errors name the file and the place in it,
// e.g. "x.json: data[2].X.shape: ...".
absl::StatusOr<InputData> LoadInputData(const std::string& path);

struct InputDataWorkloadOptions {
  std::string model;
  // unit of throughput: the first dimension of this input ("Q" for attention: tokens,
  // "X" for linear layers: rows); empty: requests.
  std::string unit_input;
  std::string unit_name = "requests";
  std::optional<bool> causal;  // set: the request parameter `causal`
};

// Builds every entry's request against the model's inputs: each tensor must name an
// input, match its rank and fixed dimensions and fill its shape. An input the file leaves
// out is left to the server to judge: ModelMetadata does not say which inputs are optional.
absl::StatusOr<std::unique_ptr<Workload>> MakeInputDataWorkload(const InputData& data,
                                                                 const inference::ModelMetadataResponse& metadata,
                                                                 const InputDataWorkloadOptions& options);

}  // namespace flashq::bench
