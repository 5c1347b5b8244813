// Attention kernel benchmark (our kernels). Checks first, times second:
//  - every configuration (and every variant) is spot-checked against a float64 CPU computation of
//    sampled query rows with a relative bound, |got - r| <= 0.01 * (rms(ref row) + |r|), r = ref rounded
//    to bf16 (at 16k-32k keys |O| is ~0.01, where an absolute bound would pass a scaled output);
//    any failed check makes the exit status 1, after the JSON is written;
//  - timing: CUDA events around each launch, a 256 MB L2 flush before each repetition (like
//    triton.testing.do_bench), warm-up, median of the repetitions.
// Writes JSON (one object with "prefill", "decode", "copy" entries) for bench/attention/peers.py.
// Usage: attention_bench --json out.json [--quick] [--check-only] [--filter NAME]
//   --check-only runs and checks every configuration once, without timing (the GPU test run).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/launch_decls.h"
#include "common/dtype.h"

using namespace flashq;
using namespace flashq::attention;

namespace flashq::attention::detail {  // bench-only variants, prefill_variants.cu
template <typename T, int D, bool kCausal, int kBMOverride, int kMTOverride>
Status LaunchPrefillImpl(const VarlenAttentionParams& p, cudaStream_t stream);
template <typename T, int D, bool kCausal>  // prefill_variants.cu
Status LaunchPrefillWgmma(const VarlenAttentionParams& p, cudaStream_t stream);
template <typename T, int D, bool kCausal, bool kPingPong>
Status LaunchPrefillWsImpl(const VarlenAttentionParams& p, cudaStream_t stream);
template <typename T, int D, bool kCausal, bool kTmaTails>
Status LaunchPrefillTmaImpl(const VarlenAttentionParams& p, cudaStream_t stream);
template <typename T, int D>  // decode_variants.cu
Status LaunchPagedDecodeSplit(const PagedDecodeParams& p, int split_tokens, cudaStream_t stream, bool pdl,
                              bool tma);
}

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define OKS(x)                                                                       \
  do {                                                                               \
    Status s_ = (x);                                                                 \
    if (!s_.ok()) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_.message().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

// Deterministic pseudo-normal values (sum of 4 hashed uniforms, centred, unit variance), bf16.
// Each seed has its own 4 streams (seed * 4 + r), so tensors filled with seeds 1, 2, 3 share no
// uniforms: with overlapping streams q and k of the same token correlate and one key dominates
// each softmax, which hides errors of the long-sequence sums.
__global__ void FillRandom(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (uint32_t r = 0; r < 4; ++r) {
      uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ (seed * 4u + r) * 0xC2B2AE3Du;
      h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
      s += float(h) * (1.0f / 4294967296.0f);
    }
    x[i] = __float2bfloat16_rn((s - 2.0f) * 1.7320508f);
  }
}

void Fill(void* p, size_t n, uint32_t seed) {
  FillRandom<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CK(cudaGetLastError());
}

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = size_t(256) << 20;
  cudaEvent_t a, b;
  Timer() {
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  template <typename F>
  double MedianMs(F&& f, int reps) {
    if (reps == 0) return 0.0;  // --check-only
    for (int i = 0; i < 3; ++i) f();
    CK(cudaDeviceSynchronize());
    std::vector<float> ts;
    for (int r = 0; r < reps; ++r) {
      CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
      CK(cudaEventRecord(a));
      f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  }
};

std::vector<uint16_t> ToHost(const void* d, size_t n) {
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

// The sampled rows of one check: the float64 reference and the kernel's values, side by side,
// d values per row.
struct RowSamples {
  int d = 0;
  std::vector<double> ref, got;
};

struct CheckResult {
  double max_abs = 0, max_rel = 0, rms = 0;
  bool ok = false;
};

constexpr double kCheckRtol = 1e-2;  // bf16 output: one unit in the last place plus P's rounding
// A sampled element passes when |got - r| <= kCheckRtol * (rms(ref row) + |r|).
int g_failed_checks = 0;

// Each row is bounded by its own RMS: a row over 16k keys has |O| ~ 0.01, a row over a few keys ~ 1.
CheckResult Evaluate(const RowSamples& s) {
  CheckResult c;
  bool finite = !s.ref.empty();
  double all_sq = 0;
  for (size_t row = 0; row * s.d < s.ref.size(); ++row) {
    double sq = 0;
    for (int k = 0; k < s.d; ++k) sq += s.ref[row * s.d + k] * s.ref[row * s.d + k];
    all_sq += sq;
    const double rms = std::sqrt(sq / s.d);
    if (!(rms > 0)) finite = false;
    for (int k = 0; k < s.d; ++k) {
      const size_t i = row * s.d + k;
      const double r = Bf16ToFloat(FloatToBf16(float(s.ref[i])));
      const double err = std::fabs(s.got[i] - r);
      if (!std::isfinite(s.got[i])) finite = false;
      c.max_abs = std::max(c.max_abs, err);
      c.max_rel = std::max(c.max_rel, err / (rms + std::fabs(r)));
    }
  }
  c.rms = s.ref.empty() ? 0 : std::sqrt(all_sq / double(s.ref.size()));
  c.ok = finite && c.max_rel <= kCheckRtol;
  if (!c.ok) ++g_failed_checks;
  return c;
}

// float64 attention for one query row; keys given by a row-address function. Appends the
// reference and the kernel's row `got` (bf16 bits) to *samples.
template <typename KeyOff>
void RowSample(const std::vector<uint16_t>& q, size_t q_off, const std::vector<uint16_t>& k,
               const std::vector<uint16_t>& v, KeyOff key_off, int visible, int d, float scale, const uint16_t* got,
               RowSamples* samples) {
  std::vector<double> s(size_t(std::max(visible, 1)));
  double mx = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    double dot = 0;
    const size_t ko = key_off(j);
    for (int c = 0; c < d; ++c) dot += double(Bf16ToFloat(q[q_off + c])) * Bf16ToFloat(k[ko + c]);
    s[size_t(j)] = dot * scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  double sum = 0;
  std::vector<double> o(size_t(d), 0.0);
  for (int j = 0; j < visible; ++j) {
    const double p = std::exp(s[size_t(j)] - mx);
    sum += p;
    const size_t vo = key_off(j);
    for (int c = 0; c < d; ++c) o[size_t(c)] += p * Bf16ToFloat(v[vo + c]);
  }
  for (int c = 0; c < d; ++c) {
    samples->ref.push_back(visible ? o[size_t(c)] / sum : 0.0);
    samples->got.push_back(Bf16ToFloat(got[c]));
  }
}

uint32_t Lcg(uint32_t& s) {
  s = s * 1664525u + 1013904223u;
  return s >> 8;
}

std::string Json(const char* k, double v) { return "\"" + std::string(k) + "\": " + std::to_string(v); }

struct PrefillCfg {
  std::string name;
  int d;
  bool causal;
  std::vector<int> lens;
};

std::string RunPrefill(Timer& timer, const PrefillCfg& cfg, int reps) {
  const int h = 32, d = cfg.d, batch = int(cfg.lens.size());
  std::vector<int32_t> cu(size_t(batch) + 1, 0);
  double pairs = 0;
  for (int b = 0; b < batch; ++b) {
    cu[size_t(b) + 1] = cu[size_t(b)] + cfg.lens[size_t(b)];
    const double l = cfg.lens[size_t(b)];
    pairs += cfg.causal ? l * (l + 1) / 2 : l * l;
  }
  const int total = cu.back(), max_len = *std::max_element(cfg.lens.begin(), cfg.lens.end());
  const size_t n = size_t(total) * h * d;
  void *q, *k, *v, *o, *dcu;
  float* lse;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&lse, size_t(total) * h * 4));
  CK(cudaMalloc(&dcu, cu.size() * 4));
  CK(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  Fill(q, n, 1); Fill(k, n, 2); Fill(v, n, 3);
  CK(cudaMemset(o, 0xFF, n * 2));
  VarlenAttentionParams p;
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
  p.cu_seqlens_q = p.cu_seqlens_k = static_cast<int32_t*>(dcu);
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(h) * d;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.batch = batch; p.num_heads_q = p.num_heads_kv = h; p.head_dim = d; p.max_seqlen_q = max_len;
  p.softmax_scale = 1.0f / std::sqrt(float(d)); p.causal = cfg.causal; p.dtype = DType::kBF16;
  OKS(RunVarlenAttention(p, nullptr));
  CK(cudaDeviceSynchronize());
  // Spot check: 12 sampled (token, head) rows against float64.
  auto hq = ToHost(q, n), hk = ToHost(k, n), hv = ToHost(v, n);
  auto check = [&]() {
    auto ho = ToHost(o, n);
    RowSamples samples;
    samples.d = d;
    uint32_t seed = 42;
    for (int sample = 0; sample < 12; ++sample) {
      const int b = int(Lcg(seed) % uint32_t(batch));
      const int len = cfg.lens[size_t(b)];
      const int i = sample == 0 ? len - 1 : int(Lcg(seed) % uint32_t(len)), hh = int(Lcg(seed) % h);
      const size_t row = (size_t(cu[size_t(b)]) + i) * h + hh;
      auto key_off = [&](int j) { return ((size_t(cu[size_t(b)]) + j) * h + hh) * d; };
      RowSample(hq, row * d, hk, hv, key_off, cfg.causal ? i + 1 : len, d, p.softmax_scale, ho.data() + row * d,
                &samples);
    }
    return Evaluate(samples);
  };
  const CheckResult chk = check();
  const bool ok = chk.ok;
  const double ms = timer.MedianMs([&] { OKS(RunVarlenAttention(p, nullptr)); }, reps);
  const double flops = 4.0 * pairs * h * d;
  const double tflops = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
  std::printf("prefill %-24s %8.3f ms  %7.1f TFLOP/s  check max err/(rms+|ref|) %.3g (rms %.3g) %s\n", cfg.name.c_str(),
              ms, tflops, chk.max_rel, chk.rms, ok ? "ok" : "FAIL");
  std::string variant;
  // Variants (not what RunVarlenAttention picks on Hopper): the TMA kernel with TMA tail tiles,
  // the plain wgmma kernel, the
  // cp.async warp-specialised wgmma kernel with and without consumer ping-pong, and the mma.sync
  // kernel shipped for sm_80/sm_89.
  std::vector<std::pair<std::string, std::function<Status()>>> variants;
  using detail::LaunchPrefill;
  using detail::LaunchPrefillImpl;
  using BF = __nv_bfloat16;
  using detail::LaunchPrefillWs;
  using detail::LaunchPrefillWsImpl;
  using detail::LaunchPrefillWgmma;
  using detail::LaunchPrefillTmaImpl;
  if (d == 128) {
    variants.push_back({"tma_tails", [&] { return cfg.causal ? LaunchPrefillTmaImpl<BF, 128, true, true>(p, nullptr) : LaunchPrefillTmaImpl<BF, 128, false, true>(p, nullptr); }});
    variants.push_back({"wgmma", [&] { return cfg.causal ? LaunchPrefillWgmma<BF, 128, true>(p, nullptr) : LaunchPrefillWgmma<BF, 128, false>(p, nullptr); }});
    variants.push_back({"ws_pingpong", [&] { return cfg.causal ? LaunchPrefillWs<BF, 128, true>(p, nullptr) : LaunchPrefillWs<BF, 128, false>(p, nullptr); }});
    variants.push_back({"ws", [&] { return cfg.causal ? LaunchPrefillWsImpl<BF, 128, true, false>(p, nullptr) : LaunchPrefillWsImpl<BF, 128, false, false>(p, nullptr); }});
    variants.push_back({"mma_mt2", [&] { return cfg.causal ? LaunchPrefill<BF, 128, true>(p, nullptr) : LaunchPrefill<BF, 128, false>(p, nullptr); }});
  } else if (d == 64) {
    variants.push_back({"tma_tails", [&] { return cfg.causal ? LaunchPrefillTmaImpl<BF, 64, true, true>(p, nullptr) : LaunchPrefillTmaImpl<BF, 64, false, true>(p, nullptr); }});
    variants.push_back({"wgmma", [&] { return cfg.causal ? LaunchPrefillWgmma<BF, 64, true>(p, nullptr) : LaunchPrefillWgmma<BF, 64, false>(p, nullptr); }});
    variants.push_back({"ws_pingpong", [&] { return cfg.causal ? LaunchPrefillWs<BF, 64, true>(p, nullptr) : LaunchPrefillWs<BF, 64, false>(p, nullptr); }});
    variants.push_back({"ws", [&] { return cfg.causal ? LaunchPrefillWsImpl<BF, 64, true, false>(p, nullptr) : LaunchPrefillWsImpl<BF, 64, false, false>(p, nullptr); }});
    variants.push_back({"mma_mt2", [&] { return cfg.causal ? LaunchPrefill<BF, 64, true>(p, nullptr) : LaunchPrefill<BF, 64, false>(p, nullptr); }});
  }
  for (auto& variant_entry : variants) {
    const std::string& vname = variant_entry.first;
    std::function<Status()>& fn = variant_entry.second;
    auto launch = [&] { OKS(fn()); };
    CK(cudaMemset(o, 0xFF, n * 2));
    launch();
    CK(cudaDeviceSynchronize());
    const CheckResult v = check();
    const double vms = timer.MedianMs(launch, reps);
    const double vtf = vms > 0 ? flops / (vms * 1e-3) / 1e12 : 0.0;
    std::printf("  variant %-17s %8.3f ms  %7.1f TFLOP/s  check max err/(rms+|ref|) %.3g %s\n", vname.c_str(), vms, vtf,
                v.max_rel, v.ok ? "ok" : "FAIL");
    variant += ", \"variant_" + vname + "\": {" + Json("ms", vms) + ", " + Json("tflops", vtf) + ", " +
               Json("check_max_abs_err", v.max_abs) + ", " + Json("check_max_rel_err", v.max_rel) +
               ", \"check_ok\": " + (v.ok ? "true" : "false") + "}";
  }
  std::string lens = "[";
  for (size_t i = 0; i < cfg.lens.size(); ++i) lens += (i ? "," : "") + std::to_string(cfg.lens[i]);
  lens += "]";
  CK(cudaFree(q)); CK(cudaFree(k)); CK(cudaFree(v)); CK(cudaFree(o)); CK(cudaFree(lse)); CK(cudaFree(dcu));
  return "{\"name\": \"" + cfg.name + "\", \"head_dim\": " + std::to_string(d) + ", \"heads\": 32, \"causal\": " +
         (cfg.causal ? "true" : "false") + ", \"lens\": " + lens + ", " + Json("ms", ms) + ", " +
         Json("flops", flops) + ", " + Json("tflops", tflops) + ", " + Json("check_max_abs_err", chk.max_abs) + ", " +
         Json("check_max_rel_err", chk.max_rel) + ", \"check_ok\": " + (ok ? "true" : "false") + variant + "}";
}

struct DecodeCfg {
  int batch, len, page, split;
};

std::string RunDecode(Timer& timer, const DecodeCfg& cfg, int reps) {
  const int hq = 32, hkv = 8, d = 128, b = cfg.batch, L = cfg.len, page = cfg.page;
  const int blocks_per_seq = (L + page - 1) / page, num_blocks = b * blocks_per_seq;
  const size_t cache_elems = size_t(num_blocks) * page * hkv * d;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::vector<int32_t> seqlens(static_cast<size_t>(b), L), cuq(static_cast<size_t>(b) + 1);
  std::iota(table.begin(), table.end(), 0);
  uint32_t seed = 7;
  for (size_t i = table.size(); i > 1; --i) std::swap(table[i - 1], table[Lcg(seed) % i]);  // scattered pages
  for (int i = 0; i <= b; ++i) cuq[size_t(i)] = i;
  void *q, *o, *kc, *vc, *dt, *ds, *dq, *ws;
  CK(cudaMalloc(&q, size_t(b) * hq * d * 2)); CK(cudaMalloc(&o, size_t(b) * hq * d * 2));
  CK(cudaMalloc(&kc, cache_elems * 2)); CK(cudaMalloc(&vc, cache_elems * 2));
  CK(cudaMalloc(&dt, table.size() * 4)); CK(cudaMalloc(&ds, seqlens.size() * 4)); CK(cudaMalloc(&dq, cuq.size() * 4));
  const size_t ws_bytes = PagedDecodeWorkspaceBytes(b, hq, d, L, cfg.split);
  CK(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)));
  CK(cudaMemcpy(dt, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds, seqlens.data(), seqlens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dq, cuq.data(), cuq.size() * 4, cudaMemcpyHostToDevice));
  Fill(q, size_t(b) * hq * d, 11); Fill(kc, cache_elems, 12); Fill(vc, cache_elems, 13);
  CK(cudaMemset(o, 0xFF, size_t(b) * hq * d * 2));
  PagedDecodeParams p;
  p.q = q; p.k_cache = kc; p.v_cache = vc; p.o = o;
  p.block_table = static_cast<int32_t*>(dt); p.seqlens_k = static_cast<int32_t*>(ds);
  p.cu_seqlens_q = static_cast<int32_t*>(dq); p.workspace = ws; p.workspace_bytes = ws_bytes;
  p.q_row_stride = p.o_row_stride = int64_t(hq) * d; p.q_head_stride = p.o_head_stride = d;
  p.kv_row_stride = int64_t(hkv) * d; p.kv_block_stride = int64_t(page) * hkv * d; p.kv_head_stride = d;
  p.total_q = b; p.batch = b; p.max_blocks_per_seq = blocks_per_seq; p.page_size = page;
  p.max_seqlen_q = 1; p.max_seqlen_k = L; p.num_heads_q = hq; p.num_heads_kv = hkv; p.head_dim = d;
  p.split_tokens = cfg.split; p.softmax_scale = 1.0f / std::sqrt(float(d)); p.causal = true; p.dtype = DType::kBF16;
  OKS(RunPagedDecode(p, nullptr));
  CK(cudaDeviceSynchronize());
  // Spot check 8 (sequence, head) rows against float64.
  auto hqv = ToHost(q, size_t(b) * hq * d), hk = ToHost(kc, cache_elems), hv = ToHost(vc, cache_elems);
  auto check = [&]() {
    auto ho = ToHost(o, size_t(b) * hq * d);
    RowSamples samples;
    samples.d = d;
    uint32_t cseed = 7;
    for (int sample = 0; sample < 8; ++sample) {
      const int bb = int(Lcg(cseed) % uint32_t(b)), hh = int(Lcg(cseed) % hq);
      auto key_off = [&](int j) {
        return ((size_t(table[size_t(bb) * blocks_per_seq + j / page]) * page + j % page) * hkv + hh / 4) * d;
      };
      const size_t row = size_t(bb) * hq + hh;
      RowSample(hqv, row * d, hk, hv, key_off, L, d, p.softmax_scale, ho.data() + row * d, &samples);
    }
    return Evaluate(samples);
  };
  const CheckResult chk = check();
  const bool ok = chk.ok;
  const double ms = timer.MedianMs([&] { OKS(RunPagedDecode(p, nullptr)); }, reps);
  const double bytes = 2.0 * double(b) * L * hkv * d * 2;  // K and V read once
  const double gbps = ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0;
  std::printf("decode  B=%-3d L=%-6d page=%-3d split=%-4d %8.4f ms  %7.1f GB/s  check max err/(rms+|ref|) %.3g (rms %.3g) %s\n",
              b, L, page, cfg.split, ms, gbps, chk.max_rel, chk.rms, ok ? "ok" : "FAIL");
  // Variant: the same kernel with every tile loaded by cp.async (the shipped kernel loads whole
  // tiles by TMA on sm_90, and by cp.async elsewhere).
  std::string variant;
  const int split = cfg.split ? cfg.split : kDefaultSplitTokens;
  std::vector<std::pair<std::string, std::function<Status()>>> variants = {
      {"cpasync", [&] { return detail::LaunchPagedDecodeSplit<__nv_bfloat16, 128>(p, split, nullptr, true, false); }}};
  for (auto& ve : variants) {
    auto launch = [&] { OKS(ve.second()); };
    CK(cudaMemset(o, 0xFF, size_t(b) * hq * d * 2));
    launch();
    CK(cudaDeviceSynchronize());
    const CheckResult v = check();
    const double vms = timer.MedianMs(launch, reps);
    const double vg = vms > 0 ? bytes / (vms * 1e-3) / 1e9 : 0.0;
    std::printf("  variant %-18s %8.4f ms  %7.1f GB/s  check max err/(rms+|ref|) %.3g %s\n", ve.first.c_str(), vms, vg,
                v.max_rel, v.ok ? "ok" : "FAIL");
    variant += ", \"variant_" + ve.first + "\": {" + Json("ms", vms) + ", " + Json("gbps", vg) + ", " +
               Json("check_max_abs_err", v.max_abs) + ", " + Json("check_max_rel_err", v.max_rel) +
               ", \"check_ok\": " + (v.ok ? "true" : "false") + "}";
  }
  CK(cudaFree(q)); CK(cudaFree(o)); CK(cudaFree(kc)); CK(cudaFree(vc));
  CK(cudaFree(dt)); CK(cudaFree(ds)); CK(cudaFree(dq)); CK(cudaFree(ws));
  return "{\"batch\": " + std::to_string(b) + ", \"len\": " + std::to_string(L) + ", \"page\": " +
         std::to_string(page) + ", \"split\": " + std::to_string(cfg.split ? cfg.split : kDefaultSplitTokens) + ", \"heads_q\": 32, \"heads_kv\": 8, " +
         "\"head_dim\": 128, " + Json("ms", ms) + ", " + Json("kv_bytes", bytes) + ", " + Json("gbps", gbps) + ", " +
         Json("check_max_abs_err", chk.max_abs) + ", " + Json("check_max_rel_err", chk.max_rel) +
         ", \"check_ok\": " + (ok ? "true" : "false") + variant + "}";
}

double CopyCeilingGBps(Timer& timer) {
  const size_t bytes = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  const double ms = timer.MedianMs([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  CK(cudaFree(a));
  CK(cudaFree(b));
  const double gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;  // read + write
  std::printf("copy ceiling (D2D, read+write) %.1f GB/s\n", gbps);
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "attention_ours.json";
  bool quick = false, check_only = false;
  std::string filter;  // run only configurations whose name contains this (profiling)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--check-only")) check_only = true;
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
  }
  auto wanted = [&](const std::string& name) { return filter.empty() || name.find(filter) != std::string::npos; };
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  Timer timer;
  const double copy = check_only ? 0.0 : CopyCeilingGBps(timer);

  std::vector<PrefillCfg> prefill;
  for (bool causal : {false, true}) {
    const char* c = causal ? "causal" : "full";
    prefill.push_back({std::string("hd128_b16_l1k_") + c, 128, causal, std::vector<int>(16, 1024)});
    prefill.push_back({std::string("hd128_b4_l4k_") + c, 128, causal, std::vector<int>(4, 4096)});
    prefill.push_back({std::string("hd128_b1_l16k_") + c, 128, causal, std::vector<int>(1, 16384)});
    prefill.push_back({std::string("hd64_b4_l4k_") + c, 64, causal, std::vector<int>(4, 4096)});
    // Ragged: 32 sequences, lengths uniform in [64, 2048], fixed seed.
    std::vector<int> ragged;
    uint32_t seed = 2026;
    for (int i = 0; i < 32; ++i) ragged.push_back(64 + int(Lcg(seed) % (2048 - 64 + 1)));
    prefill.push_back({std::string("hd128_ragged32_") + c, 128, causal, ragged});
  }
  std::vector<DecodeCfg> decode;
  for (int page : {16, 64})
    for (auto bl : {std::pair{1, 32768}, std::pair{32, 4096}, std::pair{64, 8192}})
      decode.push_back({bl.first, bl.second, page, 0});
  for (int split : {512, 1024, 2048}) {  // split-size sweep (a server config choice)
    decode.push_back({1, 32768, 16, split});
    decode.push_back({32, 4096, 16, split});
    decode.push_back({64, 8192, 16, split});
  }
  const int reps = check_only ? 0 : quick ? 5 : 30;
  std::string out = "{\"device\": \"" + std::string(prop.name) + "\", \"sms\": " +
                    std::to_string(prop.multiProcessorCount) + ", " + Json("copy_gbps", copy) + ", \"prefill\": [";
  bool first = true;
  for (size_t i = 0; i < prefill.size(); ++i) {
    if (!wanted(prefill[i].name)) continue;
    out += (first ? "" : ", ") + RunPrefill(timer, prefill[i], reps);
    first = false;
  }
  out += "], \"decode\": [";
  first = true;
  for (size_t i = 0; i < decode.size(); ++i) {
    const DecodeCfg& c = decode[i];
    const std::string name = "decode_b" + std::to_string(c.batch) + "_l" + std::to_string(c.len) + "_page" +
                             std::to_string(c.page) + "_split" + std::to_string(c.split);
    if (!wanted(name)) continue;
    out += (first ? "" : ", ") + RunDecode(timer, c, reps * 2);
    first = false;
  }
  out += "]}\n";
  FILE* f = std::fopen(json_path.c_str(), "w");
  if (!f) return 1;
  std::fputs(out.c_str(), f);
  std::fclose(f);
  std::printf("wrote %s\n", json_path.c_str());
  if (g_failed_checks > 0) {
    std::printf("FAILED: %d correctness checks out of bounds\n", g_failed_checks);
    return 1;
  }
  std::printf("all correctness checks passed\n");
  return 0;
}
