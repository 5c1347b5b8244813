#include "client/bench/input_data.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/lib/tensor.h"
#include "common/dtype.h"

namespace flashq::bench {
namespace {

using google::protobuf::Value;

const char* KindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue: return "null";
    case Value::kNumberValue: return "a number";
    case Value::kStringValue: return "a string";
    case Value::kBoolValue: return "a boolean";
    case Value::kStructValue: return "an object";
    case Value::kListValue: return "a list";
    default: return "nothing";
  }
}

absl::Status Bad(const std::string& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

absl::Status Flatten(const Value& v, const std::string& where, std::vector<double>* out) {
  if (v.kind_case() == Value::kNumberValue) {
    out->push_back(v.number_value());
  } else if (v.kind_case() == Value::kBoolValue) {
    out->push_back(v.bool_value() ? 1 : 0);
  } else if (v.kind_case() == Value::kListValue) {
    for (const auto& e : v.list_value().values())
      if (absl::Status s = Flatten(e, where, out); !s.ok()) return s;
  } else {
    return Bad(where, absl::StrCat("values must be numbers or booleans, not ", KindName(v),
                                   v.kind_case() == Value::kStringValue ? " (BYTES inputs are not supported)" : ""));
  }
  return absl::OkStatus();
}

absl::Status ReadB64(const Value& v, const std::string& where, InputDataTensor* t) {
  if (v.kind_case() != Value::kStringValue)
    return Bad(where, absl::StrCat("\"b64\" must be a string, not ", KindName(v)));
  if (!absl::Base64Unescape(v.string_value(), &t->bytes)) return Bad(where, "\"b64\" is not valid base64");
  t->raw = true;
  return absl::OkStatus();
}

// {"b64": ...} or a value list, as "content" or the tensor itself.
absl::Status ReadContent(const Value& v, const std::string& where, InputDataTensor* t) {
  if (v.kind_case() == Value::kListValue) return Flatten(v, where, &t->values);
  if (v.kind_case() == Value::kStructValue) {
    const auto& f = v.struct_value().fields();
    auto b64 = f.find("b64");
    if (b64 == f.end() || f.size() != 1) return Bad(where, "an object here must be {\"b64\": \"...\"}");
    return ReadB64(b64->second, where + ".b64", t);
  }
  return Bad(where, absl::StrCat("expected a list of values or {\"b64\": \"...\"}, not ", KindName(v)));
}

absl::Status ReadTensor(const std::string& name, const Value& v, const std::string& where, InputDataTensor* t) {
  t->name = name;
  if (v.kind_case() != Value::kStructValue) return ReadContent(v, where, t);
  const auto& f = v.struct_value().fields();
  if (f.count("b64")) return ReadContent(v, where, t);
  for (const auto& [key, _] : f)
    if (key != "content" && key != "shape")
      return Bad(where, absl::StrCat("unknown key \"", key, "\" (a tensor is {\"content\": ..., \"shape\": [...]})"));
  auto content = f.find("content");
  if (content == f.end()) return Bad(where, "no \"content\"");
  if (absl::Status s = ReadContent(content->second, where + ".content", t); !s.ok()) return s;
  if (auto shape = f.find("shape"); shape != f.end()) {
    if (shape->second.kind_case() != Value::kListValue)
      return Bad(where + ".shape", absl::StrCat("must be a list of dimensions, not ", KindName(shape->second)));
    t->shape.emplace();
    for (const auto& d : shape->second.list_value().values()) {
      const double x = d.number_value();
      if (d.kind_case() != Value::kNumberValue || x < 0 || x != std::floor(x) || x > 1e15)
        return Bad(where + ".shape", "dimensions must be integers >= 0");
      t->shape->push_back(int64_t(d.number_value()));
    }
  }
  return absl::OkStatus();
}

// Encodes `values` as integers of `datatype` (little-endian, as raw_input_contents).
template <typename T>
absl::Status EncodeInts(const std::vector<double>& values, const std::string& datatype, const std::string& where,
                        std::string* out) {
  out->resize(values.size() * sizeof(T));
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (v != std::floor(v) || v < double(std::numeric_limits<T>::lowest()) || v > double(std::numeric_limits<T>::max()))
      return Bad(where, absl::StrFormat("value %g at index %d is not an integer in the range of %s", v, i, datatype));
    const T x = T(v);
    std::memcpy(out->data() + i * sizeof(T), &x, sizeof(T));
  }
  return absl::OkStatus();
}

absl::Status Encode(const std::vector<double>& values, const std::string& datatype, const std::string& where,
                    std::string* out) {
  if (datatype == "FP32" || datatype == "FP16" || datatype == "BF16") {
    std::vector<float> f(values.begin(), values.end());
    auto dt = client::ParseDType(datatype);
    *out = client::EncodeFloats(f, *dt);
    return absl::OkStatus();
  }
  if (datatype == "FP64") {
    out->resize(values.size() * 8);
    std::memcpy(out->data(), values.data(), out->size());
    return absl::OkStatus();
  }
  if (datatype == "INT8") return EncodeInts<int8_t>(values, datatype, where, out);
  if (datatype == "INT16") return EncodeInts<int16_t>(values, datatype, where, out);
  if (datatype == "INT32") return EncodeInts<int32_t>(values, datatype, where, out);
  if (datatype == "INT64") return EncodeInts<int64_t>(values, datatype, where, out);
  if (datatype == "UINT8") return EncodeInts<uint8_t>(values, datatype, where, out);
  if (datatype == "UINT16") return EncodeInts<uint16_t>(values, datatype, where, out);
  if (datatype == "UINT32") return EncodeInts<uint32_t>(values, datatype, where, out);
  if (datatype == "UINT64") return EncodeInts<uint64_t>(values, datatype, where, out);
  if (datatype == "BOOL") {
    for (double v : values)
      if (v != 0 && v != 1) return Bad(where, absl::StrFormat("value %g is not a BOOL (true, false, 0 or 1)", v));
    return EncodeInts<uint8_t>(values, datatype, where, out);
  }
  return Bad(where, absl::StrCat("the model's datatype ", datatype,
                                 " cannot be given as a value list; give its bytes as {\"b64\": ...}"));
}

int ElementSize(const std::string& datatype) {
  if (datatype == "FP64" || datatype == "INT64" || datatype == "UINT64") return 8;
  if (datatype == "FP32" || datatype == "INT32" || datatype == "UINT32") return 4;
  if (datatype == "FP16" || datatype == "BF16" || datatype == "INT16" || datatype == "UINT16") return 2;
  if (datatype == "INT8" || datatype == "UINT8" || datatype == "BOOL" || datatype == "FP8_E4M3") return 1;
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

class InputDataWorkload : public Workload {
 public:
  InputDataWorkload(std::string model, std::string description, std::string unit,
                    std::vector<std::shared_ptr<const inference::ModelInferRequest>> requests,
                    std::vector<int64_t> units)
      : model_(std::move(model)), description_(std::move(description)), unit_(std::move(unit)),
        requests_(std::move(requests)), units_(std::move(units)) {}
  const std::string& model() const override { return model_; }
  std::string Describe() const override { return description_; }
  std::string unit_name() const override { return unit_; }
  Work Next() override {
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed) % requests_.size();
    Work w;
    w.request = requests_[i];
    w.units = units_[i];
    return w;
  }

 private:
  std::string model_, description_, unit_;
  std::vector<std::shared_ptr<const inference::ModelInferRequest>> requests_;
  std::vector<int64_t> units_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace

absl::StatusOr<InputData> LoadInputData(const std::string& path) {
  // perf_analyzer also takes these; say so rather than "cannot read".
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Bad(path, "is a directory; flashq-bench reads perf_analyzer's JSON file form only");
  if ((path == "random" || path == "zero") && !std::filesystem::exists(path, ec))
    return absl::InvalidArgumentError(absl::StrCat("--input-data=", path,
                                                   " is not supported: without --input-data, requests carry random "
                                                   "values of the shapes the scenario flags give"));
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("--input-data: cannot read '", path, "'"));
  std::ostringstream text;
  text << f.rdbuf();
  Value root;
  if (auto s = google::protobuf::util::JsonStringToMessage(text.str(), &root); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", s.message().as_string()));
  if (root.kind_case() != Value::kStructValue)
    return Bad(path, absl::StrCat("the file must hold an object {\"data\": [...]}, not ", KindName(root)));
  const auto& top = root.struct_value().fields();
  for (const auto& [key, _] : top) {
    if (key == "validation_data") return Bad(path, "\"validation_data\" is not supported");
    if (key != "data") return Bad(path, absl::StrCat("unknown key \"", key, "\" (the file is {\"data\": [...]})"));
  }
  auto data = top.find("data");
  if (data == top.end()) return Bad(path, "no \"data\" list");
  if (data->second.kind_case() != Value::kListValue)
    return Bad(path + ": data", absl::StrCat("must be a list of entries, not ", KindName(data->second)));
  InputData out;
  out.path = path;
  const auto& entries = data->second.list_value().values();
  if (entries.empty()) return Bad(path + ": data", "is empty");
  for (int i = 0; i < entries.size(); ++i) {
    const std::string where = absl::StrCat(path, ": data[", i, "]");
    const Value& e = entries[i];
    if (e.kind_case() == Value::kListValue)
      return Bad(where, "sequences (an entry that is a list of steps) are not supported");
    if (e.kind_case() != Value::kStructValue)
      return Bad(where, absl::StrCat("must be an object {\"INPUT\": tensor, ...}, not ", KindName(e)));
    if (e.struct_value().fields().empty()) return Bad(where, "has no tensors");
    std::vector<InputDataTensor> tensors;
    for (const auto& [name, v] : e.struct_value().fields()) {
      InputDataTensor t;
      if (absl::Status s = ReadTensor(name, v, where + "." + name, &t); !s.ok()) return s;
      tensors.push_back(std::move(t));
    }
    out.entries.push_back(std::move(tensors));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Workload>> MakeInputDataWorkload(const InputData& data,
                                                                 const inference::ModelMetadataResponse& md,
                                                                 const InputDataWorkloadOptions& o) {
  std::vector<std::shared_ptr<const inference::ModelInferRequest>> requests;
  std::vector<int64_t> units;
  std::vector<std::string> known;
  for (const auto& in : md.inputs()) known.push_back(in.name());
  for (size_t i = 0; i < data.entries.size(); ++i) {
    const std::string where = absl::StrCat(data.path, ": data[", i, "]");
    auto req = std::make_shared<inference::ModelInferRequest>();
    req->set_model_name(o.model);
    int64_t unit = 1;
    // In the model's input order, so that requests do not depend on the file's key order.
    for (const auto& in : md.inputs()) {
      const InputDataTensor* t = nullptr;
      for (const auto& x : data.entries[i])
        if (x.name == in.name()) t = &x;
      if (!t) continue;
      const std::string at = where + "." + t->name;
      std::vector<int64_t> model_shape(in.shape().begin(), in.shape().end());
      std::vector<int64_t> shape;
      if (t->shape) {
        shape = *t->shape;
      } else {
        for (int64_t d : model_shape)
          if (d < 0)
            return Bad(at, absl::StrCat("no \"shape\", and the model's shape ", ShapeString(model_shape),
                                        " is not fixed: give {\"content\": ..., \"shape\": [...]}"));
        shape = model_shape;
      }
      if (shape.size() != model_shape.size())
        return Bad(at, absl::StrCat("shape ", ShapeString(shape), " has rank ", shape.size(), "; the model's ",
                                    in.name(), " is ", ShapeString(model_shape)));
      for (size_t d = 0; d < shape.size(); ++d)
        if (model_shape[d] >= 0 && shape[d] != model_shape[d])
          return Bad(at, absl::StrCat("shape ", ShapeString(shape), " does not fit the model's ",
                                      ShapeString(model_shape)));
      const int64_t n = client::NumElements(shape);
      std::string bytes;
      if (t->raw) {
        const int es = ElementSize(in.datatype());
        if (es == 0) return Bad(at, absl::StrCat("the model's datatype ", in.datatype(), " is not supported"));
        if (int64_t(t->bytes.size()) != n * es)
          return Bad(at, absl::StrFormat("b64 holds %d bytes; shape %s of %s needs %d", t->bytes.size(),
                                         ShapeString(shape), in.datatype(), n * es));
        bytes = t->bytes;
      } else {
        if (int64_t(t->values.size()) != n)
          return Bad(at, absl::StrFormat("%d values; shape %s needs %d", t->values.size(), ShapeString(shape), n));
        if (absl::Status s = Encode(t->values, in.datatype(), at, &bytes); !s.ok()) return s;
      }
      auto* tensor = req->add_inputs();
      tensor->set_name(in.name());
      tensor->set_datatype(in.datatype());
      for (int64_t d : shape) tensor->add_shape(d);
      req->add_raw_input_contents(std::move(bytes));
      if (in.name() == o.unit_input && !shape.empty()) unit = shape[0];
    }
    for (const auto& x : data.entries[i])
      if (std::find(known.begin(), known.end(), x.name) == known.end())
        return Bad(where, absl::StrCat("\"", x.name, "\" is not an input of ", o.model, " (its inputs: ",
                                       absl::StrJoin(known, ", "), ")"));
    if (o.causal) client::SetBoolParam(*req, "causal", *o.causal);
    requests.push_back(std::move(req));
    units.push_back(unit);
  }
  const std::string description =
      absl::StrFormat("%s, %d request%s from %s (cycled)", o.model, requests.size(), requests.size() == 1 ? "" : "s",
                      data.path);
  return std::unique_ptr<Workload>(
      new InputDataWorkload(o.model, description, o.unit_name, std::move(requests), std::move(units)));
}

}  // namespace flashq::bench
