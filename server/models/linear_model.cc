#include "server/models/linear_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/request_decoder.h"
#include "server/repository/model_repository.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

struct LinearWork : Work {
  DecodedInputs inputs;
  const InputTensor* x = nullptr;
};

// K and N of a layer: int inside the kernels, and far below where N x K overflows.
constexpr int64_t kMaxFeatures = 1 << 20;

template <typename T>
std::vector<T> Copy(const SafeTensor& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * sizeof(T));
  return v;
}

absl::Status ExpectShape(const std::string& name, const SafeTensor& t, std::vector<int64_t> shape) {
  if (t.shape == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("weight '", name, "' has shape ", ShapeString(t.shape), "; expected ",
                                                 ShapeString(shape)));
}

}  // namespace

absl::StatusOr<LinearWeights> LoadLinearWeights(const std::string& model_dir, const inference::ModelConfig& config) {
  auto file = SafetensorsFile::Open(model_dir + "/model.safetensors");
  if (!file.ok()) return file.status();
  const std::string format = ConfigParam(config, "weight_format", "bf16");
  auto K = ConfigIntParam(config, "in_features", 0, 0, kMaxFeatures);
  auto N = ConfigIntParam(config, "out_features", 0, 0, kMaxFeatures);
  if (!K.ok()) return K.status();
  if (!N.ok()) return N.status();
  // Sizes come from the config's X / Y dims when in_features / out_features are not set.
  int64_t k = *K, n = *N;
  if (k == 0 && config.input_size() > 0 && config.input(0).dims_size() == 2) k = config.input(0).dims(1);
  if (n == 0 && config.output_size() > 0 && config.output(0).dims_size() == 2) n = config.output(0).dims(1);
  if (k <= 0 || n <= 0 || k > kMaxFeatures || n > kMaxFeatures) {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name(),
                                                   "': set X dims [-1, K] and Y dims [-1, N] (or in_features/out_features), "
                                                   "K and N in 1..", kMaxFeatures));
  }
  LinearWeights w;
  w.K = int(k);
  w.N = int(n);
  auto group = ConfigIntParam(config, "group_size", 128, 1, kMaxFeatures);
  if (!group.ok()) return group.status();
  if (format == "bf16") {
    w.format = WeightFormat::kBf16;
    auto t = (*file)->Get("weight", "BF16");
    if (!t.ok()) return t.status();
    if (auto s = ExpectShape("weight", *t, {n, k}); !s.ok()) return s;
    w.bf16 = Copy<uint16_t>(*t);
  } else if (format == "gptq") {
    w.format = WeightFormat::kInt4;
    auto version = ConfigIntParam(config, "gptq_version", 1, 1, 2);
    if (!version.ok()) return version.status();
    gemm::GptqTensors g;
    g.K = w.K;
    g.N = w.N;
    g.group_size = int(*group);
    g.v1 = *version == 1;
    auto qw = (*file)->Get("qweight", "I32");
    auto qz = (*file)->Get("qzeros", "I32");
    auto sc = (*file)->Get("scales", "F16");
    for (const auto* s : {&qw, &qz, &sc}) {
      if (!s->ok()) return s->status();
    }
    g.qweight = Copy<int32_t>(*qw);
    g.qzeros = Copy<int32_t>(*qz);
    g.scales_f16 = Copy<uint16_t>(*sc);
    if ((*file)->tensors().count("g_idx")) {
      auto gi = (*file)->Get("g_idx", "I32");
      if (!gi.ok()) return gi.status();
      g.g_idx = Copy<int32_t>(*gi);
    }
    Status s = gemm::UnpackGptq(g, &w.int4);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': ", s.message()));
  } else if (format == "awq") {
    w.format = WeightFormat::kInt4;
    gemm::AwqTensors a;
    a.K = w.K;
    a.N = w.N;
    a.group_size = int(*group);
    auto qw = (*file)->Get("qweight", "I32");
    auto qz = (*file)->Get("qzeros", "I32");
    auto sc = (*file)->Get("scales", "F16");
    for (const auto* s : {&qw, &qz, &sc}) {
      if (!s->ok()) return s->status();
    }
    a.qweight = Copy<int32_t>(*qw);
    a.qzeros = Copy<int32_t>(*qz);
    a.scales_f16 = Copy<uint16_t>(*sc);
    Status s = gemm::UnpackAwq(a, &w.int4);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': ", s.message()));
  } else if (format == "fp8") {
    w.format = WeightFormat::kFp8;
    w.fp8_activations = ConfigParam(config, "fp8_activation", "bf16") == "fp8";
    auto t = (*file)->Get("weight", "F8_E4M3");
    if (!t.ok()) return t.status();
    if (auto s = ExpectShape("weight", *t, {n, k}); !s.ok()) return s;
    auto sc = (*file)->Get("weight_scale", "F32");
    if (!sc.ok()) return sc.status();
    const int64_t ns = sc->numel();
    if (ns != 1 && ns != n) {
      return absl::InvalidArgumentError(absl::StrCat("weight 'weight_scale' has ", ns, " elements; expected 1 (per tensor) or ",
                                                     n, " (per output channel)"));
    }
    w.fp8.K = w.K;
    w.fp8.N = w.N;
    w.fp8.w = Copy<uint8_t>(*t);
    w.fp8.scale = Copy<float>(*sc);
    for (size_t i = 0; i < w.fp8.scale.size(); ++i) {
      if (!std::isfinite(w.fp8.scale[i]) || w.fp8.scale[i] <= 0.0f) {
        return absl::InvalidArgumentError(absl::StrCat("weight 'weight_scale' element ", i, " is ", w.fp8.scale[i],
                                                       "; scales must be finite and > 0"));
      }
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': unknown weight_format '", format,
                                                   "'; expected bf16, gptq, awq or fp8"));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<Model>> LinearModel::Create(inference::ModelConfig config, const std::string& dir,
                                                           Backend& backend) {
  auto max_tokens = ConfigIntParam(config, "max_batch_tokens", 4096, 1, 2147483647);
  if (!max_tokens.ok()) return max_tokens.status();
  auto weights = LoadLinearWeights(dir, config);
  if (!weights.ok()) return weights.status();
  const int K = weights->K, N = weights->N;
  auto exec = backend.CreateLinear(std::move(*weights));
  if (!exec.ok()) return exec.status();
  return std::unique_ptr<Model>(new LinearModel(std::move(config), std::move(*exec), K, N, *max_tokens));
}

LinearModel::LinearModel(inference::ModelConfig config, std::unique_ptr<LinearExecutor> executor, int K, int N,
                         int64_t max_tokens)
    : Model(std::move(config)), executor_(std::move(executor)), K_(K), N_(N), max_tokens_(max_tokens) {}

absl::StatusOr<std::unique_ptr<Work>> LinearModel::Prepare(const inference::ModelInferRequest& request,
                                                     const SharedMemoryRegistry* shared_memory) {
  auto w = std::make_unique<LinearWork>();
  auto decoded = DecodeInputs(request, config(), shared_memory);
  if (!decoded.ok()) return decoded.status();
  w->inputs = std::move(*decoded);
  w->x = w->inputs.Find("X");
  const InputTensor& x = *w->x;
  if (x.dtype != DType::kF16 && x.dtype != DType::kBF16 && x.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("input 'X' has datatype ", DTypeName(x.dtype),
                                                   "; expected FP16, BF16 or FP32"));
  }
  if (x.shape.size() != 2 || x.shape[1] != K_ || x.shape[0] < 1) {
    return absl::InvalidArgumentError(absl::StrCat("input 'X' has shape ", ShapeString(x.shape), "; expected [M, ", K_,
                                                   "] with M >= 1"));
  }
  w->tokens = x.shape[0];
  w->ExpectOutput("Y", w->tokens * N_ * DTypeSize(x.dtype));
  if (w->tokens > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("input 'X' has ", w->tokens, " rows; model '", name(),
                                                   "' takes at most max_batch_tokens=", max_tokens_, " per request"));
  }
  w->batch_key = std::string(DTypeName(x.dtype));
  return std::unique_ptr<Work>(std::move(w));
}

void LinearModel::Execute(const std::vector<Work*>& batch) {
  const DType dtype = static_cast<const LinearWork&>(*batch[0]).x->dtype;
  int M = 0;
  std::string merged;
  for (Work* wp : batch) {
    const auto& w = static_cast<const LinearWork&>(*wp);
    M += int(w.x->shape[0]);
    if (batch.size() > 1) merged.append(w.x->data);
  }
  std::string_view x = batch.size() > 1 ? std::string_view(merged) : static_cast<const LinearWork&>(*batch[0]).x->data;
  std::string y;
  absl::Status s = executor_->Run(dtype, M, x, &y);
  const int64_t row_bytes = int64_t(N_) * DTypeSize(dtype);
  int64_t row = 0;
  for (Work* wp : batch) {
    auto& w = static_cast<LinearWork&>(*wp);
    const int64_t m = w.x->shape[0];
    w.status = s;
    if (s.ok()) w.outputs.push_back({"Y", dtype, {m, N_}, TakeSlice(y, row * row_bytes, m * row_bytes)});
    row += m;
  }
}

}  // namespace flashq::server
