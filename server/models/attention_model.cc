#include "server/models/attention_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/request_decoder.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

// Heads per request. Real models have at most a few hundred; the bound keeps every
// product of tokens, heads and head_dim far from overflowing.
constexpr int64_t kMaxHeads = 1024;

struct AttentionWork : Work {
  DecodedInputs inputs;
  const InputTensor *q = nullptr, *k = nullptr, *v = nullptr;
  std::vector<int32_t> cu_q, cu_k;
  int hq = 0, hkv = 0, d = 0;
  bool causal = false, want_o = true, want_lse = false;
  float scale = 1.0f;
};

std::vector<int32_t> ReadInt32(const InputTensor& t) {
  std::vector<int32_t> v(NumElements(t.shape));
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * 4);
  return v;
}

absl::Status CheckCu(const InputTensor& t, int64_t total, int* batch) {
  if (t.dtype != DType::kI32 || t.shape.size() != 1 || t.shape[0] < 2) {
    return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "' must be INT32 of shape [n + 1] with n >= 1; got ",
                                                   DTypeName(t.dtype), " ", ShapeString(t.shape)));
  }
  *batch = int(t.shape[0] - 1);
  const std::vector<int32_t> cu = ReadInt32(t);
  auto bad = [&](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': ", what...));
  };
  if (cu[0] != 0) return bad("cu_seqlens[0] must be 0");
  for (int b = 0; b < *batch; ++b) {
    if (cu[b + 1] < cu[b]) return bad("cu_seqlens must be non-decreasing");
  }
  if (cu[*batch] != total) {
    return bad("cu_seqlens[", *batch, "] = ", cu[*batch], " does not match the tensor's ", total, " rows");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> AttentionModel::Create(inference::ModelConfig config, Backend& backend) {
  // Token offsets travel as INT32 (CU_SEQLENS), so a request's tokens must fit one.
  auto max_tokens = ConfigIntParam(config, "max_batch_tokens", 16384, 1, 2147483647);
  if (!max_tokens.ok()) return max_tokens.status();
  auto max_sequences = ConfigIntParam(config, "max_sequences_per_request", 0, 0, 2147483647);
  if (!max_sequences.ok()) return max_sequences.status();
  std::set<int64_t> dims;
  for (absl::string_view s : absl::StrSplit(ConfigParam(config, "head_dims", "64,128,256"), ',', absl::SkipEmpty())) {
    int64_t d;
    if (!absl::SimpleAtoi(s, &d) || d <= 0 || d > 1024) {
      return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': bad head_dims entry '", s, "'"));
    }
    dims.insert(d);
  }
  auto exec = backend.CreateAttention();
  if (!exec.ok()) return exec.status();
  return std::unique_ptr<Model>(new AttentionModel(std::move(config), std::move(*exec), *max_tokens, *max_sequences,
                                                   std::move(dims)));
}

AttentionModel::AttentionModel(inference::ModelConfig config, std::unique_ptr<AttentionExecutor> executor,
                               int64_t max_tokens, int64_t max_sequences, std::set<int64_t> head_dims)
    : Model(std::move(config)),
      executor_(std::move(executor)),
      max_tokens_(max_tokens),
      max_sequences_(max_sequences),
      head_dims_(std::move(head_dims)) {}

absl::StatusOr<std::unique_ptr<Work>> AttentionModel::Prepare(const inference::ModelInferRequest& request,
                                                     const RequestBytes& bytes) {
  auto w = std::make_unique<AttentionWork>();
  auto decoded = DecodeInputs(request, bytes, config());
  if (!decoded.ok()) return decoded.status();
  w->inputs = std::move(*decoded);
  w->q = w->inputs.Find("Q");
  w->k = w->inputs.Find("K");
  w->v = w->inputs.Find("V");
  const InputTensor *q = w->q, *k = w->k, *v = w->v;

  for (const InputTensor* t : {q, k, v}) {
    if (t->dtype != DType::kF16 && t->dtype != DType::kBF16 && t->dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t->name, "' has datatype ", DTypeName(t->dtype),
                                                     "; expected FP16, BF16 or FP32"));
    }
    if (t->shape.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t->name, "' must have rank 3 [tokens, heads, head_dim]; got ",
                                                     ShapeString(t->shape)));
    }
  }
  if (k->dtype != q->dtype || v->dtype != q->dtype) {
    return absl::InvalidArgumentError(absl::StrCat("Q, K and V must share one datatype; got Q ", DTypeName(q->dtype),
                                                   ", K ", DTypeName(k->dtype), ", V ", DTypeName(v->dtype)));
  }
  if (v->shape != k->shape) {
    return absl::InvalidArgumentError(absl::StrCat("input 'V' has shape ", ShapeString(v->shape),
                                                   "; expected the shape of 'K', ", ShapeString(k->shape)));
  }
  // Every dimension is checked as int64 against its limit before it narrows to int.
  const int64_t hq = q->shape[1], hkv = k->shape[1], d = q->shape[2];
  if (k->shape[2] != d) {
    return absl::InvalidArgumentError(absl::StrCat("input 'K' has head_dim ", k->shape[2], "; expected ", d,
                                                   " (the head_dim of 'Q')"));
  }
  if (!head_dims_.count(d)) {
    std::vector<int64_t> dims(head_dims_.begin(), head_dims_.end());
    return absl::InvalidArgumentError(absl::StrCat("input 'Q' has head_dim ", d, "; this model supports ",
                                                   absl::StrJoin(dims, ", ")));
  }
  if (hq < 1 || hkv < 1 || hq > kMaxHeads || hkv > kMaxHeads || hq % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads_q (", hq, ", dim 1 of 'Q') must be a multiple of num_heads_kv (",
                                                   hkv, ", dim 1 of 'K'), both in 1..", kMaxHeads));
  }
  const int64_t total_q = q->shape[0], total_k = k->shape[0];
  // Limits first, before CU_SEQLENS are read or anything is allocated for the request.
  w->tokens = std::max(total_q, total_k);
  if (w->tokens > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", w->tokens, " tokens; model '", name(),
                                                   "' takes at most max_batch_tokens=", max_tokens_, " per request"));
  }
  if (total_q < 1 || total_k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", total_q, " query and ", total_k,
                                                   " key tokens; attention needs at least one of each"));
  }
  w->hq = int(hq);
  w->hkv = int(hkv);
  w->d = int(d);
  const InputTensor* cq = w->inputs.Find("CU_SEQLENS_Q");
  const InputTensor* ck = w->inputs.Find("CU_SEQLENS_K");
  for (const InputTensor* c : {cq, ck}) {
    if (c && max_sequences_ > 0 && c->shape.size() == 1 && c->shape[0] - 1 > max_sequences_) {
      return absl::ResourceExhaustedError(absl::StrCat("input '", c->name, "' describes ", c->shape[0] - 1,
                                                       " sequences; the limit is ", max_sequences_,
                                                       " per request (--max-sequences-per-request)"));
    }
  }
  if (!cq && !ck) {
    w->cu_q = {0, int32_t(total_q)};
    w->cu_k = {0, int32_t(total_k)};
  } else {
    if (!cq || (!ck && total_q != total_k)) {
      return absl::InvalidArgumentError(
          "CU_SEQLENS_Q and CU_SEQLENS_K must be sent together (CU_SEQLENS_Q alone is allowed only when Q and K have equal lengths)");
    }
    int bq = 0, bk = 0;
    if (auto s = CheckCu(*cq, total_q, &bq); !s.ok()) return s;
    w->cu_q = ReadInt32(*cq);
    if (ck) {
      if (auto s = CheckCu(*ck, total_k, &bk); !s.ok()) return s;
      if (bk != bq) {
        return absl::InvalidArgumentError(absl::StrCat("CU_SEQLENS_Q describes ", bq, " sequences but CU_SEQLENS_K describes ", bk));
      }
      w->cu_k = ReadInt32(*ck);
    } else {
      w->cu_k = w->cu_q;
    }
  }
  auto causal = BoolParam(request, "causal", false);
  if (!causal.ok()) return causal.status();
  w->causal = *causal;
  auto scale = DoubleParam(request, "softmax_scale");
  if (!scale.ok()) return scale.status();
  w->scale = scale->has_value() ? float(**scale) : float(1.0 / std::sqrt(double(w->d)));
  if (!(w->scale > 0.0f) || !std::isfinite(w->scale)) {
    return absl::InvalidArgumentError("parameter 'softmax_scale' must be a finite number > 0");
  }
  w->want_o = WantsOutput(request, "O", true);
  w->want_lse = WantsOutput(request, "LSE", false);
  if (w->want_o) w->ExpectOutput("O", total_q * hq * d * DTypeSize(q->dtype));
  if (w->want_lse) w->ExpectOutput("LSE", total_q * hq * 4);
  w->batch_key = absl::StrCat(DTypeName(q->dtype), "/", w->hq, "/", w->hkv, "/", w->d, "/", w->causal, "/",
                              FloatBits(w->scale), "/", w->want_lse);
  return std::unique_ptr<Work>(std::move(w));
}

void AttentionModel::Execute(const std::vector<Work*>& batch) {
  const auto& first = static_cast<const AttentionWork&>(*batch[0]);
  AttentionBatch b;
  b.dtype = first.q->dtype;
  b.num_heads_q = first.hq;
  b.num_heads_kv = first.hkv;
  b.head_dim = first.d;
  b.causal = first.causal;
  b.softmax_scale = first.scale;
  b.want_lse = first.want_lse;
  b.cu_seqlens_q = {0};
  b.cu_seqlens_k = {0};
  const int64_t row_bytes = int64_t(b.num_heads_q) * b.head_dim * DTypeSize(b.dtype);
  // Each request's tensors stay where they are (message or shared memory) and O goes
  // straight to its destination: the backend gathers and scatters.
  for (Work* wp : batch) {
    auto& w = static_cast<AttentionWork&>(*wp);
    const int32_t oq = b.cu_seqlens_q.back(), ok = b.cu_seqlens_k.back();
    for (size_t i = 1; i < w.cu_q.size(); ++i) {
      b.cu_seqlens_q.push_back(oq + w.cu_q[i]);
      b.cu_seqlens_k.push_back(ok + w.cu_k[i]);
      b.max_seqlen_q = std::max(b.max_seqlen_q, w.cu_q[i] - w.cu_q[i - 1]);
      b.max_seqlen_k = std::max(b.max_seqlen_k, w.cu_k[i] - w.cu_k[i - 1]);
    }
    w.q->AppendTo(&b.q.pieces);
    w.k->AppendTo(&b.k.pieces);
    w.v->AppendTo(&b.v.pieces);
    const int64_t tq = w.q->shape[0];
    w.outputs.clear();
    if (w.want_o) {
      w.outputs.push_back({"O", b.dtype, {tq, w.hq, w.d}, std::string()});
      b.o.pieces.push_back(w.OutputDestination("O", &w.outputs.back().data, size_t(tq * row_bytes)));
    } else {
      b.o.pieces.push_back({nullptr, size_t(tq * row_bytes)});
    }
  }
  std::vector<float> lse;
  StageTimes times;
  b.times = &times;
  const absl::Status s = executor_->Run(b, &lse);
  const int64_t total_q = b.cu_seqlens_q.back();
  int64_t q_off = 0;
  for (Work* wp : batch) {
    auto& w = static_cast<AttentionWork&>(*wp);
    const int64_t tq = w.q->shape[0];
    w.status = s;
    w.input_ns = times.input_ns, w.output_ns = times.output_ns;
    if (!s.ok()) {
      w.outputs.clear();
    } else if (w.want_lse) {
      OutputTensor t{"LSE", DType::kF32, {w.hq, tq}, std::string(size_t(w.hq * tq * 4), '\0')};
      for (int h = 0; h < w.hq; ++h) {
        std::memcpy(t.data.data() + h * tq * 4, lse.data() + h * total_q + q_off, tq * 4);
      }
      w.status = w.Deliver(t);
      w.outputs.push_back(std::move(t));
    }
    q_off += tq;
  }
}

}  // namespace flashq::server
