#include "server/core/request_decoder.h"

#include <cstring>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/client_text.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

// Typed `contents` (used by clients that do not send raw bytes) as raw little-endian bytes.
std::unique_ptr<std::string> ContentsAsRaw(DType t, const inference::InferTensorContents& c) {
  auto out = std::make_unique<std::string>();
  auto put = [&](const auto& field) {
    using T = typename std::decay_t<decltype(field)>::value_type;
    out->resize(field.size() * sizeof(T));
    if (!field.empty()) std::memcpy(out->data(), field.data(), out->size());
  };
  switch (t) {
    case DType::kF32: put(c.fp32_contents()); break;
    case DType::kI32: put(c.int_contents()); break;
    case DType::kI64: put(c.int64_contents()); break;
    default: break;  // FP16/BF16 have no typed field in the protocol: raw only
  }
  return out;
}

// Bytes that ContentsAsRaw would produce, known before copying anything.
int64_t TypedContentsBytes(DType t, const inference::InferTensorContents& c) {
  switch (t) {
    case DType::kF32: return int64_t(c.fp32_contents_size()) * 4;
    case DType::kI32: return int64_t(c.int_contents_size()) * 4;
    case DType::kI64: return int64_t(c.int64_contents_size()) * 8;
    default: return 0;
  }
}

// Whether any typed field of `contents` holds values (of any type: a client that sends
// both typed values and raw bytes has sent one of them by mistake).
bool HasTypedContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() || c.int_contents_size() || c.int64_contents_size() || c.uint_contents_size() ||
         c.uint64_contents_size() || c.fp32_contents_size() || c.fp64_contents_size() || c.bytes_contents_size();
}

}  // namespace

const InputTensor* DecodedInputs::Find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

absl::StatusOr<DecodedInputs> DecodeInputs(const inference::ModelInferRequest& request,
                                           const inference::ModelConfig& config) {
  const std::string& model = config.name();
  const int n_raw = request.raw_input_contents_size();
  if (n_raw != 0 && n_raw != request.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model, "': ", request.inputs_size(),
                                                   " inputs but ", n_raw, " raw_input_contents; expected one each"));
  }
  // Set by --max-tensor-bytes (or the model's config); checked before any tensor is copied.
  auto max_tensor_bytes = ConfigIntParam(config, "max_tensor_bytes", 0);
  if (!max_tensor_bytes.ok()) return max_tensor_bytes.status();
  std::vector<std::string> declared;
  for (const auto& in : config.input()) declared.push_back(in.name());

  DecodedInputs out;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& in = request.inputs(i);
    if (std::find(declared.begin(), declared.end(), in.name()) == declared.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model, "' has no input ", Quoted(in.name()),
                                                     "; its inputs are ", absl::StrJoin(declared, ", ")));
    }
    if (out.tensors.count(in.name())) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' appears twice"));
    }
    if (n_raw && HasTypedContents(in.contents())) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(),
                                                     "' has both typed contents and raw_input_contents; send one"));
    }
    auto dtype = ParseDType(in.datatype());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' has unsupported datatype ",
                                                     Quoted(in.datatype())));
    }
    InputTensor t;
    t.name = in.name();
    t.dtype = *dtype;
    // No model takes a dimension above INT32_MAX; refusing it here means that no later
    // narrowing to int can wrap, whatever the model checks after.
    for (int64_t d : in.shape()) {
      if (d < 0 || d > kMaxDimension) {
        return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' has ", d < 0 ? "a negative " : "",
                                                       "dimension ", d, " in shape ",
                                                       ShapeString({in.shape().begin(), in.shape().end()}),
                                                       "; dimensions must be in 0..", kMaxDimension));
      }
      t.shape.push_back(d);
    }
    // Byte count with overflow checks: a wrapped product could "match" a small payload.
    int64_t expected = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (__builtin_mul_overflow(expected, d, &expected)) {
        return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "': shape ", ShapeString(t.shape),
                                                       " of ", in.datatype(), " is too large"));
      }
    }
    if (*max_tensor_bytes > 0 && expected > *max_tensor_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("input '", in.name(), "': shape ", ShapeString(t.shape), " of ",
                                                       in.datatype(), " is ", expected, " bytes; the limit is ",
                                                       *max_tensor_bytes, " (--max-tensor-bytes)"));
    }
    const int64_t sent = n_raw ? int64_t(request.raw_input_contents(i).size()) : TypedContentsBytes(t.dtype, in.contents());
    if (sent != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in.name(), "': shape ", ShapeString(t.shape), " of ", in.datatype(), " needs ", expected,
          " bytes but ", sent, " were sent"));
    }
    if (n_raw) {
      t.data = request.raw_input_contents(i);
    } else {
      out.owned.push_back(ContentsAsRaw(t.dtype, in.contents()));
      t.data = *out.owned.back();
    }
    out.tensors.emplace(t.name, std::move(t));
  }
  for (int i = 0; i < request.outputs_size(); ++i) {
    const auto& o = request.outputs(i);
    bool known = false;
    for (const auto& co : config.output()) known |= co.name() == o.name();
    if (!known) {
      std::vector<std::string> names;
      for (const auto& co : config.output()) names.push_back(co.name());
      return absl::InvalidArgumentError(absl::StrCat("model '", model, "' has no output ", Quoted(o.name()),
                                                     "; its outputs are ", absl::StrJoin(names, ", ")));
    }
    for (int j = 0; j < i; ++j) {
      if (request.outputs(j).name() == o.name()) {
        return absl::InvalidArgumentError(absl::StrCat("output '", o.name(), "' is requested twice"));
      }
    }
  }
  for (const auto& in : config.input()) {
    if (!in.optional() && !out.tensors.count(in.name())) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model, "' requires input '", in.name(), "'"));
    }
  }
  return out;
}

absl::StatusOr<bool> BoolParam(const inference::ModelInferRequest& request, const std::string& key, bool def) {
  auto it = request.parameters().find(key);
  if (it == request.parameters().end()) return def;
  const auto& p = it->second;
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return p.bool_param();
    case inference::InferParameter::kInt64Param: return p.int64_param() != 0;
    case inference::InferParameter::kStringParam:
      if (p.string_param() == "true" || p.string_param() == "1") return true;
      if (p.string_param() == "false" || p.string_param() == "0") return false;
      [[fallthrough]];
    default:
      return absl::InvalidArgumentError(absl::StrCat("parameter '", key, "' must be a bool"));
  }
}

absl::StatusOr<std::optional<double>> DoubleParam(const inference::ModelInferRequest& request, const std::string& key) {
  auto it = request.parameters().find(key);
  if (it == request.parameters().end()) return std::optional<double>();
  const auto& p = it->second;
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kDoubleParam: return std::optional<double>(p.double_param());
    case inference::InferParameter::kInt64Param: return std::optional<double>(double(p.int64_param()));
    case inference::InferParameter::kStringParam: {
      char* end = nullptr;
      double v = std::strtod(p.string_param().c_str(), &end);
      if (end && *end == '\0' && !p.string_param().empty()) return std::optional<double>(v);
      [[fallthrough]];
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("parameter '", key, "' must be a number"));
  }
}

absl::StatusOr<std::string> SequenceIdParam(const inference::ModelInferRequest& request) {
  auto it = request.parameters().find("sequence_id");
  if (it == request.parameters().end()) return std::string();
  const auto& p = it->second;
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kUint64Param:
      return p.uint64_param() ? std::to_string(p.uint64_param()) : std::string();
    case inference::InferParameter::kInt64Param:
      return p.int64_param() ? std::to_string(uint64_t(p.int64_param())) : std::string();
    case inference::InferParameter::kStringParam: {
      const std::string& id = p.string_param();
      if (id.size() > kMaxSequenceIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("parameter 'sequence_id' is a string of ", id.size(),
                                                       " bytes; the limit is ", kMaxSequenceIdBytes));
      }
      return id.empty() ? std::string() : absl::StrCat("\"", id, "\"");
    }
    default: return absl::InvalidArgumentError("parameter 'sequence_id' must be an integer or a string");
  }
}

bool WantsOutput(const inference::ModelInferRequest& request, const std::string& name, bool by_default) {
  if (request.outputs_size() == 0) return by_default;
  for (const auto& o : request.outputs()) {
    if (o.name() == name) return true;
  }
  return false;
}

}  // namespace flashq::server
