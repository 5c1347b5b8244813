#include "server/models/kv_attention_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/core/request_decoder.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

struct KvWork : Work {
  DecodedInputs inputs;
  const InputTensor *q = nullptr, *k = nullptr, *v = nullptr;
  int n = 0;                       // new tokens; 0 only for an end that appends nothing
  bool start = false, end = false;
  KvReservation reservation;
  bool reserved = false;
};

// Limits of the geometry. The kernels take head_dim 64/128/256 (the CUDA backend checks
// that); these bounds only keep every product of the geometry far from overflowing.
constexpr int64_t kMaxHeads = 1024, kMaxHeadDim = 1024, kMaxPageSize = 65536, kMaxInt = 2147483647;
constexpr int64_t kMaxPoolElements = int64_t(1) << 50;
// Requests of at most this many new tokens are decode steps (one token, or a few for
// speculative decoding); longer ones are prefills.
constexpr int64_t kMaxDecodeTokens = 16;

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> KvAttentionModel::Create(inference::ModelConfig config, Backend& backend,
                                                                int64_t kv_cache_blocks) {
  KvGeometry g;
  int64_t max_tokens = 0, idle_s = 0;
  struct P { const char* key; int64_t def, hi; int64_t* out; };
  int64_t hq, hkv, d, page, blocks;
  for (P p : {P{"num_heads_q", 32, kMaxHeads, &hq}, P{"num_heads_kv", 8, kMaxHeads, &hkv},
              P{"head_dim", 128, kMaxHeadDim, &d}, P{"page_size", 16, kMaxPageSize, &page},
              P{"num_blocks", 512, kMaxInt, &blocks}, P{"max_tokens_per_sequence", 8192, kMaxInt, &max_tokens},
              P{"session_idle_timeout_s", 600, int64_t(365) * 24 * 3600, &idle_s}}) {
    auto v = ConfigIntParam(config, p.key, p.def, 1, p.hi);
    if (!v.ok()) return v.status();
    *p.out = *v;
  }
  // Triton's sequence_batching.max_sequence_idle_microseconds is the idle timeout; the
  // older session_idle_timeout_s parameter remains its fallback and must not contradict it.
  std::chrono::microseconds idle = std::chrono::seconds(idle_s);
  if (config.has_sequence_batching() && config.sequence_batching().max_sequence_idle_microseconds() > 0) {
    const uint64_t us = config.sequence_batching().max_sequence_idle_microseconds();
    if (us > uint64_t(365) * 24 * 3600 * 1'000'000) {
      return absl::InvalidArgumentError(absl::StrCat("model '", config.name(),
                                                     "': sequence_batching.max_sequence_idle_microseconds is ", us,
                                                     "; it must be at most a year"));
    }
    if (config.parameters().count("session_idle_timeout_s") && uint64_t(idle_s) * 1'000'000 != us) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", config.name(), "': sequence_batching.max_sequence_idle_microseconds is ", us,
          " but parameter session_idle_timeout_s is ", idle_s, "; set only max_sequence_idle_microseconds"));
    }
    idle = std::chrono::microseconds(us);
  }
  if (hq % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': num_heads_q ", hq,
                                                   " is not a multiple of num_heads_kv ", hkv));
  }
  if (kv_cache_blocks != 0) {
    if (kv_cache_blocks < 1 || kv_cache_blocks > kMaxInt) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-blocks is ", kv_cache_blocks, "; it must be in 1..",
                                                     kMaxInt, " (or 0: the model's num_blocks)"));
    }
    blocks = kv_cache_blocks;
  }
  if (blocks * page * hkv * d > kMaxPoolElements) {  // each factor is at most 2^31: no overflow
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", config.name(), "': a KV cache of num_blocks ", blocks, " x page_size ", page, " x num_heads_kv ",
        hkv, " x head_dim ", d, " elements is over the limit of 2^50; lower num_blocks or page_size"));
  }
  g.num_heads_q = int(hq);
  g.num_heads_kv = int(hkv);
  g.head_dim = int(d);
  g.page_size = int(page);
  g.num_blocks = int(blocks);
  g.max_blocks_per_sequence = int((max_tokens + page - 1) / page);
  auto exec = backend.CreateKvAttention(g);
  if (!exec.ok()) return exec.status();
  auto sessions = std::make_unique<KvSessionTable>(g.num_blocks, g.page_size, max_tokens, idle);
  return std::unique_ptr<Model>(new KvAttentionModel(std::move(config), g, std::move(sessions), std::move(*exec)));
}

KvAttentionModel::KvAttentionModel(inference::ModelConfig config, KvGeometry geometry,
                                   std::unique_ptr<KvSessionTable> sessions, std::unique_ptr<KvAttentionExecutor> executor)
    : Model(std::move(config)), geometry_(geometry), sessions_(std::move(sessions)), executor_(std::move(executor)) {}

absl::StatusOr<std::unique_ptr<Work>> KvAttentionModel::Prepare(const inference::ModelInferRequest& request,
                                                     const RequestBytes& bytes) {
  auto w = std::make_unique<KvWork>();
  auto decoded = DecodeInputs(request, bytes, config());
  if (!decoded.ok()) return decoded.status();
  w->inputs = std::move(*decoded);
  w->q = w->inputs.Find("Q");
  w->k = w->inputs.Find("K");
  w->v = w->inputs.Find("V");
  auto start = BoolParam(request, "sequence_start", false);
  if (!start.ok()) return start.status();
  auto end = BoolParam(request, "sequence_end", false);
  if (!end.ok()) return end.status();
  w->start = *start;
  w->end = *end;
  // Zero new tokens only ends a sequence: the way to release one whose cache is at
  // max_tokens_per_sequence, or whose next token would need a block the cache lacks.
  const bool release = w->end && !w->start;
  const int64_t n = w->q->shape.empty() ? 0 : w->q->shape[0];
  const std::vector<int64_t> want_q = {n, geometry_.num_heads_q, geometry_.head_dim};
  const std::vector<int64_t> want_kv = {n, geometry_.num_heads_kv, geometry_.head_dim};
  for (const InputTensor* t : {w->q, w->k, w->v}) {
    if (t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t->name, "' has datatype ", DTypeName(t->dtype),
                                                     "; expected FP16 or BF16"));
    }
    if (t->dtype != w->q->dtype) {
      return absl::InvalidArgumentError("Q, K and V must share one datatype");
    }
    const auto& want = t == w->q ? want_q : want_kv;
    if (t->shape != want || n < (release ? 0 : 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", t->name, "' has shape ", ShapeString(t->shape), "; expected ", ShapeString(want),
          " with n >= 1 new tokens (n = 0 only with sequence_end, to end a sequence without appending)"));
    }
  }
  if (n > sessions_->max_tokens_per_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", n, " new tokens; model '", name(),
                                                   "' holds at most max_tokens_per_sequence=",
                                                   sessions_->max_tokens_per_sequence(), " per sequence"));
  }
  auto id = SequenceIdParam(request);
  if (!id.ok()) return id.status();
  if (id->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", name(), "' needs a non-zero 'sequence_id' parameter"));
  }
  w->n = int(n);
  w->tokens = n;
  if (WantsOutput(request, "O", true)) w->ExpectOutput("O", n * geometry_.num_heads_q * geometry_.head_dim * 2);
  // Prefills and decode steps never share a batch, and prefill batches never hold every
  // worker (Work::bulk), so a decode step waits neither for a long prefill's compute nor
  // for a worker that prefills hold.
  w->bulk = n > kMaxDecodeTokens;
  w->batch_key = absl::StrCat(DTypeName(w->q->dtype), w->bulk ? "/prefill" : "/decode");
  w->exclusive_key = *id;
  return std::unique_ptr<Work>(std::move(w));
}

absl::Status KvAttentionModel::Admit(Work& work) {
  auto& w = static_cast<KvWork&>(work);
  auto r = sessions_->Reserve(w.exclusive_key, w.start, w.end, w.n);
  if (!r.ok()) return r.status();
  w.reservation = std::move(*r);
  w.reserved = true;
  return absl::OkStatus();
}

void KvAttentionModel::Execute(const std::vector<Work*>& batch) {
  // A sequence aborted after this request was admitted (an earlier request of it was
  // dropped) has a gap in its cache: fail the request instead of computing on it.
  std::vector<KvWork*> run;
  for (Work* wp : batch) {
    auto& w = static_cast<KvWork&>(*wp);
    if (!w.reserved) {  // never admitted: only a direct caller of Execute gets here
      w.status = absl::FailedPreconditionError("kv_attention: Execute without Admit");
      continue;
    }
    if (sessions_->Valid(w.reservation)) {
      run.push_back(&w);
      continue;
    }
    w.status = absl::FailedPreconditionError(absl::StrCat(
        "sequence ", w.reservation.sequence_id,
        " was dropped before this request ran (an earlier request of it was cancelled, timed out or failed); "
        "start it again with sequence_start"));
    sessions_->Abort(w.reservation, std::string(w.status.message()));
    w.reserved = false;
  }
  // An end with no new tokens computes nothing: its answer is an empty O.
  std::erase_if(run, [&](KvWork* w) {
    if (w->n > 0) return false;
    sessions_->Commit(w->reservation);
    w->reserved = false;
    w->status = absl::OkStatus();
    w->outputs.push_back({"O", w->q->dtype, {0, geometry_.num_heads_q, geometry_.head_dim}, std::string()});
    return true;
  });
  if (run.empty()) return;
  KvBatch b;
  b.dtype = run[0]->q->dtype;
  b.softmax_scale = float(1.0 / std::sqrt(double(geometry_.head_dim)));
  for (KvWork* w : run) {
    w->outputs.clear();
    w->outputs.push_back({"O", b.dtype, {w->n, geometry_.num_heads_q, geometry_.head_dim}, std::string()});
    const size_t bytes = size_t(w->n) * geometry_.num_heads_q * geometry_.head_dim * DTypeSize(b.dtype);
    KvItem& it = b.items.emplace_back();
    it.sequence_id = w->exclusive_key;
    w->q->AppendTo(&it.q.pieces);
    w->k->AppendTo(&it.k.pieces);
    w->v->AppendTo(&it.v.pieces);
    it.n = w->n;
    it.start_pos = w->reservation.start_pos;
    it.blocks = &w->reservation.blocks;
    it.o = w->OutputDestination("O", &w->outputs.back().data, bytes);
  }
  StageTimes times;
  b.times = &times;
  const absl::Status s = executor_->Run(b);
  for (KvWork* w : run) {
    w->status = s;
    w->input_ns = times.input_ns, w->output_ns = times.output_ns;
    if (s.ok()) {
      sessions_->Commit(w->reservation);
    } else {
      w->outputs.clear();
      sessions_->Abort(w->reservation, s.ToString());
    }
    w->reserved = false;
  }
}

void KvAttentionModel::Drop(Work& work, const absl::Status& why) {
  auto& w = static_cast<KvWork&>(work);
  if (w.reserved) sessions_->Abort(w.reservation, why.ToString());
  w.reserved = false;
}

void KvAttentionModel::Tick(std::chrono::steady_clock::time_point now) { sessions_->ReapIdle(now); }

}  // namespace flashq::server
