// ModelInfer messages: requests decoded from, and responses encoded into, gRPC's byte
// buffers without copying the tensors' bytes; and the protobuf response the HTTP frontend
// and ModelStreamInfer build.
//
// protobuf would copy each raw_input_contents out of gRPC's receive slices when it parses
// a request, and each raw_output_contents into a new buffer when it serializes a response:
// for a ragged attention prefill that is ~20 MB a request on gRPC's and the batch workers'
// threads (docs/perf/server.md). Here a request's raw_input_contents stay in the slices it
// arrived in, as views, and protobuf parses the rest (names, shapes, parameters). A
// response is its small protobuf head followed by each output's bytes in a slice that owns
// the output's buffer. The bytes on the wire are protobuf's, so clients see no difference.
#pragma once

#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "grpc_service.pb.h"
#include "server/core/request_decoder.h"
#include "server/core/work.h"

namespace flashq::server {

// A received ModelInferRequest: `message` without its raw_input_contents, which are in
// `raw`, as views into `slices`.
struct RawInferRequest {
  std::vector<grpc::Slice> slices;
  inference::ModelInferRequest message;
  RawContents raw;
};

// Parses a serialized ModelInferRequest, in pieces, into `out`, which keeps the slices.
// INVALID_ARGUMENT, saying where, for bytes that are not a ModelInferRequest.
absl::Status ParseRawInferRequest(std::vector<grpc::Slice> slices, RawInferRequest* out);
// The same for a request as gRPC received it (its slices are shared, not copied).
absl::Status ParseRawInferRequest(const grpc::ByteBuffer& buffer, RawInferRequest* out);

// Moves a finished work's outputs into a response (raw_output_contents). An output
// written to shared memory gets its name, datatype and shape and an empty
// raw_output_contents entry, as in Triton, so that entries stay one per output.
void FillInferResponse(const inference::ModelInferRequest& request, Work& work,
                       inference::ModelInferResponse* response);

// The same response, serialized: byte for byte what FillInferResponse and protobuf's
// serializer give, with the outputs' buffers moved into the slices, not copied.
grpc::ByteBuffer SerializeInferResponse(const inference::ModelInferRequest& request, Work& work);

// A ModelStreamInfer answer, serialized: the response above as infer_response when `status`
// is OK (work not null), else error_message ("CODE: message") with the request's id and
// model name, as Triton answers a failed request on a stream.
grpc::ByteBuffer SerializeStreamResponse(const absl::Status& status, const inference::ModelInferRequest& request,
                                         Work* work);

}  // namespace flashq::server
