// The KServe v2 HTTP/REST bodies as the gRPC messages the server runs on, and back.
//
// An inference request becomes the same inference::ModelInferRequest that gRPC delivers, so
// that both frontends share one decoder and one set of checks (InferenceServer::Infer). This
// file only translates: JSON `data` arrays and binary tensors (Triton's binary-tensor
// extension: a JSON header of Inference-Header-Content-Length bytes, then each tensor's bytes
// in input order, sized by its `binary_data_size` parameter) become raw_input_contents.
// Shapes, datatypes and sizes are checked by the decoder, not here.
#pragma once

#include <google/protobuf/message.h>

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"

namespace flashq::server {

// Which outputs the client wants as binary tensors rather than JSON `data`.
struct HttpOutputForm {
  bool binary_default = false;         // request parameter binary_data_output
  std::map<std::string, bool> binary;  // an output's own binary_data parameter
  bool Binary(const std::string& name) const {
    auto it = binary.find(name);
    return it == binary.end() ? binary_default : it->second;
  }
};

// `body` is the whole request body; `header_length` the Inference-Header-Content-Length
// value when the header was sent. INVALID_ARGUMENT naming what is malformed.
absl::Status ParseHttpInferRequest(const std::string& body, std::optional<size_t> header_length,
                                   const std::string& model, const std::string& version,
                                   inference::ModelInferRequest* request, HttpOutputForm* form);

// The response body; `header_length` is set when binary tensors follow the JSON header.
struct HttpInferResponse {
  std::string body;
  std::optional<size_t> header_length;
};
HttpInferResponse MakeHttpInferResponse(const inference::ModelInferRequest& request,
                                        inference::ModelInferResponse& response, const HttpOutputForm& form);

// A message as Triton's HTTP endpoints write it: the proto field names, 64-bit integers as
// JSON numbers (Triton's tools read them as numbers), enums by name, maps as objects, every
// scalar and repeated field present even when empty, sub-messages only when set.
std::string ProtoToJson(const google::protobuf::Message& message);

// {"error": message}, as Triton answers every failed request.
std::string JsonError(const std::string& message);

}  // namespace flashq::server
