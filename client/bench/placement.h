// How a request's tensors go into a client slot's shared-memory Region, and the check
// that every response passes, whether its outputs came in the message or in a region.
//
// Layout in the region: the inputs from its start, the requested outputs packed at its
// end, each at a 64-byte boundary; a range is sized exactly for its tensor. Inputs with
// resident bytes (workload.h) are not written: they name the region's random bytes at
// their place. Outputs at the end keep those bytes random for later requests: while every
// request's outputs are in a fixed ratio to its inputs, as in every workload here, a
// request's inputs never reach a range an earlier request's outputs used.
//
// Before the call the first and last 8 bytes of each output range are set to 0xFF, a NaN
// in FP16, BF16 and FP32 that no model here returns for finite inputs, so that the check
// can tell that the server wrote the output. The check reads only those bytes: it costs
// the same for a 1 KB and a 100 MB output, and it leaves CUDA outputs on the GPU.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "client/bench/shm_region.h"
#include "grpc_service.pb.h"

namespace flashq::bench {

// What a request puts in a region: its inputs (in raw_input_contents, or of
// `resident_bytes` where those are given, as in Work) and outputs of `output_bytes` (one
// entry per requested output).
struct Placement {
  std::span<const int64_t> output_bytes, resident_bytes;
};

// Region bytes PlaceInRegion needs for `req`.
size_t PlacedBytes(const inference::ModelInferRequest& req, const Placement& what);

// A copy of `req` whose inputs and requested outputs name ranges of `region`, with the
// input bytes written there (but for resident ones) and the outputs' marks set.
absl::StatusOr<inference::ModelInferRequest> PlaceInRegion(const inference::ModelInferRequest& req,
                                                           const Placement& what, Region& region);

// OK when every output that `sent` requests is in `resp`, with a known datatype, and its
// bytes (shape x datatype) are its raw_output_contents entry or, for an output in
// `region`, fill its range there and were written by the server.
absl::Status CheckOutputs(const inference::ModelInferRequest& sent, const inference::ModelInferResponse& resp,
                          Region* region);

}  // namespace flashq::bench
