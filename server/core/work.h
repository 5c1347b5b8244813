// A unit of work: one decoded, validated inference request on its way through
// the batcher to a backend. Model kinds derive from it to carry their inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/tensor.h"

namespace flashq::server {

struct Work {
  virtual ~Work() = default;

  int64_t tokens = 1;          // what the batch's token budget counts
  int64_t output_bytes = 0;    // bytes of the outputs asked for, known before compute
  std::string batch_key;       // only works with equal keys share a batch
  std::string exclusive_key;   // non-empty: works with equal keys never share a batch nor run at once

  // Filled by the model's Execute.
  absl::Status status;
  std::vector<OutputTensor> outputs;
};

}  // namespace flashq::server
