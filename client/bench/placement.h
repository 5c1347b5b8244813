// How a request's tensors go into a client slot's shared-memory Region, and the check
// that every response passes, whether its outputs came in the message or in a region.
//
// Layout in the region: each input's bytes, then each requested output's range, each
// at a 64-byte boundary; a range is sized exactly for its output. Before the call the
// first and last 8 bytes of each output range are set to 0xFF, a NaN in FP16, BF16 and
// FP32 that no model here returns for finite inputs, so that the check can tell that
// the server wrote the output. The check reads only those bytes: it costs the same for
// a 1 KB and a 100 MB output, and it leaves CUDA outputs on the GPU.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "client/bench/shm_region.h"
#include "grpc_service.pb.h"

namespace flashq::bench {

// Region bytes PlaceInRegion needs for `req` (inputs in raw_input_contents) and outputs
// of `output_bytes` (one entry per requested output).
size_t PlacedBytes(const inference::ModelInferRequest& req, std::span<const int64_t> output_bytes);

// A copy of `req` whose inputs and requested outputs name ranges of `region`, with the
// input bytes written there and the outputs' marks set.
absl::StatusOr<inference::ModelInferRequest> PlaceInRegion(const inference::ModelInferRequest& req,
                                                           std::span<const int64_t> output_bytes, Region& region);

// OK when every output that `sent` requests is in `resp`, with a known datatype, and its
// bytes (shape x datatype) are its raw_output_contents entry or, for an output in
// `region`, fill its range there and were written by the server.
absl::Status CheckOutputs(const inference::ModelInferRequest& sent, const inference::ModelInferResponse& resp,
                          Region* region);

}  // namespace flashq::bench
