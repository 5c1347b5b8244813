#include "server/models/linear_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/request_decoder.h"
#include "server/repository/model_repository.h"
#include "server/repository/linear_loader.h"

namespace flashq::server {
namespace {

struct LinearWork : Work {
  DecodedInputs inputs;
  const InputTensor* x = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LinearModel::Create(inference::ModelConfig config, const std::string& dir,
                                                           Backend& backend, CheckpointCache& checkpoints,
                                                           std::vector<std::string>* notes) {
  auto max_tokens = ConfigIntParam(config, "max_batch_tokens", 4096, 1, 2147483647);
  if (!max_tokens.ok()) return max_tokens.status();
  auto load = LoadLinear(dir, config, checkpoints);
  if (!load.ok()) return load.status();
  if (notes) notes->insert(notes->end(), load->notes.begin(), load->notes.end());
  const int K = load->weights.K, N = load->weights.N;
  load->weights.bias = std::move(load->bias);
  auto exec = backend.CreateLinear(std::move(load->weights));
  if (!exec.ok()) return exec.status();
  return std::unique_ptr<Model>(
      new LinearModel(std::move(config), std::move(*exec), K, N, *max_tokens));
}

LinearModel::LinearModel(inference::ModelConfig config, std::unique_ptr<LinearExecutor> executor, int K, int N,
                         int64_t max_tokens)
    : Model(std::move(config)), executor_(std::move(executor)), K_(K), N_(N),
      max_tokens_(max_tokens) {}

absl::StatusOr<std::unique_ptr<Work>> LinearModel::Prepare(const inference::ModelInferRequest& request,
                                                     const RequestBytes& bytes) {
  auto w = std::make_unique<LinearWork>();
  auto decoded = DecodeInputs(request, bytes, config());
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
  const int64_t row_bytes = int64_t(N_) * DTypeSize(dtype);
  int M = 0;
  Gather x;
  Scatter y;
  for (Work* wp : batch) {
    auto& w = static_cast<LinearWork&>(*wp);
    const int64_t m = w.x->shape[0];
    M += int(m);
    w.x->AppendTo(&x.pieces);
    w.outputs.clear();
    w.outputs.push_back({"Y", dtype, {m, N_}, std::string()});
    y.pieces.push_back(w.OutputDestination("Y", &w.outputs.back().data, size_t(m * row_bytes)));
  }
  StageTimes times;
  const absl::Status s = executor_->Run(dtype, M, x, y, &times);
  for (Work* wp : batch) {
    wp->status = s;
    wp->input_ns = times.input_ns, wp->output_ns = times.output_ns;
    if (!s.ok()) wp->outputs.clear();
  }
}

}  // namespace flashq::server
