#include "client/bench/scenarios.h"

#include "absl/strings/str_format.h"

namespace flashq::bench {

const std::vector<PresetInfo>& Presets() {
  static const std::vector<PresetInfo> kPresets = {
      {"attention_ragged", "attention FP16, GQA Hq=8 Hkv=2 D=64, 1-4 causal sequences/request, lengths lognormal:64:0.5:16:256"},
      {"attention_fixed", "attention FP16, Hq=32 Hkv=8 D=128, one causal sequence of 128 tokens (perf_analyzer-comparable)"},
      {"linear_int4", "up_proj_int4 (W4A16, X[M,4096] -> Y[M,14336]) FP16, M uniform:1:4; concurrency 1,2,4 unless given"},
      {"linear_bf16", "up_proj_bf16, FP16 X, M uniform:1:16"},
      {"linear_fp8", "up_proj_fp8, FP16 X, M uniform:1:16"},
      {"down_int4", "down_proj_int4 (X[M,14336] -> Y[M,4096]), M uniform:1:16"},
      {"kv_decode", "kv_attention sessions (Hq=32 Hkv=8 D=128): prefill lognormal:64:0.5:16:256 tokens, 16 decode steps, end"},
  };
  return kPresets;
}

ScenarioSpec::Kind KindForModel(std::string_view model) {
  if (model == "attention") return ScenarioSpec::Kind::kAttention;
  if (model == "kv_attention") return ScenarioSpec::Kind::kKv;
  return ScenarioSpec::Kind::kLinear;
}

absl::StatusOr<ScenarioSpec::Kind> ParseKind(std::string_view s) {
  if (s == "attention") return ScenarioSpec::Kind::kAttention;
  if (s == "kv" || s == "kv_attention") return ScenarioSpec::Kind::kKv;
  if (s == "linear") return ScenarioSpec::Kind::kLinear;
  return absl::InvalidArgumentError(absl::StrFormat("--workload: '%s' is not attention, kv or linear", s));
}

absl::StatusOr<ScenarioSpec> Preset(std::string_view name) {
  ScenarioSpec s;
  s.name = std::string(name);
  auto linear = [&](const char* model, const char* m) {
    s.kind = ScenarioSpec::Kind::kLinear;
    s.model = model;
    s.m = m;
    s.concurrency = "1,2,4";  // ~0.1-1 s per request on the CPU backend: 16 outstanding is a long queue
  };
  if (name == "attention_ragged") {
    s.kind = ScenarioSpec::Kind::kAttention;
    s.model = "attention";
    s.heads_q = 8, s.heads_kv = 2, s.head_dim = 64;
    s.seq_len = "lognormal:64:0.5:16:256";
    s.seqs_per_request = "uniform:1:4";
  } else if (name == "attention_fixed") {
    s.kind = ScenarioSpec::Kind::kAttention;
    s.model = "attention";
    s.heads_q = 32, s.heads_kv = 8, s.head_dim = 128;
    s.seq_len = "fixed:128";
  } else if (name == "linear_int4") {
    linear("up_proj_int4", "uniform:1:4");
  } else if (name == "linear_bf16") {
    linear("up_proj_bf16", "uniform:1:16");
  } else if (name == "linear_fp8") {
    linear("up_proj_fp8", "uniform:1:16");
  } else if (name == "down_int4") {
    linear("down_proj_int4", "uniform:1:16");
  } else if (name == "kv_decode") {
    s.kind = ScenarioSpec::Kind::kKv;
    s.model = "kv_attention";
    s.heads_q = 32, s.heads_kv = 8, s.head_dim = 128;
    s.prefill_len = "lognormal:64:0.5:16:256";
    s.decode_steps = "fixed:16";
  } else {
    std::string names;
    for (auto& p : Presets()) names += (names.empty() ? "" : ", ") + p.name;
    return absl::InvalidArgumentError(absl::StrFormat("unknown scenario '%s' (known: %s)", name, names));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<Workload>> BuildWorkload(const ScenarioSpec& s, uint64_t seed) {
  DType dt;
  if (s.dtype == "fp16" || s.dtype == "FP16") dt = DType::kF16;
  else if (s.dtype == "bf16" || s.dtype == "BF16") dt = DType::kBF16;
  else if (s.dtype == "fp32" || s.dtype == "FP32") dt = DType::kF32;
  else return absl::InvalidArgumentError(absl::StrFormat("--dtype: '%s' is not fp16, bf16 or fp32", s.dtype));
  if (s.heads_q <= 0 || s.heads_kv <= 0 || s.head_dim <= 0)
    return absl::InvalidArgumentError("heads and head dim must be positive");
  switch (s.kind) {
    case ScenarioSpec::Kind::kAttention: {
      AttentionWorkloadOptions o;
      o.model = s.model;
      o.dtype = dt;
      o.heads_q = s.heads_q, o.heads_kv = s.heads_kv, o.head_dim = s.head_dim;
      auto sl = IntDistribution::Parse(s.seq_len);
      if (!sl.ok()) return sl.status();
      auto sp = IntDistribution::Parse(s.seqs_per_request);
      if (!sp.ok()) return sp.status();
      auto kx = IntDistribution::Parse(s.kv_extra);
      if (!kx.ok()) return kx.status();
      o.seq_len = *sl, o.seqs_per_request = *sp, o.kv_extra = *kx;
      o.causal = s.causal;
      o.send_cu_seqlens = s.cu_seqlens;
      o.resident_inputs = s.resident_inputs;
      o.seed = seed;
      return MakeAttentionWorkload(o);
    }
    case ScenarioSpec::Kind::kKv: {
      KvWorkloadOptions o;
      o.model = s.model;
      o.dtype = dt;
      o.heads_q = s.heads_q, o.heads_kv = s.heads_kv, o.head_dim = s.head_dim;
      auto pl = IntDistribution::Parse(s.prefill_len);
      if (!pl.ok()) return pl.status();
      auto ds = IntDistribution::Parse(s.decode_steps);
      if (!ds.ok()) return ds.status();
      o.prefill_len = *pl, o.decode_steps = *ds;
      o.resident_inputs = s.resident_inputs;
      o.seed = seed;
      return MakeKvWorkload(o);
    }
    case ScenarioSpec::Kind::kLinear: {
      LinearWorkloadOptions o;
      o.model = s.model;
      o.dtype = dt;
      o.k = s.k > 0 ? s.k : (s.model.rfind("down", 0) == 0 ? 14336 : 4096);
      o.n = s.n;
      auto m = IntDistribution::Parse(s.m);
      if (!m.ok()) return m.status();
      o.m = *m;
      o.resident_inputs = s.resident_inputs;
      o.seed = seed;
      return MakeLinearWorkload(o);
    }
  }
  return absl::InternalError("unreachable");
}

}  // namespace flashq::bench
