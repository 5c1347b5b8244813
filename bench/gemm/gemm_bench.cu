// gemm_bench: checks, then times, our linear paths on the GPU.
//   W4A16 (both batch-invariant modes), W8A16, W8A8 (cuBLASLt, tensor-wise and row-wise
//   scales), and our cuBLASLt BF16 wrapper (both modes), plus the device-to-device copy
//   ceiling, for (K, N) in {4096x4096, 4096x14336, 14336x4096, 8192x8192} and
//   M in {1, 4, 16, 32, 64, 128, 256, 1024, 4096}.
// Timing: a CUDA graph of back-to-back calls that rotate over enough weight copies to
// defeat the 50 MB L2 (>= 256 MB); median of 7 replays after a warm-up replay.
// Output: JSON (--out), one record per (method, K, N, M).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_ref.h"
#include "kernels/gemm/quant_formats.h"

using namespace flashq;
using namespace flashq::gemm;

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
#define OK(x)                                                                             \
  do {                                                                                    \
    Status s_ = (x);                                                                      \
    if (!s_.ok()) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_.message().c_str()); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace {

// Rotate weight copies totalling at least this much (at least 2 copies). FLASHQ_BENCH_L2_DEFEAT_MB overrides the 256 MB
// for diagnostics only: a small value leaves the weights in L2, which no record may do.
const size_t kL2Defeat = [] {
  const char* mb = std::getenv("FLASHQ_BENCH_L2_DEFEAT_MB");
  return size_t(mb ? std::atol(mb) : 256) << 20;
}();

// Our kernels' dispatch for this run: the shipped defaults, with the A/B knobs FLASHQ_GEMM_TARGET_WARPS=n,
// FLASHQ_GEMM_STAGED_MAX_M=n, FLASHQ_GEMM_STAGED_FP8_MAX_M=n, FLASHQ_GEMM_STAGED_EARLY_M=n, FLASHQ_GEMM_WGMMA_MIN_M=n,
// FLASHQ_GEMM_NOPAIRS=1, FLASHQ_GEMM_NOCLUSTER=1 and FLASHQ_GEMM_NOPDL=1 from the environment.
const GemmTuning g_tuning = [] {
  auto knob = [](const char* name, int fallback) {
    const char* e = std::getenv(name);
    return e ? std::atoi(e) : fallback;
  };
  GemmTuning t;
  if (const int v = knob("FLASHQ_GEMM_TARGET_WARPS", 0); v > 0) t.target_warps = v;
  t.staged_max_rows = knob("FLASHQ_GEMM_STAGED_MAX_M", t.staged_max_rows);
  t.staged_fp8_max_rows = knob("FLASHQ_GEMM_STAGED_FP8_MAX_M", t.staged_fp8_max_rows);
  t.staged_dequant_first_rows = knob("FLASHQ_GEMM_STAGED_EARLY_M", t.staged_dequant_first_rows);
  t.wgmma_min_rows = knob("FLASHQ_GEMM_WGMMA_MIN_M", t.wgmma_min_rows);
  t.strip_pairs = knob("FLASHQ_GEMM_NOPAIRS", 0) == 0;
  t.split_k_clusters = knob("FLASHQ_GEMM_NOCLUSTER", 0) != 1;
  t.pdl = knob("FLASHQ_GEMM_NOPDL", 0) != 1;
  return t;
}();

std::vector<float> Random(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    x = float((s >> 40) & 0xFFFFFF) / float(1 << 23) - 1.0f;
  }
  return v;
}

cudaStream_t g_stream = nullptr;

// Idle time before each measurement's timed replays (as in torch_peers.py): every measurement then starts from a
// cool, unthrottled GPU whatever ran before it. Without it, large compute-bound GEMMs measured after long
// heavy ones read up to 20% slower (power-limited clocks; docs/perf/experiments.md).
constexpr int kCooldownMs = 200;

// Median over 7 replays of a CUDA graph holding `iters` back-to-back calls (host launch
// overhead excluded, as in the torch peers); fn(i) enqueues call i on g_stream.
double TimeUs(const std::function<void(int)>& fn, double est_us) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int iters = std::clamp(int(2000.0 / std::max(est_us, 1.0)), 5, 200);
  for (int i = 0; i < 3; ++i) fn(i);  // warm-up outside the graph (plans, attributes)
  CK(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) fn(i);
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, g_stream));
  CK(cudaStreamSynchronize(g_stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(kCooldownMs));
  std::vector<double> t;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaEventRecord(a, g_stream));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1000.0 * ms / iters);
  }
  CK(cudaGetLastError());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double EstimateUs(const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn(0);
  CK(cudaEventRecord(a, g_stream));
  fn(1);
  fn(2);
  CK(cudaEventRecord(b, g_stream));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 500.0 * ms;
}

struct Rec {
  std::string method;
  int K, N, M;
  bool invariant;
  double us, weight_bytes;
};

std::vector<Rec> g_recs;
bool g_w8a8 = true;
// --tiles: our invariant GEMM (BF16 and W8A8) also at every instantiated tile, methods "<name>@T.C.B" (tokens, weight
// row groups, blocks per SM): the table InvariantTileFor is read from (docs/perf/gemm.md).
bool g_tiles = false;
// The tiles our invariant GEMM is timed at for M: the dispatch's (tokens 0), then with --tiles every instantiated tile
// that is neither twice as wide as the batch nor under a sixteenth of it.
std::vector<InvariantTile> OursTiles(int M) {
  std::vector<InvariantTile> tiles{InvariantTile{}};
  if (!g_tiles) return tiles;
  for (const InvariantTile& t : InvariantTiles())
    if ((t.tokens == 8 || t.tokens < 2 * M) && t.tokens * 16 >= M) tiles.push_back(t);
  return tiles;
}
// The method-name suffix of a forced tile ("" for the dispatch's).
std::string TileName(const InvariantTile& t) {
  if (t.tokens == 0) return "";
  return "@" + std::to_string(t.tokens) + "." + std::to_string(t.groups) + "." + std::to_string(t.per_sm) +
         (t.weights > 0 ? ".w" + std::to_string(t.weights) : "");
}
// Activation type of the timed W4A16 and W8A16 calls: bf16 (records), or fp16 with --f16 (A/B calls only: the same
// 16-bit data read as fp16; the correctness check stays bf16).
ActType g_act = ActType::kBF16;
std::string g_checks;

void Record(const std::string& method, int K, int N, int M, bool inv, double us, double wbytes) {
  g_recs.push_back({method, K, N, M, inv, us, wbytes});
  std::printf("%-18s K=%5d N=%5d M=%5d inv=%d  %9.2f us  %7.1f TFLOP/s  %7.1f GB/s(weights)\n", method.c_str(), K, N, M, inv, us,
              2.0 * M * N * K / us / 1e6, wbytes / us / 1e3);
  std::fflush(stdout);
}

__global__ void CopyKernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) b[i] = a[i];
}

// Device-to-device copy ceiling, bytes read + written: the better of cudaMemcpyAsync and
// a plain 16-byte-per-thread copy kernel, timed like everything else.
double CopyCeilingGBs(double* memcpy_gbs, double* kernel_gbs) {
  const size_t bytes = 1ull << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  double us = TimeUs([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream)); }, 500);
  *memcpy_gbs = 2.0 * bytes / us / 1e3;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  us = TimeUs([&](int) {
    CopyKernel<<<sms * 8, 256, 0, g_stream>>>(static_cast<const uint4*>(a), static_cast<uint4*>(b), bytes / 16);
  }, 500);
  *kernel_gbs = 2.0 * bytes / us / 1e3;
  cudaFree(a);
  cudaFree(b);
  return std::max(*memcpy_gbs, *kernel_gbs);
}

double RelErr(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isnan(y[i])) return INFINITY;
    num += double(y[i] - ref[i]) * (y[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// A kernel workspace, zero-filled once before first use as RunW4A16 / RunW8A16 require; the caller frees it.
void* ZeroedWorkspace(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 0, bytes));
  return p;
}

// W8A8 arguments over M rows already quantized into xq (E4M3) and xs (their scales), BF16 out into y.
W8A8Args QuantizedArgs(void* xq, void* xs, void* y, int M, bool per_row) {
  W8A8Args a;
  a.x_fp8 = static_cast<uint8_t*>(xq);
  a.x_scale = static_cast<float*>(xs);
  a.per_row_act = per_row;
  a.y = y;
  a.M = M;
  return a;
}

// A device copy of v rounded to BF16.
void* DeviceBf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  void* d = nullptr;
  CK(cudaMalloc(&d, b.size() * 2));
  CK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

void BenchShape(int K, int N, const std::vector<int>& Ms, BlasLt* blas) {
  constexpr int kCheckM = 4;  // the rows of the correctness check below
  // Buffers hold the largest M timed and the check's rows (a call with --ms 1 alone once overran them).
  const int Mmax = std::max(kCheckM, *std::max_element(Ms.begin(), Ms.end()));
  std::printf("== K=%d N=%d: preparing weights\n", K, N);
  std::fflush(stdout);
  auto wf = Random(size_t(N) * K, K * 7 + N);
  // BF16 weights.
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = FloatToBf16(wf[i]);
  const size_t bf16_bytes = wb.size() * 2;
  const int r_bf16 = int(std::max<size_t>(2, (kL2Defeat + bf16_bytes - 1) / bf16_bytes));
  std::vector<void*> wbd(r_bf16);
  for (auto& p : wbd) {
    CK(cudaMalloc(&p, bf16_bytes));
    CK(cudaMemcpy(p, wb.data(), bf16_bytes, cudaMemcpyHostToDevice));
  }
  // Int4, group 128, asymmetric (GPTQ/AWQ style).
  Int4Weights w4 = QuantizeInt4(wf.data(), N, K, 128, false);
  std::vector<std::unique_ptr<W4A16Weights>> w4d(1);
  OK(W4A16Weights::Create(w4, &w4d[0], g_tuning));
  const double w4_bytes = double(N) * K / 2 + double(N) * (K / 128) * 2.5;  // nibbles + fp16 scale + u8 zero
  const int r4 = int(std::max<double>(2, std::ceil(kL2Defeat / w4_bytes)));
  for (int i = 1; i < r4; ++i) {
    w4d.emplace_back();
    OK(w4d[0]->Clone(&w4d.back()));
  }
  // FP8 per-channel.
  Fp8Weights w8 = QuantizeFp8(wf.data(), N, K, true);
  Fp8Weights w8t = QuantizeFp8(wf.data(), N, K, false);
  std::vector<std::unique_ptr<Fp8DeviceWeights>> w8d(1), w8td(1);
  OK(Fp8DeviceWeights::Create(w8, &w8d[0], Fp8Paths::kBoth, g_tuning));
  OK(Fp8DeviceWeights::Create(w8t, &w8td[0], Fp8Paths::kBoth, g_tuning));
  const double w8_bytes = double(N) * K;
  const int r8 = int(std::max<double>(2, std::ceil(kL2Defeat / w8_bytes)));
  for (int i = 1; i < r8; ++i) {
    w8d.emplace_back();
    OK(w8d[0]->Clone(&w8d.back()));
    w8td.emplace_back();
    OK(w8td[0]->Clone(&w8td.back()));
  }
  // Activations and outputs.
  auto xf = Random(size_t(Mmax) * K, 99);
  void* x = DeviceBf16(xf);
  void *y, *xq, *xs;
  CK(cudaMalloc(&y, size_t(Mmax) * N * 2));
  CK(cudaMalloc(&xq, size_t(Mmax) * K));
  CK(cudaMalloc(&xs, size_t(Mmax) * 4));
  // A workspace serves one weight's layout (the copies of a weight share one): W4A16 (both modes) and W8A16 each have
  // their own.
  const size_t ws_bytes = std::max(W4A16WorkspaceBytes(*w4d[0], Mmax, false), W4A16WorkspaceBytes(*w4d[0], Mmax, true));
  const size_t ws8_bytes = W8A16WorkspaceBytes(*w8d[0], Mmax);
  void* ws = ZeroedWorkspace(ws_bytes);
  void* ws8 = ZeroedWorkspace(ws8_bytes);

  // ---- check first: M = 4 against the CPU references ----
  {
    const int M = kCheckM;
    std::vector<float> xr(xf.begin(), xf.begin() + size_t(M) * K);
    for (auto& v : xr) v = Bf16ToFloat(FloatToBf16(v));
    std::vector<float> ref(size_t(M) * N), got(size_t(M) * N);
    std::vector<uint16_t> yh(size_t(M) * N);
    auto fetch = [&]() {
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(yh.data(), y, yh.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < yh.size(); ++i) got[i] = Bf16ToFloat(yh[i]);
    };
    char line[512];
    LinearRefInt4<float>(xr.data(), M, w4, ref.data());
    CK(cudaMemset(y, 0xff, yh.size() * 2));
    OK(RunW4A16(*w4d[0], LinearArgs{x, y, M, ActType::kBF16, true, ws, ws_bytes, g_tuning}, blas, nullptr));
    fetch();
    double e4 = RelErr(got, ref);
    LinearRefFp8W8A16<float>(xr.data(), M, w8, ref.data());
    CK(cudaMemset(y, 0xff, yh.size() * 2));
    OK(RunW8A16(*w8d[0], LinearArgs{x, y, M, ActType::kBF16, true, ws8, ws8_bytes, g_tuning}, nullptr));
    fetch();
    double e8 = RelErr(got, ref);
    LinearRefBf16<float>(xr.data(), M, K, wb.data(), N, ref.data());
    CK(cudaMemset(y, 0xff, yh.size() * 2));
    OK(RunBf16(blas, wbd[0], N, K, LinearArgs{x, y, M, ActType::kBF16, true, nullptr, 0, g_tuning}, nullptr));
    fetch();
    double eb = RelErr(got, ref);
    CK(cudaMemset(y, 0xff, yh.size() * 2));
    OK(RunW16Invariant(wbd[0], N, K, LinearArgs{x, y, M, ActType::kBF16, true, nullptr, 0, g_tuning}, nullptr));
    fetch();
    const double ebo = RelErr(got, ref);
    double e88 = 0, e88o = 0;
    if (g_w8a8) {
      LinearRefFp8W8A8<float>(xr.data(), M, w8, true, ref.data());
      OK(RunQuantizeActFp8(x, ActType::kBF16, M, K, true, static_cast<uint8_t*>(xq), static_cast<float*>(xs), nullptr));
      CK(cudaMemset(y, 0xff, yh.size() * 2));
      const W8A8Args a8 = QuantizedArgs(xq, xs, y, M, true);
      OK(RunW8A8(blas, *w8d[0], a8, nullptr));
      fetch();
      e88 = RelErr(got, ref);
      CK(cudaMemset(y, 0xff, yh.size() * 2));
      OK(RunW8A8Invariant(*w8d[0], a8, nullptr));
      fetch();
      e88o = RelErr(got, ref);
    }
    // With --no-w8a8 the W8A8 check is not run: its error is left out (JSON) or marked skipped, never shown as 0.
    char w8a8_json[96] = "", w8a8_text[64] = "skipped (--no-w8a8)";
    if (g_w8a8) {
      std::snprintf(w8a8_json, sizeof w8a8_json, ",\"w8a8_rowwise\":%.3g,\"w8a8_rowwise_ours\":%.3g", e88, e88o);
      std::snprintf(w8a8_text, sizeof w8a8_text, "%.2e (ours %.2e)", e88, e88o);
    }
    std::snprintf(line, sizeof line,
                  "%s{\"K\":%d,\"N\":%d,\"M\":%d,\"rel_err\":{\"w4a16\":%.3g,\"w8a16\":%.3g,\"bf16_cublaslt\":%.3g,"
                  "\"bf16_ours\":%.3g%s}}",
                  g_checks.empty() ? "" : ",", K, N, M, e4, e8, eb, ebo, w8a8_json);
    g_checks += line;
    std::printf("check K=%d N=%d M=%d: rel err w4a16 %.2e  w8a16 %.2e  bf16 %.2e  bf16 ours %.2e  w8a8 %s\n", K, N, M, e4,
                e8, eb, ebo, w8a8_text);
    if (!(e4 < 1e-2 && e8 < 1e-2 && eb < 1e-2 && ebo < 1e-2 && e88 < 2e-2 && e88o < 2e-2)) {
      std::fprintf(stderr, "correctness check failed\n");
      std::exit(1);
    }
  }

  // ---- time ----
  const std::string act_suffix = g_act == ActType::kF16 ? "_f16" : "";  // --f16 timings carry their own method names
  for (int M : Ms) {
    for (bool inv : {true, false}) {
      auto bf = [&](int i) { OK(RunBf16(blas, wbd[i % r_bf16], N, K, LinearArgs{x, y, M, ActType::kBF16, inv, nullptr, 0, g_tuning}, g_stream)); };
      OK(WarmBf16(blas, M, N, K, ActType::kBF16, inv));
      Record("bf16_cublaslt", K, N, M, inv, TimeUs(bf, EstimateUs(bf)), bf16_bytes);
      // Our 16-bit kernel is invariant by construction: one row, beside cuBLASLt's two.
      for (const InvariantTile& tile : inv ? OursTiles(M) : std::vector<InvariantTile>{}) {
        GemmTuning tt = g_tuning;
        tt.invariant_tile = tile;
        auto bo = [&](int i) {
          OK(RunW16Invariant(wbd[i % r_bf16], N, K, LinearArgs{x, y, M, ActType::kBF16, true, nullptr, 0, tt},
                             g_stream));
        };
        Record("bf16_ours" + TileName(tile), K, N, M, true, TimeUs(bo, EstimateUs(bo)), bf16_bytes);
      }
      auto q4 = [&](int i) { OK(RunW4A16(*w4d[i % r4], LinearArgs{x, y, M, g_act, inv, ws, ws_bytes, g_tuning}, blas, g_stream)); };
      if (!inv && M >= kW4A16DequantMinM) OK(WarmBf16(blas, M, N, K, ActType::kBF16, false));
      Record("w4a16_g128" + act_suffix, K, N, M, inv, TimeUs(q4, EstimateUs(q4)), w4_bytes);
    }
    auto q8 = [&](int i) { OK(RunW8A16(*w8d[i % r8], LinearArgs{x, y, M, g_act, true, ws8, ws8_bytes, g_tuning}, g_stream)); };
    Record("w8a16" + act_suffix, K, N, M, true, TimeUs(q8, EstimateUs(q8)), w8_bytes);
    if (!g_w8a8) continue;
    // W8A8: GEMM only (activations already FP8, as torch._scaled_mm is timed).
    OK(RunQuantizeActFp8(x, ActType::kBF16, M, K, true, static_cast<uint8_t*>(xq), static_cast<float*>(xs), g_stream));
    CK(cudaStreamSynchronize(g_stream));
    for (bool inv : {true, false}) {
      W8A8Args a = QuantizedArgs(xq, xs, y, M, true);
      a.batch_invariant = inv;
      auto rw = [&](int i) { OK(RunW8A8(blas, *w8d[i % r8], a, g_stream)); };
      Record("w8a8_rowwise", K, N, M, inv, TimeUs(rw, EstimateUs(rw)), w8_bytes);
      a.per_row_act = false;
      auto tw = [&](int i) { OK(RunW8A8(blas, *w8td[i % r8], a, g_stream)); };
      Record("w8a8_tensorwise", K, N, M, inv, TimeUs(tw, EstimateUs(tw)), w8_bytes);
      if (!inv) continue;
      auto to = [&](int i) { OK(RunW8A8Invariant(*w8td[i % r8], a, g_stream)); };  // ours, the same scales
      Record("w8a8_tensorwise_ours", K, N, M, true, TimeUs(to, EstimateUs(to)), w8_bytes);
      a.per_row_act = true;
      for (const InvariantTile& tile : OursTiles(M)) {
        a.tuning.invariant_tile = tile;
        auto ro = [&](int i) { OK(RunW8A8Invariant(*w8d[i % r8], a, g_stream)); };
        Record("w8a8_rowwise_ours" + TileName(tile), K, N, M, true, TimeUs(ro, EstimateUs(ro)), w8_bytes);
      }
    }
    auto aq = [&](int) { OK(RunQuantizeActFp8(x, ActType::kBF16, M, K, true, static_cast<uint8_t*>(xq), static_cast<float*>(xs), g_stream)); };
    Record("act_quant_fp8_rowwise", K, N, M, true, TimeUs(aq, EstimateUs(aq)), 0);
  }
  for (auto p : wbd) cudaFree(p);
  cudaFree(x);
  cudaFree(y);
  cudaFree(xq);
  cudaFree(xs);
  cudaFree(ws);
  cudaFree(ws8);
}

// --profile [K N]: a few eager launches for ncu (default K=N=8192, group 128): W4A16 M=1, 4, 16, 64, W8A16 M=1.
void ProfileLaunches(int K, int N) {
  const int M = 64;
  auto wf = Random(size_t(N) * K, 5);
  Int4Weights w4 = QuantizeInt4(wf.data(), N, K, 128, false);
  std::unique_ptr<W4A16Weights> d4;
  OK(W4A16Weights::Create(w4, &d4, g_tuning));
  std::unique_ptr<Fp8DeviceWeights> d8;
  OK(Fp8DeviceWeights::Create(QuantizeFp8(wf.data(), N, K, true), &d8, Fp8Paths::kBoth, g_tuning));
  void* x = DeviceBf16(Random(size_t(M) * K, 6));
  void* y;
  CK(cudaMalloc(&y, size_t(M) * N * 2));
  const size_t wsb = W4A16WorkspaceBytes(*d4, M, true), wsb8 = W8A16WorkspaceBytes(*d8, M);  // one per weight
  void* ws = ZeroedWorkspace(wsb);
  void* ws8 = ZeroedWorkspace(wsb8);
  for (int m : {1, 1, 4, 16, 64}) OK(RunW4A16(*d4, LinearArgs{x, y, m, ActType::kBF16, true, ws, wsb, g_tuning}, nullptr, nullptr));
  for (int m : {1, 1}) OK(RunW8A16(*d8, LinearArgs{x, y, m, ActType::kBF16, true, ws8, wsb8, g_tuning}, nullptr));
  CK(cudaDeviceSynchronize());
  std::printf("profile launches done\n");
}

// --profile-w8a8 K N M: two launches of our tensor-wise W8A8 at M rows, for ncu (the peer: torch_peers.py --profile).
void ProfileW8A8(int K, int N, int M) {
  const auto wf = Random(size_t(N) * K, 5);
  std::unique_ptr<Fp8DeviceWeights> d8;
  OK(Fp8DeviceWeights::Create(QuantizeFp8(wf.data(), N, K, false), &d8, Fp8Paths::kW8A8, g_tuning));
  void* x = DeviceBf16(Random(size_t(M) * K, 6));
  void *y, *xq, *xs;
  CK(cudaMalloc(&y, size_t(M) * N * 2));
  CK(cudaMalloc(&xq, size_t(M) * K));
  CK(cudaMalloc(&xs, size_t(M) * 4));
  OK(RunQuantizeActFp8(x, ActType::kBF16, M, K, false, static_cast<uint8_t*>(xq), static_cast<float*>(xs), nullptr));
  for (int i = 0; i < 2; ++i) OK(RunW8A8Invariant(*d8, QuantizedArgs(xq, xs, y, M, false), nullptr));
  CK(cudaDeviceSynchronize());
  std::printf("profile launches done\n");
}

// --first-calls K N: what cuBLASLt's timed choices (fast mode, BF16) cost a server's requests. The first call of each
// M = 1..256 on a fresh BlasLt, once without a warm-up (a bucket's first M times its candidates on the request path)
// and once after one at BlasLtWarmupRows (as the server's load does): wall time of the warm-up, the sum and the
// largest of the 256 first calls, each call waited for as a request's would be.
void FirstCalls(int K, int N) {
  void* w = DeviceBf16(Random(size_t(N) * K, 5));
  void* x = DeviceBf16(Random(size_t(256) * K, 6));
  void* y;
  CK(cudaMalloc(&y, size_t(256) * N * 2));
  auto call = [&](BlasLt* blas, int m) {
    OK(RunBf16(blas, w, N, K, LinearArgs{x, y, m, ActType::kBF16, false, nullptr, 0, g_tuning}, g_stream));
    CK(cudaStreamSynchronize(g_stream));
  };
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  for (bool warm : {false, true}) {
    std::unique_ptr<BlasLt> blas;
    OK(BlasLt::Create(64ull << 20, &blas));
    const auto t0 = Clock::now();
    if (warm)
      for (int m : BlasLtWarmupRows(256)) call(blas.get(), m);
    const auto t1 = Clock::now();
    double worst = 0;
    for (int m = 1; m <= 256; ++m) {
      const auto a = Clock::now();
      call(blas.get(), m);
      worst = std::max(worst, ms(a, Clock::now()));
    }
    std::printf("first calls K=%d N=%d %s: warm-up %.1f ms, M = 1..256 first calls %.1f ms in all, the slowest %.2f ms\n",
                K, N, warm ? "after a warm-up at BlasLtWarmupRows" : "without a warm-up", ms(t0, t1), ms(t1, Clock::now()),
                worst);
  }
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
}

// The non-empty comma-separated items of s ("64,128" -> "64", "128").
std::vector<std::string> CommaItems(const std::string& s) {
  std::vector<std::string> items;
  for (size_t at = 0; at < s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) items.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "gemm_bench.json";
  bool quick = false, bars = false;
  std::string ms_arg, shapes_arg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--no-w8a8") g_w8a8 = false;  // A/B calls on the int4 / fp8-weight kernels only
    if (a == "--tiles") g_tiles = true;
    if (a == "--f16") g_act = ActType::kF16;  // A/B calls: W4A16 and W8A16 timed with fp16 activations
    if (a == "--bars") bars = true;  // all four shapes at M = 1, 4, 16, 32, 64, 128 (the bars of docs/perf/gemm.md and the wgmma tiles)
    if (a == "--ms" && i + 1 < argc) ms_arg = argv[++i];  // comma-separated M values (A/B calls), e.g. --ms 64,128
    if (a == "--shapes" && i + 1 < argc) shapes_arg = argv[++i];  // comma-separated KxN (A/B calls), e.g. 4096x4096
    if (a == "--first-calls" && i + 2 < argc) {
      CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
      FirstCalls(std::atoi(argv[i + 1]), std::atoi(argv[i + 2]));
      return 0;
    }
    if (a == "--profile-w8a8" && i + 3 < argc) {
      ProfileW8A8(std::atoi(argv[i + 1]), std::atoi(argv[i + 2]), std::atoi(argv[i + 3]));
      return 0;
    }
    if (a == "--profile") {
      const bool kn = i + 2 < argc;
      ProfileLaunches(kn ? std::atoi(argv[i + 1]) : 8192, kn ? std::atoi(argv[i + 2]) : 8192);
      return 0;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::unique_ptr<BlasLt> blas;
  // The server's cuBLASLt workspace per stream (server/backends/cuda/device_context.cc); FLASHQ_BENCH_BLASLT_WS_MB for A/B.
  const char* ws_mb = std::getenv("FLASHQ_BENCH_BLASLT_WS_MB");
  OK(BlasLt::Create((ws_mb ? std::strtoull(ws_mb, nullptr, 10) : 64ull) << 20, &blas));
  double copy_memcpy = 0, copy_kernel = 0;
  const double copy = CopyCeilingGBs(&copy_memcpy, &copy_kernel);
  std::printf("device %s, %d SMs, copy ceiling %.0f GB/s (read+write; memcpy %.0f, kernel %.0f)\n", prop.name,
              prop.multiProcessorCount, copy, copy_memcpy, copy_kernel);
  std::vector<std::pair<int, int>> shapes = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 8192}};
  std::vector<int> Ms = {1, 4, 16, 32, 64, 128, 256, 1024, 4096};
  if (quick) {
    shapes = {{4096, 4096}, {8192, 8192}};
    Ms = {1, 16, 32, 64, 128};
  }
  if (bars) Ms = {1, 4, 16, 32, 64, 128};
  if (!ms_arg.empty()) {
    Ms.clear();
    for (const std::string& m : CommaItems(ms_arg)) Ms.push_back(std::atoi(m.c_str()));
  }
  if (!shapes_arg.empty()) {
    shapes.clear();
    for (const std::string& kn : CommaItems(shapes_arg)) {
      int K = 0, N = 0;
      if (std::sscanf(kn.c_str(), "%dx%d", &K, &N) == 2) shapes.emplace_back(K, N);
    }
  }
  for (auto [K, N] : shapes) BenchShape(K, N, Ms, blas.get());
  FILE* f = std::fopen(out.c_str(), "w");
  if (!f) return 1;
  std::fprintf(f, "{\"device\":\"%s\",\"sms\":%d,\"copy_ceiling_gbs\":%.1f,\"copy_memcpy_gbs\":%.1f,\"copy_kernel_gbs\":%.1f,\"checks\":[%s],\"records\":[\n",
               prop.name, prop.multiProcessorCount, copy, copy_memcpy, copy_kernel, g_checks.c_str());
  for (size_t i = 0; i < g_recs.size(); ++i) {
    const Rec& r = g_recs[i];
    std::fprintf(f, "{\"method\":\"%s\",\"K\":%d,\"N\":%d,\"M\":%d,\"batch_invariant\":%s,\"us\":%.3f,\"weight_bytes\":%.0f}%s\n",
                 r.method.c_str(), r.K, r.N, r.M, r.invariant ? "true" : "false", r.us, r.weight_bytes, i + 1 < g_recs.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return 0;
}
