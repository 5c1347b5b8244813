#include "server/frontend/http_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace flashq::server {
namespace {

using nlohmann::json;
using google::protobuf::FieldDescriptor;

// Nested `data` arrays deeper than any tensor's rank are refused rather than recursed into.
constexpr int kMaxDataDepth = 32;

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

// The parameters that frame binary tensors on HTTP; they are not passed on to the model.
bool HttpOnlyParameter(const std::string& key) {
  return key == "binary_data_size" || key == "binary_data" || key == "binary_data_output";
}

absl::Status ParseParameters(const json& j, const std::string& where,
                             google::protobuf::Map<std::string, inference::InferParameter>* out) {
  if (!j.is_object()) return Bad(absl::StrCat(where, ": 'parameters' must be a JSON object"));
  for (const auto& [key, v] : j.items()) {
    if (HttpOnlyParameter(key)) continue;
    inference::InferParameter p;
    if (v.is_boolean()) {
      p.set_bool_param(v.get<bool>());
    } else if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= uint64_t(std::numeric_limits<int64_t>::max())) {
        p.set_int64_param(int64_t(u));
      } else {
        p.set_uint64_param(u);
      }
    } else if (v.is_number_integer()) {
      p.set_int64_param(v.get<int64_t>());
    } else if (v.is_number_float()) {
      p.set_double_param(v.get<double>());
    } else if (v.is_string()) {
      p.set_string_param(v.get<std::string>());
    } else {
      return Bad(absl::StrCat(where, ": parameter '", key, "' must be a boolean, number or string"));
    }
    (*out)[key] = std::move(p);
  }
  return absl::OkStatus();
}

// A non-negative integer parameter (binary_data_size).
absl::StatusOr<uint64_t> SizeParameter(const json& params, const char* key, const std::string& where) {
  const json& v = params.at(key);
  if (!v.is_number_unsigned()) return Bad(absl::StrCat(where, ": parameter '", key, "' must be an integer >= 0"));
  return v.get<uint64_t>();
}

bool BoolParameter(const json& params, const char* key, bool def) {
  if (!params.is_object() || !params.contains(key)) return def;
  const json& v = params.at(key);
  return v.is_boolean() ? v.get<bool>() : def;
}

template <typename T>
void Put(std::string& out, T v) {
  const size_t n = out.size();
  out.resize(n + sizeof(T));
  std::memcpy(out.data() + n, &v, sizeof(T));
}

// One JSON element appended to `out` as `datatype` (little-endian, as raw_input_contents).
absl::Status PutElement(const json& v, const std::string& dt, std::string& out) {
  auto integer = [&](int64_t lo, uint64_t hi) -> absl::StatusOr<uint64_t> {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= hi) return u;
    } else if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i >= lo) return uint64_t(i);
    } else if (v.is_boolean()) {
      return uint64_t(v.get<bool>());
    }
    return Bad(absl::StrCat("value ", v.dump(-1, ' ', false, json::error_handler_t::replace), " is not a ", dt));
  };
  if (dt == "FP32" || dt == "FP64" || dt == "FP16" || dt == "BF16") {
    if (!v.is_number()) {
      return Bad(absl::StrCat("value ", v.dump(-1, ' ', false, json::error_handler_t::replace), " is not a number"));
    }
    const double d = v.get<double>();
    if (dt == "FP64") Put(out, d);
    if (dt == "FP32") Put(out, float(d));
    if (dt == "FP16") Put(out, FloatToF16(float(d)));
    if (dt == "BF16") Put(out, FloatToBf16(float(d)));
    return absl::OkStatus();
  }
  struct Int { const char* name; int bytes; bool is_signed; };
  static constexpr Int kInts[] = {{"BOOL", 1, false},  {"UINT8", 1, false}, {"UINT16", 2, false}, {"UINT32", 4, false},
                                  {"UINT64", 8, false}, {"INT8", 1, true},   {"INT16", 2, true},   {"INT32", 4, true},
                                  {"INT64", 8, true}};
  for (const Int& t : kInts) {
    if (dt != t.name) continue;
    const int bits = t.bytes * 8;
    const int64_t lo = t.is_signed ? (bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t(1) << (bits - 1))) : 0;
    const uint64_t hi = dt == "BOOL" ? 1
                        : t.is_signed ? (uint64_t(1) << (bits - 1)) - 1
                        : bits == 64  ? std::numeric_limits<uint64_t>::max()
                                      : (uint64_t(1) << bits) - 1;
    auto u = integer(lo, hi);
    if (!u.ok()) return u.status();
    const size_t n = out.size();
    out.resize(n + t.bytes);
    std::memcpy(out.data() + n, &*u, t.bytes);  // little-endian: the low bytes
    return absl::OkStatus();
  }
  return Bad(absl::StrCat("datatype '", dt, "' cannot be given as JSON data"));
}

absl::Status FlattenData(const json& j, const std::string& dt, int depth, std::string& out) {
  if (!j.is_array()) return PutElement(j, dt, out);
  if (depth >= kMaxDataDepth) return Bad(absl::StrCat("'data' is nested deeper than ", kMaxDataDepth, " levels"));
  for (const json& e : j) {
    if (absl::Status s = FlattenData(e, dt, depth + 1, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

json ElementsToJson(const std::string& dt, const std::string& raw) {
  json a = json::array();
  auto each = [&](auto tag, auto convert) {
    using T = decltype(tag);
    const size_t n = raw.size() / sizeof(T);
    a.get_ref<json::array_t&>().reserve(n);
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
      a.push_back(convert(v));
    }
  };
  auto same = [](auto v) { return v; };
  if (dt == "FP32") each(float(), same);
  else if (dt == "FP64") each(double(), same);
  else if (dt == "FP16") each(uint16_t(), [](uint16_t h) { return F16ToFloat(h); });
  else if (dt == "BF16") each(uint16_t(), [](uint16_t h) { return Bf16ToFloat(h); });
  else if (dt == "INT32") each(int32_t(), same);
  else if (dt == "INT64") each(int64_t(), same);
  else if (dt == "UINT8") each(uint8_t(), [](uint8_t v) { return unsigned(v); });
  else if (dt == "BOOL") each(uint8_t(), [](uint8_t v) { return v != 0; });
  else if (dt == "FP8_E4M3") each(uint8_t(), [](uint8_t v) { return Fp8E4M3ToFloat(v); });
  return a;
}

json FieldValue(const google::protobuf::Message& m, const FieldDescriptor* f, int index);

json MessageToJson(const google::protobuf::Message& m) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  json out = json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      json obj = json::object();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const auto& entry = r->GetRepeatedMessage(m, f, k);
        const FieldDescriptor* kf = entry.GetDescriptor()->map_key();
        const FieldDescriptor* vf = entry.GetDescriptor()->map_value();
        json key = FieldValue(entry, kf, -1);
        obj[key.is_string() ? key.get<std::string>() : key.dump()] = FieldValue(entry, vf, -1);
      }
      out[f->name()] = std::move(obj);
    } else if (f->is_repeated()) {
      json arr = json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) arr.push_back(FieldValue(m, f, k));
      out[f->name()] = std::move(arr);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE || f->containing_oneof()) {
      if (r->HasField(m, f)) out[f->name()] = FieldValue(m, f, -1);
    } else {
      out[f->name()] = FieldValue(m, f, -1);
    }
  }
  return out;
}

// Element `index` of a repeated field, or the singular field when index < 0.
json FieldValue(const google::protobuf::Message& m, const FieldDescriptor* f, int index) {
  const auto* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64: return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32: return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64: return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE: return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT: return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL: return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case FieldDescriptor::CPPTYPE_STRING: return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

absl::Status ParseHttpInferRequest(const std::string& body, std::optional<size_t> header_length,
                                   const std::string& model, const std::string& version,
                                   inference::ModelInferRequest* request, HttpOutputForm* form) {
  size_t json_end = body.size();
  if (header_length) {
    if (*header_length > body.size()) {
      return Bad(absl::StrCat("Inference-Header-Content-Length is ", *header_length, " but the body has only ",
                              body.size(), " bytes"));
    }
    json_end = *header_length;
  }
  json j;
  try {
    j = json::parse(body.begin(), body.begin() + json_end);
  } catch (const json::exception& e) {
    return Bad(absl::StrCat("malformed JSON in the request body: ", e.what()));
  }
  if (!j.is_object()) return Bad("the request body must be a JSON object");
  request->set_model_name(model);
  request->set_model_version(version);
  if (j.contains("id")) {
    if (!j["id"].is_string()) return Bad("'id' must be a string");
    request->set_id(j["id"].get<std::string>());
  }
  if (j.contains("parameters")) {
    if (absl::Status s = ParseParameters(j["parameters"], "request", request->mutable_parameters()); !s.ok()) return s;
    form->binary_default = BoolParameter(j["parameters"], "binary_data_output", false);
  }
  if (!j.contains("inputs") || !j["inputs"].is_array()) return Bad("the request has no 'inputs' array");
  size_t binary_at = json_end;  // the next binary tensor's first byte
  for (const json& in : j["inputs"]) {
    if (!in.is_object()) return Bad("each element of 'inputs' must be a JSON object");
    if (!in.contains("name") || !in["name"].is_string()) return Bad("an input has no 'name' string");
    const std::string name = in["name"].get<std::string>();
    const std::string where = absl::StrCat("input '", name, "'");
    if (!in.contains("datatype") || !in["datatype"].is_string()) return Bad(absl::StrCat(where, " has no 'datatype' string"));
    if (!in.contains("shape") || !in["shape"].is_array()) return Bad(absl::StrCat(where, " has no 'shape' array"));
    auto* t = request->add_inputs();
    t->set_name(name);
    t->set_datatype(in["datatype"].get<std::string>());
    for (const json& d : in["shape"]) {
      if (!d.is_number_integer()) return Bad(absl::StrCat(where, ": 'shape' must hold integers"));
      t->add_shape(d.get<int64_t>());
    }
    const json params = in.contains("parameters") ? in["parameters"] : json::object();
    if (absl::Status s = ParseParameters(params, where, t->mutable_parameters()); !s.ok()) return s;
    const bool in_shm = params.contains("shared_memory_region");
    if (params.contains("binary_data_size")) {
      if (!header_length) {
        return Bad(absl::StrCat(where, " has binary_data_size but the request has no Inference-Header-Content-Length"));
      }
      auto n = SizeParameter(params, "binary_data_size", where);
      if (!n.ok()) return n.status();
      if (*n > body.size() - binary_at) {
        return Bad(absl::StrCat(where, ": binary_data_size ", *n, " runs past the end of the body (",
                                body.size() - binary_at, " bytes left)"));
      }
      request->add_raw_input_contents(body.substr(binary_at, *n));
      binary_at += *n;
    } else if (in.contains("data")) {
      std::string* raw = request->add_raw_input_contents();
      if (absl::Status s = FlattenData(in["data"], t->datatype(), 0, *raw); !s.ok()) {
        return Bad(absl::StrCat(where, ": ", s.message()));
      }
    } else if (!in_shm) {
      return Bad(absl::StrCat(where, " has no 'data', binary_data_size or shared_memory_region"));
    }
  }
  if (binary_at != body.size()) {
    return Bad(absl::StrCat("the body has ", body.size() - binary_at,
                            " bytes after the last binary input that no input's binary_data_size covers"));
  }
  if (j.contains("outputs")) {
    if (!j["outputs"].is_array()) return Bad("'outputs' must be an array");
    for (const json& o : j["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) {
        return Bad("each element of 'outputs' must be an object with a 'name' string");
      }
      auto* t = request->add_outputs();
      t->set_name(o["name"].get<std::string>());
      if (o.contains("parameters")) {
        if (absl::Status s = ParseParameters(o["parameters"], absl::StrCat("output '", t->name(), "'"),
                                             t->mutable_parameters());
            !s.ok()) {
          return s;
        }
        if (o["parameters"].contains("binary_data")) {
          form->binary[t->name()] = BoolParameter(o["parameters"], "binary_data", form->binary_default);
        }
      }
    }
  }
  return absl::OkStatus();
}

HttpInferResponse MakeHttpInferResponse(const inference::ModelInferRequest& request,
                                        inference::ModelInferResponse& response, const HttpOutputForm& form) {
  json j = json::object();
  j["model_name"] = response.model_name();
  j["model_version"] = response.model_version();
  if (!response.id().empty()) j["id"] = response.id();
  json outputs = json::array();
  std::string binary;
  bool any_binary = false;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& o = response.outputs(i);
    json t = {{"name", o.name()}, {"datatype", o.datatype()}, {"shape", json::array()}};
    for (int64_t d : o.shape()) t["shape"].push_back(d);
    const inference::ModelInferRequest::InferRequestedOutputTensor* asked = nullptr;
    for (const auto& r : request.outputs()) asked = r.name() == o.name() ? &r : asked;
    std::string* raw = i < response.raw_output_contents_size() ? response.mutable_raw_output_contents(i) : nullptr;
    if (asked && asked->parameters().count("shared_memory_region")) {
      // Written to the client's region: name it back, as Triton does, with no data.
      json p = json::object();
      for (const auto& [k, v] : asked->parameters()) {
        if (k.rfind("shared_memory_", 0) != 0) continue;
        if (v.has_string_param()) p[k] = v.string_param();
        if (v.has_int64_param()) p[k] = v.int64_param();
        if (v.has_uint64_param()) p[k] = v.uint64_param();
      }
      t["parameters"] = std::move(p);
    } else if (raw && form.Binary(o.name())) {
      t["parameters"] = {{"binary_data_size", raw->size()}};
      binary += *raw;
      any_binary = true;
    } else if (raw) {
      t["data"] = ElementsToJson(o.datatype(), *raw);
    }
    outputs.push_back(std::move(t));
  }
  j["outputs"] = std::move(outputs);
  HttpInferResponse out;
  out.body = Dump(j);
  if (any_binary) {
    out.header_length = out.body.size();
    out.body += binary;
  }
  return out;
}

std::string ProtoToJson(const google::protobuf::Message& message) { return Dump(MessageToJson(message)); }

std::string JsonError(const std::string& message) { return Dump(json{{"error", message}}); }

}  // namespace flashq::server
