// Workload generators: each produces the next ModelInferRequest to send, with
// the shape drawn from its distributions, and keeps whatever state a request
// stream needs (kv_attention sessions). Thread-safe: completions of earlier calls
// ask for the next request from gRPC's threads.
//
// With `resident_inputs` (flashq-bench --shared-memory), the random floating-point
// inputs are not built per request: each shared-memory slot is filled once with the
// workload's random values and requests point into it, as perf_analyzer writes its
// input data into the regions once. What a request then measures is the server's work
// on inputs already in place, not the client's copying.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/bench/distribution.h"
#include "grpc_service.pb.h"
#include "common/dtype.h"

namespace flashq::bench {

struct Session;

// One request and what it stands for.
struct Work {
  std::shared_ptr<const inference::ModelInferRequest> request;
  int64_t units = 0;  // tokens (attention, kv_attention) or rows M (linear)
  int tag = 0;        // index into Workload::tags(): which sub-histogram it counts in
  std::shared_ptr<Session> session;  // kv_attention only
  std::vector<int64_t> output_bytes;  // per requested output: its size, for a shared-memory range
  // Per input (missing entries are 0): with resident inputs, the size of an input whose
  // values are random and whose raw_input_contents entry is left empty; a shared-memory
  // slot's resident random bytes stand in for it.
  std::vector<int64_t> resident_bytes;
};

class Workload {
 public:
  virtual ~Workload() = default;
  virtual const std::string& model() const = 0;
  virtual std::string Describe() const = 0;
  virtual std::string unit_name() const { return "tokens"; }
  // Sub-histograms reported next to the overall one (e.g. prefill, decode).
  virtual std::vector<std::string> tags() const { return {}; }
  // Starts a new unit of work: a request, or the first request of a kv session.
  virtual Work Next() = 0;
  // Called once per Work when its call ends. Returns the session's next request
  // when there is one and `continue_session` is set; the runner sends it at once
  // (closed loop: in the same slot; open loop: outside the arrival schedule, so an
  // open-loop rate is a rate of new sessions). A session that is not continued stays
  // open until Drain().
  virtual std::optional<Work> Complete(const Work& work, bool ok, bool continue_session) { return std::nullopt; }
  // Requests that close whatever is still open (kv sessions); sent unmeasured.
  virtual std::vector<Work> Drain() { return {}; }
  virtual int64_t sessions_completed() const { return 0; }
  // Bytes of the largest request's inputs and outputs that the shape distributions
  // allow (their maxima): the size of a shared-memory slot.
  virtual int64_t max_request_bytes() const { return 0; }
  // The random values that requests slice their inputs from: what a shared-memory slot
  // is filled with once, for resident inputs.
  virtual std::string_view random_bytes() const { return {}; }
};

// Random values in [-1, 1) encoded once as FP16/BF16; requests copy slices of it.
// The per-request generator of a payload's slice offsets, seeded from the workload's mt19937_64. A mt19937_64 per
// request (two seedings of 312 words, then a twist) made Next() take 2.3 µs for a linear request; with this, 0.27.
using RequestRng = std::minstd_rand;

class Payload {
 public:
  Payload(DType dtype, int64_t max_elements, uint64_t seed);
  std::string Slice(int64_t elements, RequestRng& rng) const;
  // Adds input `name` of `shape` to `req`: a slice; or with `resident`, an empty entry,
  // its size going to w.resident_bytes (see Work).
  void AddInput(inference::ModelInferRequest& req, Work& w, bool resident, std::string_view name,
                std::span<const int64_t> shape, RequestRng& rng) const;
  std::string_view bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  std::string bytes_;
};

struct AttentionWorkloadOptions {
  std::string model = "attention";
  DType dtype = DType::kF16;
  int heads_q = 8, heads_kv = 2, head_dim = 64;
  IntDistribution seq_len = IntDistribution::Fixed(128);       // query length of each sequence
  IntDistribution seqs_per_request = IntDistribution::Fixed(1);
  IntDistribution kv_extra = IntDistribution::Fixed(0);       // K/V length = q length + extra
  bool causal = true;
  bool send_cu_seqlens = true;  // off: one sequence per request and no CU_SEQLENS inputs
  bool resident_inputs = false;
  uint64_t seed = 1;
};

struct KvWorkloadOptions {
  std::string model = "kv_attention";
  DType dtype = DType::kF16;
  int heads_q = 32, heads_kv = 8, head_dim = 128;
  IntDistribution prefill_len = IntDistribution::Fixed(128);
  IntDistribution decode_steps = IntDistribution::Fixed(16);
  bool resident_inputs = false;
  uint64_t seed = 1;
};

struct LinearWorkloadOptions {
  std::string model = "up_proj_int4";
  DType dtype = DType::kF16;
  int64_t k = 4096;  // input features
  int64_t n = 0;     // output features: sizes Y in shared memory (0: unknown)
  IntDistribution m = IntDistribution::Fixed(8);
  bool resident_inputs = false;
  uint64_t seed = 1;
};

std::unique_ptr<Workload> MakeAttentionWorkload(const AttentionWorkloadOptions& o);
std::unique_ptr<Workload> MakeKvWorkload(const KvWorkloadOptions& o);
std::unique_ptr<Workload> MakeLinearWorkload(const LinearWorkloadOptions& o);

}  // namespace flashq::bench
