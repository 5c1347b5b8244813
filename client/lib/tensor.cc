#include "client/lib/tensor.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace flashq::client {

std::string EncodeFloats(std::span<const float> values, DType dtype) {
  std::string out;
  if (dtype == DType::kF32) {
    out.resize(values.size() * 4);
    if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  out.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h = dtype == DType::kBF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

absl::StatusOr<std::vector<float>> DecodeFloats(std::string_view raw, DType dtype) {
  const int es = DTypeSize(dtype);
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
    return absl::InvalidArgumentError(absl::StrFormat("cannot decode %s as floats", DTypeName(dtype)));
  if (raw.size() % es != 0)
    return absl::InvalidArgumentError(absl::StrFormat("%d bytes is not a whole number of %s", raw.size(),
                                                      DTypeName(dtype)));
  std::vector<float> out(raw.size() / es);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  }
  return out;
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI64, DType::kU8})
    if (DTypeName(t) == name) return t;
  return absl::InvalidArgumentError(absl::StrFormat("unknown datatype '%s'", name));
}

int64_t NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status AddRawInput(inference::ModelInferRequest& req, std::string_view name, DType dtype,
                         std::span<const int64_t> shape, std::string raw) {
  for (int64_t d : shape)
    if (d < 0) return absl::InvalidArgumentError(absl::StrFormat("input %s: negative dimension", name));
  const int64_t want = NumElements(shape) * DTypeSize(dtype);
  if (int64_t(raw.size()) != want)
    return absl::InvalidArgumentError(
        absl::StrFormat("input %s: %d bytes given, shape needs %d", name, raw.size(), want));
  // raw_input_contents is positional: every input must use it, one entry per input.
  if (req.raw_input_contents_size() != req.inputs_size())
    return absl::FailedPreconditionError("request mixes raw and typed inputs");
  auto* in = req.add_inputs();
  in->set_name(std::string(name));
  in->set_datatype(std::string(DTypeName(dtype)));
  for (int64_t d : shape) in->add_shape(d);
  *req.add_raw_input_contents() = std::move(raw);
  return absl::OkStatus();
}

absl::Status AddFloatInput(inference::ModelInferRequest& req, std::string_view name, DType dtype,
                           std::span<const int64_t> shape, std::span<const float> values) {
  if (int64_t(values.size()) != NumElements(shape))
    return absl::InvalidArgumentError(absl::StrFormat("input %s: %d values for shape of %d elements", name,
                                                      values.size(), NumElements(shape)));
  return AddRawInput(req, name, dtype, shape, EncodeFloats(values, dtype));
}

absl::Status AddInt32Input(inference::ModelInferRequest& req, std::string_view name,
                           std::span<const int64_t> shape, std::span<const int32_t> values) {
  std::string raw(values.size() * 4, '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  return AddRawInput(req, name, DType::kI32, shape, std::move(raw));
}

void RequestOutput(inference::ModelInferRequest& req, std::string_view name) {
  req.add_outputs()->set_name(std::string(name));
}

namespace {

void SetSharedMemoryParams(google::protobuf::Map<std::string, inference::InferParameter>& p, const SharedMemoryRef& ref) {
  p["shared_memory_region"].set_string_param(ref.region);
  p["shared_memory_byte_size"].set_int64_param(ref.byte_size);
  p["shared_memory_offset"].set_int64_param(ref.offset);
}

std::optional<int64_t> IntParam(const google::protobuf::Map<std::string, inference::InferParameter>& params,
                                const char* key) {
  auto it = params.find(key);
  if (it == params.end()) return std::nullopt;
  switch (it->second.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param: return it->second.int64_param();
    case inference::InferParameter::kUint64Param: return int64_t(it->second.uint64_param());
    default: return std::nullopt;
  }
}

}  // namespace

void SetSharedMemory(inference::ModelInferRequest::InferInputTensor& input, const SharedMemoryRef& ref) {
  SetSharedMemoryParams(*input.mutable_parameters(), ref);
}

void SetSharedMemory(inference::ModelInferRequest::InferRequestedOutputTensor& output, const SharedMemoryRef& ref) {
  SetSharedMemoryParams(*output.mutable_parameters(), ref);
}

std::optional<SharedMemoryRef> SharedMemoryOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& params) {
  auto region = params.find("shared_memory_region");
  if (region == params.end() || region->second.parameter_choice_case() != inference::InferParameter::kStringParam)
    return std::nullopt;
  auto size = IntParam(params, "shared_memory_byte_size");
  if (!size) return std::nullopt;
  SharedMemoryRef ref;
  ref.region = region->second.string_param();
  ref.byte_size = *size;
  ref.offset = IntParam(params, "shared_memory_offset").value_or(0);
  return ref;
}

void SetSequence(inference::ModelInferRequest& req, uint64_t sequence_id, bool start, bool end) {
  auto& p = *req.mutable_parameters();
  p["sequence_id"].set_uint64_param(sequence_id);
  p["sequence_start"].set_bool_param(start);
  p["sequence_end"].set_bool_param(end);
}

uint64_t SequenceId(const inference::ModelInferRequest& req) {
  auto it = req.parameters().find("sequence_id");
  if (it == req.parameters().end()) return 0;
  const auto& p = it->second;
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kUint64Param: return p.uint64_param();
    case inference::InferParameter::kInt64Param: return uint64_t(p.int64_param());
    default: return 0;
  }
}

void SetBoolParam(inference::ModelInferRequest& req, std::string_view key, bool v) {
  (*req.mutable_parameters())[std::string(key)].set_bool_param(v);
}
void SetDoubleParam(inference::ModelInferRequest& req, std::string_view key, double v) {
  (*req.mutable_parameters())[std::string(key)].set_double_param(v);
}

absl::StatusOr<OutputTensor> FindOutput(const inference::ModelInferResponse& resp, std::string_view name) {
  for (int i = 0; i < resp.outputs_size(); ++i) {
    const auto& o = resp.outputs(i);
    if (o.name() != name) continue;
    auto dt = ParseDType(o.datatype());
    if (!dt.ok()) return dt.status();
    OutputTensor t;
    t.name = o.name();
    t.dtype = *dt;
    t.shape.assign(o.shape().begin(), o.shape().end());
    if (i >= resp.raw_output_contents_size())
      return absl::InvalidArgumentError(absl::StrFormat("output %s has no raw contents", name));
    t.raw = resp.raw_output_contents(i);
    if (int64_t(t.raw.size()) != NumElements(t.shape) * DTypeSize(t.dtype))
      return absl::InvalidArgumentError(absl::StrFormat("output %s: %d bytes for its shape", name, t.raw.size()));
    return t;
  }
  return absl::NotFoundError(absl::StrFormat("response has no output '%s'", name));
}

absl::StatusOr<std::vector<float>> OutputAsFloats(const inference::ModelInferResponse& resp,
                                                  std::string_view name) {
  auto t = FindOutput(resp, name);
  if (!t.ok()) return t.status();
  return DecodeFloats(t->raw, t->dtype);
}

}  // namespace flashq::client
