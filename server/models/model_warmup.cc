#include "server/models/model_warmup.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/config_params.h"
#include "server/core/tensor.h"

namespace flashq::server {
namespace {

constexpr int64_t kMaxWarmupBytes = int64_t(1) << 30;

absl::Status FillInput(const std::string& dir, const std::string& name, const inference::ModelWarmup::Input& in,
                       std::mt19937& rng, inference::ModelInferRequest* request) {
  std::string type = inference::DataType_Name(in.data_type());
  if (type.rfind("TYPE_", 0) == 0) type = type.substr(5);
  const std::optional<DType> dtype = ParseDType(type);
  if (!dtype) return absl::InvalidArgumentError(absl::StrCat("input '", name, "' has data_type ", type, ", not servable"));
  int64_t elements = 1;
  for (int64_t d : in.dims()) {
    if (d < 0 || (d > 0 && elements > kMaxWarmupBytes / d))
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "' has dims that are negative or too large"));
    elements *= d;
  }
  const int64_t bytes = elements * DTypeSize(*dtype);
  if (bytes > kMaxWarmupBytes) return absl::InvalidArgumentError(absl::StrCat("input '", name, "' is over 1 GiB"));

  auto* t = request->add_inputs();
  t->set_name(name);
  t->set_datatype(type);
  for (int64_t d : in.dims()) t->add_shape(d);
  std::string* raw = request->add_raw_input_contents();
  const bool is_float = *dtype == DType::kF32 || *dtype == DType::kF16 || *dtype == DType::kBF16;
  if (in.input_data_type_case() == inference::ModelWarmup::Input::kInputDataFile) {
    const std::string path = (std::filesystem::path(dir) / "warmup" / in.input_data_file()).string();
    std::ifstream f(path, std::ios::binary);
    if (!f) return absl::NotFoundError(absl::StrCat("input '", name, "': cannot read ", path));
    std::stringstream s;
    s << f.rdbuf();
    *raw = s.str();
    if (int64_t(raw->size()) != bytes)
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "': ", path, " holds ", raw->size(),
                                                     " bytes; its dims and data_type take ", bytes));
  } else if (in.input_data_type_case() == inference::ModelWarmup::Input::kRandomData && is_float) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(elements));
    for (float& x : v) x = u(rng);
    AppendFromFloat(*dtype, v.data(), elements, raw);
  } else {
    raw->assign(size_t(bytes), '\0');
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunModelWarmup(Model& model, const std::string& dir) {
  const bool sequence = ConfigParam(model.config(), "kind", "") == "kv_attention";
  std::mt19937 rng(1);
  int n = 0;
  for (const inference::ModelWarmup& sample : model.config().model_warmup()) {
    const std::string what = absl::StrCat("model_warmup '", sample.name(), "': ");
    for (uint32_t i = 0; i < std::max(sample.count(), 1u); ++i, ++n) {
      inference::ModelInferRequest request;
      request.set_model_name(model.name());
      request.set_id(absl::StrCat("warmup-", n));
      // Inputs go in name order (the config's map has none of its own).
      std::map<std::string, const inference::ModelWarmup::Input*> inputs;
      for (const auto& [name, in] : sample.inputs()) inputs[name] = &in;
      for (const auto& [name, in] : inputs) {
        if (absl::Status s = FillInput(dir, name, *in, rng, &request); !s.ok())
          return absl::Status(s.code(), absl::StrCat(what, s.message()));
      }
      if (sequence) {
        (*request.mutable_parameters())["sequence_id"].set_string_param(absl::StrCat("flashq-warmup-", n));
        (*request.mutable_parameters())["sequence_start"].set_bool_param(true);
        (*request.mutable_parameters())["sequence_end"].set_bool_param(true);
      }
      auto work = model.Prepare(request);
      if (!work.ok()) return absl::Status(work.status().code(), absl::StrCat(what, work.status().message()));
      if (absl::Status s = model.Admit(**work); !s.ok()) {
        model.Drop(**work, s);
        return absl::Status(s.code(), absl::StrCat(what, s.message()));
      }
      model.Execute({work->get()});
      if (!(*work)->status.ok())
        return absl::Status((*work)->status.code(), absl::StrCat(what, (*work)->status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace flashq::server
