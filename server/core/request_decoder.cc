#include "server/core/request_decoder.h"

#include <cstring>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/client_text.h"
#include "server/core/config_params.h"

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

// Whether the kernels consume tensors of type `t` (FP16, BF16, FP32): such a tensor may stay
// where it is, in device memory or in fragments. Models read the others (offsets, lengths) on
// the host, in one piece.
bool ForKernels(DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; }

// A status of `s`'s code whose message starts with what it concerns.
absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// A shared-memory offset or size: a non-negative int64 (Triton's type) or a uint64.
absl::StatusOr<uint64_t> SizeParam(const inference::InferParameter& p, const std::string& key, const std::string& tensor,
                                   const char* kind) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      if (p.int64_param() >= 0) return uint64_t(p.int64_param());
      return absl::InvalidArgumentError(absl::StrCat(kind, " ", Quoted(tensor), ": parameter '", key, "' is ",
                                                     p.int64_param(), "; it must be >= 0"));
    case inference::InferParameter::kUint64Param: return p.uint64_param();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(kind, " ", Quoted(tensor), ": parameter '", key, "' must be an integer (int64_param)"));
  }
}

}  // namespace

absl::StatusOr<std::optional<SharedMemoryRef>> SharedMemoryParams(
    const google::protobuf::Map<std::string, inference::InferParameter>& params, const std::string& tensor,
    const char* kind) {
  auto region = params.find("shared_memory_region");
  auto size = params.find("shared_memory_byte_size");
  auto offset = params.find("shared_memory_offset");
  if (region == params.end()) {
    for (const auto& it : {size, offset}) {
      if (it != params.end()) {
        return absl::InvalidArgumentError(absl::StrCat(kind, " ", Quoted(tensor), ": parameter '", it->first,
                                                       "' is given without 'shared_memory_region'"));
      }
    }
    return std::optional<SharedMemoryRef>();
  }
  if (region->second.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " ", Quoted(tensor),
                                                   ": parameter 'shared_memory_region' must be a string"));
  }
  if (size == params.end()) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " ", Quoted(tensor),
                                                   ": 'shared_memory_region' needs 'shared_memory_byte_size' too"));
  }
  SharedMemoryRef ref;
  ref.region = region->second.string_param();
  auto bytes = SizeParam(size->second, size->first, tensor, kind);
  if (!bytes.ok()) return bytes.status();
  ref.byte_size = *bytes;
  if (offset != params.end()) {
    auto off = SizeParam(offset->second, offset->first, tensor, kind);
    if (!off.ok()) return off.status();
    ref.offset = *off;
  }
  return std::optional<SharedMemoryRef>(std::move(ref));
}

const InputTensor* DecodedInputs::Find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

absl::StatusOr<DecodedInputs> DecodeInputs(const inference::ModelInferRequest& request, const RequestBytes& bytes,
                                           const inference::ModelConfig& config) {
  const std::string& model = config.name();
  const SharedMemoryRegistry* shared_memory = bytes.shared_memory;
  const bool outside = !bytes.raw.empty();
  const int n_raw = outside ? int(bytes.raw.size()) : request.raw_input_contents_size();
  auto raw_size = [&](int i) {
    if (!outside) return int64_t(request.raw_input_contents(i).size());
    int64_t n = 0;
    for (std::string_view f : bytes.raw[size_t(i)]) n += int64_t(f.size());
    return n;
  };
  // An input read from shared memory has no raw_input_contents entry (as in Triton).
  std::vector<std::optional<SharedMemoryRef>> shm(request.inputs_size());
  int n_shm = 0;
  for (int i = 0; i < request.inputs_size(); ++i) {
    auto ref = SharedMemoryParams(request.inputs(i).parameters(), request.inputs(i).name(), "input");
    if (!ref.ok()) return ref.status();
    shm[i] = std::move(*ref);
    n_shm += shm[i].has_value();
  }
  if (n_raw != 0 && n_raw != request.inputs_size() - n_shm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", model, "': ", request.inputs_size(), " inputs",
        n_shm ? absl::StrCat(" (", n_shm, " in shared memory)") : "", " but ", n_raw, " raw_input_contents; expected one",
        n_shm ? " for each input not in shared memory" : " each"));
  }
  // Set by --max-tensor-bytes (or the model's config); checked before any tensor is copied.
  auto max_tensor_bytes = ConfigIntParam(config, "max_tensor_bytes", 0);
  if (!max_tensor_bytes.ok()) return max_tensor_bytes.status();
  std::vector<std::string> declared;
  for (const auto& in : config.input()) declared.push_back(in.name());

  DecodedInputs out;
  int next_raw = 0;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& in = request.inputs(i);
    if (std::find(declared.begin(), declared.end(), in.name()) == declared.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model, "' has no input ", Quoted(in.name()),
                                                     "; its inputs are ", absl::StrJoin(declared, ", ")));
    }
    if (out.tensors.count(in.name())) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' appears twice"));
    }
    if ((n_raw || shm[i]) && HasTypedContents(in.contents())) {
      return absl::InvalidArgumentError(absl::StrCat("input '", in.name(), "' has both typed contents and ",
                                                     shm[i] ? "a shared-memory region" : "raw_input_contents",
                                                     "; send one"));
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
    if (shm[i]) {
      const SharedMemoryRef& ref = *shm[i];
      const std::string what = absl::StrCat("input ", Quoted(in.name()));
      if (ref.byte_size != uint64_t(expected)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", ShapeString(t.shape), " of ", in.datatype(),
                                                       " needs ", expected, " bytes but its shared_memory_byte_size in region ",
                                                       Quoted(ref.region), " is ", ref.byte_size));
      }
      if (!shared_memory) {
        return absl::UnimplementedError(absl::StrCat(what, " names shared-memory region ", Quoted(ref.region),
                                                     "; this server takes tensors in the message only"));
      }
      auto buffer = shared_memory->Find(ref.region, ref.offset, ref.byte_size);
      if (!buffer.ok()) return Prefixed(buffer.status(), what);
      if (buffer->kind == MemoryKind::kDevice && !ForKernels(t.dtype)) {
        out.owned.push_back(std::make_unique<std::string>(buffer->size, '\0'));
        if (absl::Status s = buffer->Read(0, out.owned.back()->data(), buffer->size); !s.ok()) return Prefixed(s, what);
        t.data = *out.owned.back();
      } else {
        t.data = std::string_view(buffer->data, buffer->size);
        t.kind = buffer->kind;
        t.device = buffer->device;
      }
      out.regions.push_back(std::move(*buffer));
      out.tensors.emplace(t.name, std::move(t));
      continue;
    }
    const int64_t sent = n_raw ? raw_size(next_raw) : TypedContentsBytes(t.dtype, in.contents());
    if (sent != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in.name(), "': shape ", ShapeString(t.shape), " of ", in.datatype(), " needs ", expected,
          " bytes but ", sent, " were sent"));
    }
    if (n_raw && !outside) {
      t.data = request.raw_input_contents(next_raw++);
    } else if (n_raw) {
      const std::vector<std::string_view>& pieces = bytes.raw[size_t(next_raw++)];
      if (pieces.size() == 1) {
        t.data = pieces[0];
      } else if (ForKernels(t.dtype)) {
        t.fragments = pieces;  // a backend gathers them as they are
      } else {
        auto joined = std::make_unique<std::string>();
        joined->reserve(size_t(expected));
        for (std::string_view f : pieces) joined->append(f);
        out.owned.push_back(std::move(joined));
        t.data = *out.owned.back();
      }
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

absl::Status BindSharedMemoryOutputs(const inference::ModelInferRequest& request,
                                     const SharedMemoryRegistry* shared_memory, Work& work) {
  for (const auto& o : request.outputs()) {
    auto ref = SharedMemoryParams(o.parameters(), o.name(), "output");
    if (!ref.ok()) return ref.status();
    if (!ref->has_value()) continue;
    const std::string what = absl::StrCat("output ", Quoted(o.name()));
    const std::string& region = (*ref)->region;
    if (!shared_memory) {
      return absl::UnimplementedError(absl::StrCat(what, " names shared-memory region ", Quoted(region),
                                                   "; this server sends outputs in the message only"));
    }
    auto buffer = shared_memory->Find(region, (*ref)->offset, (*ref)->byte_size);
    if (!buffer.ok()) return Prefixed(buffer.status(), what);
    int64_t bytes = 0;
    for (const auto& [name, n] : work.output_sizes) bytes = name == o.name() ? n : bytes;
    if (uint64_t(bytes) > (*ref)->byte_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of this request is ", bytes,
                                                     " bytes but its shared_memory_byte_size in region ",
                                                     Quoted(region), " is ", (*ref)->byte_size));
    }
    work.shm_outputs.push_back({o.name(), std::move(*buffer)});
  }
  return absl::OkStatus();
}

bool WantsOutput(const inference::ModelInferRequest& request, const std::string& name, bool by_default) {
  if (request.outputs_size() == 0) return by_default;
  for (const auto& o : request.outputs()) {
    if (o.name() == name) return true;
  }
  return false;
}

}  // namespace flashq::server
