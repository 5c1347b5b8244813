#include "client/bench/workload.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_format.h"
#include "client/lib/tensor.h"

namespace flashq::bench {

using client::AddInt32Input;
using client::AddRawInput;

Payload::Payload(DType dtype, int64_t max_elements, uint64_t seed) : dtype_(dtype) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(std::max<int64_t>(max_elements, 1)));
  for (float& x : v) x = u(rng);
  bytes_ = client::EncodeFloats(v, dtype);
}

std::string Payload::Slice(int64_t elements, RequestRng& rng) const {
  const int es = DTypeSize(dtype_);
  const int64_t total = int64_t(bytes_.size()) / es;
  if (elements >= total) {  // larger than the pool: repeat it
    std::string out;
    out.reserve(size_t(elements * es));
    while (int64_t(out.size()) < elements * es)
      out.append(bytes_, 0, std::min<size_t>(bytes_.size(), size_t(elements * es) - out.size()));
    return out;
  }
  const int64_t off = std::uniform_int_distribution<int64_t>(0, total - elements)(rng);
  return bytes_.substr(size_t(off * es), size_t(elements * es));
}

void Payload::AddInput(inference::ModelInferRequest& req, Work& w, bool resident, std::string_view name,
                       std::span<const int64_t> shape, RequestRng& rng) const {
  const int64_t elements = client::NumElements(shape);
  if (resident) {
    w.resident_bytes.resize(size_t(req.inputs_size()), 0);
    w.resident_bytes.push_back(elements * DTypeSize(dtype_));
    auto* in = req.add_inputs();
    in->set_name(std::string(name));
    in->set_datatype(std::string(DTypeName(dtype_)));
    for (int64_t d : shape) in->add_shape(d);
    req.add_raw_input_contents();
    return;
  }
  (void)AddRawInput(req, name, dtype_, shape, Slice(elements, rng));
}

namespace {

// ---------------------------------------------------------------- attention
class AttentionWorkload : public Workload {
 public:
  explicit AttentionWorkload(const AttentionWorkloadOptions& o)
      : o_(o), rng_(o.seed),
        payload_(o.dtype, std::min<int64_t>(int64_t(1) << 22, std::max<int64_t>(1, o.seq_len.max() + o.kv_extra.max()) *
                                                                 std::max(o.heads_q, o.heads_kv) * o.head_dim * 2),
                 o.seed ^ 0x5eed) {}
  const std::string& model() const override { return o_.model; }
  std::string unit_name() const override { return "tokens"; }
  std::string Describe() const override {
    return absl::StrFormat("%s %s Hq=%d Hkv=%d D=%d len=%s seqs/req=%s%s", o_.model, DTypeName(o_.dtype), o_.heads_q,
                           o_.heads_kv, o_.head_dim, o_.seq_len.spec(), o_.seqs_per_request.spec(),
                           o_.causal ? " causal" : "");
  }
  Work Next() override {
    std::vector<int32_t> cu_q{0}, cu_k{0};
    RequestRng local;
    {
      std::lock_guard<std::mutex> l(mu_);
      const int64_t n = o_.send_cu_seqlens ? std::max<int64_t>(1, o_.seqs_per_request.Sample(rng_)) : 1;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t lq = std::max<int64_t>(1, o_.seq_len.Sample(rng_));
        const int64_t lk = lq + std::max<int64_t>(0, o_.kv_extra.Sample(rng_));
        cu_q.push_back(cu_q.back() + int32_t(lq));
        cu_k.push_back(cu_k.back() + int32_t(lk));
      }
      local.seed(RequestRng::result_type(rng_()));
    }
    const int64_t tq = cu_q.back(), tk = cu_k.back(), n = int64_t(cu_q.size()) - 1;
    auto req = std::make_shared<inference::ModelInferRequest>();
    req->set_model_name(o_.model);
    const int64_t qs[] = {tq, o_.heads_q, o_.head_dim}, ks[] = {tk, o_.heads_kv, o_.head_dim};
    Work w;
    payload_.AddInput(*req, w, o_.resident_inputs, "Q", qs, local);
    payload_.AddInput(*req, w, o_.resident_inputs, "K", ks, local);
    payload_.AddInput(*req, w, o_.resident_inputs, "V", ks, local);
    if (o_.send_cu_seqlens) {
      const int64_t cs[] = {n + 1};
      (void)AddInt32Input(*req, "CU_SEQLENS_Q", cs, cu_q);
      (void)AddInt32Input(*req, "CU_SEQLENS_K", cs, cu_k);
    }
    client::SetBoolParam(*req, "causal", o_.causal);
    client::RequestOutput(*req, "O");
    w.request = std::move(req);
    w.units = tq;
    w.output_bytes = {tq * o_.heads_q * o_.head_dim * DTypeSize(o_.dtype)};
    return w;
  }
  std::string_view random_bytes() const override { return payload_.bytes(); }
  int64_t max_request_bytes() const override {
    const int64_t seqs = o_.send_cu_seqlens ? std::max<int64_t>(1, o_.seqs_per_request.max()) : 1;
    const int64_t tq = seqs * std::max<int64_t>(1, o_.seq_len.max());
    const int64_t tk = tq + seqs * std::max<int64_t>(0, o_.kv_extra.max());
    const int64_t cu = o_.send_cu_seqlens ? 2 * (seqs + 1) * 4 : 0;
    return (2 * tq * o_.heads_q + 2 * tk * o_.heads_kv) * o_.head_dim * DTypeSize(o_.dtype) + cu;  // Q, O, K, V
  }

 private:
  AttentionWorkloadOptions o_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  Payload payload_;
};

// ------------------------------------------------------------------ linear
class LinearWorkload : public Workload {
 public:
  explicit LinearWorkload(const LinearWorkloadOptions& o)
      : o_(o), rng_(o.seed), payload_(o.dtype, std::min<int64_t>(int64_t(1) << 22, o.m.max() * o.k * 2), o.seed ^ 0x5eed) {}
  const std::string& model() const override { return o_.model; }
  std::string unit_name() const override { return "rows"; }
  std::string Describe() const override {
    return absl::StrFormat("%s %s X[M,%d] M=%s", o_.model, DTypeName(o_.dtype), o_.k, o_.m.spec());
  }
  Work Next() override {
    int64_t m;
    RequestRng local;
    {
      std::lock_guard<std::mutex> l(mu_);
      m = std::max<int64_t>(1, o_.m.Sample(rng_));
      local.seed(RequestRng::result_type(rng_()));
    }
    auto req = std::make_shared<inference::ModelInferRequest>();
    req->set_model_name(o_.model);
    const int64_t xs[] = {m, o_.k};
    Work w;
    payload_.AddInput(*req, w, o_.resident_inputs, "X", xs, local);
    client::RequestOutput(*req, "Y");
    w.request = std::move(req);
    w.units = m;
    w.output_bytes = {m * o_.n * DTypeSize(o_.dtype)};
    return w;
  }
  std::string_view random_bytes() const override { return payload_.bytes(); }
  int64_t max_request_bytes() const override {
    return std::max<int64_t>(1, o_.m.max()) * (o_.k + o_.n) * DTypeSize(o_.dtype);  // X, Y
  }

 private:
  LinearWorkloadOptions o_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  Payload payload_;
};

}  // namespace

// ------------------------------------------------------------ kv_attention
// A session: prefill (sequence_start) with `prefill` tokens, then `decodes` single
// token steps; the last request of the session carries sequence_end.
struct Session {
  uint64_t id = 0;
  int64_t prefill = 0;
  int64_t decodes = 0;
  int64_t step = 0;  // requests completed so far: 0 = prefill pending
  bool ended = false;
};

namespace {

class KvWorkload : public Workload {
 public:
  explicit KvWorkload(const KvWorkloadOptions& o)
      : o_(o), rng_(o.seed),
        payload_(o.dtype, std::min<int64_t>(int64_t(1) << 22, std::max<int64_t>(1, o.prefill_len.max()) * o.heads_q * o.head_dim * 2),
                 o.seed ^ 0x5eed) {
    // Ids differ between runs and processes so that stale server sessions never collide.
    next_id_ = (std::random_device{}() | (uint64_t(std::random_device{}()) << 32)) & 0x7fffffffffff0000ull;
    if (next_id_ == 0) next_id_ = 1 << 16;
  }
  const std::string& model() const override { return o_.model; }
  std::vector<std::string> tags() const override { return {"prefill", "decode"}; }
  std::string Describe() const override {
    return absl::StrFormat("%s %s Hq=%d Hkv=%d D=%d sessions: prefill=%s decode_steps=%s", o_.model,
                           DTypeName(o_.dtype), o_.heads_q, o_.heads_kv, o_.head_dim, o_.prefill_len.spec(),
                           o_.decode_steps.spec());
  }
  int64_t sessions_completed() const override { return completed_.load(); }
  std::string_view random_bytes() const override { return payload_.bytes(); }
  int64_t max_request_bytes() const override {  // a prefill: Q, O, K, V
    const int64_t n = std::max<int64_t>(1, o_.prefill_len.max());
    return 2 * n * (o_.heads_q + o_.heads_kv) * o_.head_dim * DTypeSize(o_.dtype);
  }

  Work Next() override {
    auto s = std::make_shared<Session>();
    RequestRng local;
    {
      std::lock_guard<std::mutex> l(mu_);
      s->id = ++next_id_;
      s->prefill = std::max<int64_t>(1, o_.prefill_len.Sample(rng_));
      s->decodes = std::max<int64_t>(0, o_.decode_steps.Sample(rng_));
      local.seed(RequestRng::result_type(rng_()));
    }
    return Step(s, local, false);
  }

  std::optional<Work> Complete(const Work& w, bool ok, bool continue_session) override {
    if (!w.session) return std::nullopt;
    Session& s = *w.session;
    const bool existed = s.step > 0;  // an earlier request of this session succeeded
    ++s.step;
    if (ok && s.step > s.decodes) {  // that was the sequence_end request
      s.ended = true;
      completed_.fetch_add(1);
      return std::nullopt;
    }
    if (!ok) {
      // The server's session is in an unknown state. Abandon it, but ask the server to
      // end it during Drain() if it may exist, so that its KV blocks come back.
      s.ended = true;
      if (existed || s.step > 1) {
        std::lock_guard<std::mutex> l(mu_);
        open_.push_back(w.session);
      }
      return std::nullopt;
    }
    if (!continue_session) {
      std::lock_guard<std::mutex> l(mu_);
      open_.push_back(w.session);
      return std::nullopt;
    }
    RequestRng local;
    {
      std::lock_guard<std::mutex> l(mu_);
      local.seed(RequestRng::result_type(rng_()));
    }
    return Step(w.session, local, false);
  }

  std::vector<Work> Drain() override {
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard<std::mutex> l(mu_);
      open.swap(open_);
    }
    std::vector<Work> out;
    RequestRng local(o_.seed);
    for (auto& s : open) out.push_back(Step(s, local, true));
    return out;
  }

 private:
  Work Step(const std::shared_ptr<Session>& s, RequestRng& rng, bool force_end) {
    const bool start = s->step == 0;
    const int64_t n = start ? s->prefill : 1;
    const bool end = force_end || s->step >= s->decodes;
    auto req = std::make_shared<inference::ModelInferRequest>();
    req->set_model_name(o_.model);
    const int64_t qs[] = {n, o_.heads_q, o_.head_dim}, ks[] = {n, o_.heads_kv, o_.head_dim};
    Work w;
    payload_.AddInput(*req, w, o_.resident_inputs, "Q", qs, rng);
    payload_.AddInput(*req, w, o_.resident_inputs, "K", ks, rng);
    payload_.AddInput(*req, w, o_.resident_inputs, "V", ks, rng);
    client::SetSequence(*req, s->id, start, end);
    client::RequestOutput(*req, "O");
    w.request = std::move(req);
    w.units = n;
    w.tag = start ? 0 : 1;
    w.session = s;
    w.output_bytes = {n * o_.heads_q * o_.head_dim * DTypeSize(o_.dtype)};
    return w;
  }

  KvWorkloadOptions o_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  Payload payload_;
  uint64_t next_id_;
  std::vector<std::shared_ptr<Session>> open_;  // sessions to end in Drain()
  std::atomic<int64_t> completed_{0};
};

}  // namespace

std::unique_ptr<Workload> MakeAttentionWorkload(const AttentionWorkloadOptions& o) {
  return std::make_unique<AttentionWorkload>(o);
}
std::unique_ptr<Workload> MakeKvWorkload(const KvWorkloadOptions& o) { return std::make_unique<KvWorkload>(o); }
std::unique_ptr<Workload> MakeLinearWorkload(const LinearWorkloadOptions& o) {
  return std::make_unique<LinearWorkload>(o);
}

}  // namespace flashq::bench
