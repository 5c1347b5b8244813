// flashq-bench: the bundled load tester for flashq (any KServe v2 gRPC server, in
// fact). Closed-loop concurrency sweeps and open-loop request-rate sweeps over
// ragged attention, kv_attention sessions and linear layers; windows with
// perf_analyzer's stability rule; percentiles from a log-bucketed histogram; the
// server's queue/compute split from ModelStatistics; a table, JSON, CSV and a PNG.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/heap.h"
#include "client/bench/grpc_transport.h"
#include "client/bench/input_data.h"
#include "client/bench/report.h"
#include "client/bench/runner.h"
#include "client/bench/scenarios.h"
#include "client/bench/shm_region.h"
#include "client/bench/slot_pool.h"
#include "client/bench/spawn.h"
#include "client/lib/client.h"
#include "client/lib/cuda_shared_memory.h"

#ifndef FLASHQ_SOURCE_DIR
#define FLASHQ_SOURCE_DIR "."
#endif

namespace fb = flashq::bench;
namespace fc = flashq::client;

namespace {

std::atomic<bool> g_interrupt{false};

void OnSignal(int) {
  g_interrupt = true;
  signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
  signal(SIGTERM, SIG_DFL);
}

void DefineFlags(flashq::FlagSet& f) {
  std::string presets;
  for (auto& p : fb::Presets()) presets += (presets.empty() ? "" : ",") + p.name;
  const std::string S1 = "Target", S1b = "Security and compression (perf_analyzer's flags)", S2 = "Scenarios",
                    S3 = "Load", S4 = "Request shapes (override the preset's)", S5 = "Measurement", S6 = "Output";
  f.Add({"endpoints", "HOST:PORT,...", "localhost:8001",
         "gRPC endpoints of the server(s). Stateless requests go round-robin; kv_attention sessions go to the endpoint that "
         "owns their sequence_id on a consistent-hash ring.", S1});
  f.Add({"spawn-server", "", "false",
         "Start flashq-server (next to this binary) on free local ports with the demo models, wait until it prints "
         "'flashq-server ready', and stop it with SIGTERM at the end. Overrides --endpoints.", S1});
  f.Add({"server-binary", "PATH", "", "flashq-server to spawn [default: flashq-server next to flashq-bench].", S1});
  f.Add({"server-backend", "auto|cpu|cuda", "auto", "--backend passed to the spawned server.", S1});
  f.Add({"server-arg", "ARG", "", "Extra argument for the spawned server, e.g. --server-arg=--max-queue-delay-us=500.", S1, true});
  f.Add({"server-log", "PATH", "", "Where the spawned server's output goes [default: <output-dir>/<name>-server.log].", S1});
  f.Add({"server-timeout", "SECONDS", "300", "How long to wait for the spawned server to become ready.", S1});
  f.Add({"channels", "auto|N", "auto",
         "gRPC channels (HTTP/2 connections) per endpoint. auto: one per 6 requests outstanding at the largest "
         "closed-loop load point (1 for open loop), the sharing perf_analyzer uses; one connection carries only a few "
         "thousand requests a second.", S1});
  f.Add({"request-timeout", "SECONDS", "60", "Deadline of each request (0: none). Expired requests count as DEADLINE_EXCEEDED.", S1});
  f.Add({"shared-memory", "none|system|cuda", "none",
         "Where tensors travel (perf_analyzer's flag): in the gRPC message, or in regions registered with Triton's "
         "shared-memory extension, one per client slot, made once: POSIX shared memory (system) or GPU memory passed as "
         "CUDA IPC handles (cuda; needs libcudart and a GPU on this host). As with perf_analyzer, a slot is filled with "
         "random inputs once and requests use them in place; outputs stay in the region. Same host as the server only.", S1});

  f.Add({"ssl-grpc-use-ssl", "", "false",
         "Connect over TLS. The server's certificate is checked against --ssl-grpc-root-certifications-file (else "
         "gRPC's default roots) and must name the endpoint's host (e.g. IP:127.0.0.1 or DNS:localhost).", S1b});
  f.Add({"ssl-grpc-root-certifications-file", "PATH", "", "PEM CA bundle that the server's certificate must chain to.", S1b});
  f.Add({"ssl-grpc-private-key-file", "PATH", "",
         "PEM private key of the client certificate, for a server that requires mutual TLS (flashq-server --tls-ca).", S1b});
  f.Add({"ssl-grpc-certificate-chain-file", "PATH", "", "PEM client certificate chain for --ssl-grpc-private-key-file.", S1b});
  f.Add({"header", "'NAME: VALUE'", "",
         "gRPC metadata sent with every call; -H is short for it. A bearer token: -H 'authorization: Bearer <token>' "
         "(flashq-server --auth-token). Reports name the headers but never show their values.", S1b, true});
  f.Short('H', "header");  // perf_analyzer's and curl's spelling
  f.Add({"grpc-compression-algorithm", "none|gzip|deflate", "none",
         "Compress every request (the server answers uncompressed). Costs client and server CPU; helps only on slow links.",
         S1b});

  f.Add({"scenarios", "LIST", "attention_ragged,linear_int4,kv_decode",
         "Comma-separated preset scenarios, run in order. Known: " + presets + ". Ignored when --model is given.", S2});
  f.Add({"list-scenarios", "", "false", "Print the presets with their shapes and exit.", S2});
  f.Add({"model", "NAME", "", "Benchmark one model instead of presets: attention, kv_attention, or a linear layer "
                              "(up_proj_int4, down_proj_bf16, ...).", S2});
  f.Add({"workload", "attention|kv|linear", "", "Request generator for --model [default: from the model name; any "
                                                "other name is a linear layer].", S2});
  f.Add({"input-data", "PATH", "",
         "Send the tensors of a JSON file in perf_analyzer's --input-data format instead of generated ones: "
         "{\"data\": [{\"X\": {\"content\": [...] or {\"b64\": \"...\"}, \"shape\": [...]}}, ...]}, one request per "
         "entry, cycled in order; values are encoded as the model's input datatypes (ModelMetadata). Needs --model "
         "(attention or a linear layer, or any model: throughput then counts requests); replaces the request shape "
         "flags, of which only --causal still applies (attention). Not with --shared-memory or kv_attention.", S2});

  f.Add({"concurrency", "LIST", "1,4,16", "Closed loop: requests kept outstanding, one load point each. Without "
                                          "this flag the linear presets sweep 1,2,4.", S3});
  f.Add({"request-rate", "LIST", "", "Open loop instead: requests/s, one load point each. Latency counts from each "
                                     "request's intended send time (no coordinated omission). kv_attention: new "
                                     "sessions/s; a session's later steps follow as soon as the previous completes.", S3});
  f.Add({"arrival", "constant|poisson", "poisson", "Open-loop inter-arrival times.", S3});
  f.Add({"max-outstanding", "N", "4096", "Open loop: the sender waits when this many requests are outstanding (the wait "
                                          "counts in the latency).", S3});
  f.Add({"seed", "N", "1", "Seed of the shape and arrival generators.", S3});

  f.Add({"dtype", "fp16|bf16|fp32", "fp16", "Element type of Q/K/V and X.", S4});
  f.Add({"seq-len", "DIST", "", "attention: query length of each sequence. DIST is fixed:N, uniform:A:B, "
                                "lognormal:MEDIAN:SIGMA[:MIN:MAX] or file:PATH (integers, one per line or "
                                "whitespace-separated; sampled uniformly).", S4});
  f.Add({"seqs-per-request", "DIST", "", "attention: sequences packed into one request (ragged, via CU_SEQLENS_Q/K).", S4});
  f.Add({"kv-extra", "DIST", "", "attention: K/V length minus query length per sequence (0: self-attention prefill).", S4});
  f.Add({"heads-q", "N", "", "attention, kv_attention: query heads Hq.", S4});
  f.Add({"heads-kv", "N", "", "attention, kv_attention: K/V heads Hkv (GQA when Hq is a multiple).", S4});
  f.Add({"head-dim", "N", "", "attention, kv_attention: head dimension D.", S4});
  f.Add({"causal", "", "true", "attention: the causal request parameter.", S4});
  f.Add({"cu-seqlens", "", "true", "attention: send CU_SEQLENS_Q/K. Off: one sequence per request, Q/K/V only.", S4});
  f.Add({"prefill-len", "DIST", "", "kv_attention: prompt tokens of a session's first (sequence_start) request.", S4});
  f.Add({"decode-steps", "DIST", "", "kv_attention: one-token decode requests after the prefill; the last carries "
                                     "sequence_end.", S4});
  f.Add({"m", "DIST", "", "linear: rows M of X per request.", S4});
  f.Add({"linear-k", "N", "", "linear: input features K [default: from ModelMetadata, else 4096 for up_*, 14336 for "
                              "down_*].", S4});

  f.Add({"window", "SECONDS", "1.5", "Measurement window. A window also lasts until it holds --min-requests "
                                     "(at most 4 windows' time).", S5});
  f.Add({"stability", "PCT", "10", "Stable when each of the last --stable-windows windows' throughput and mean "
                                   "latency are within PCT% of their average (perf_analyzer's rule).", S5});
  f.Add({"stability-latency", "mean|pNN", "mean", "Latency statistic the stability rule compares: the mean (as "
                                                  "perf_analyzer by default) or a percentile such as p50 (as "
                                                  "perf_analyzer --percentile=50).", S5});
  f.Add({"stable-windows", "N", "3", "Windows the stability rule looks at; the result merges them.", S5});
  f.Add({"max-time", "SECONDS", "6", "Time cap per load point (after warm-up). Unstable points are reported as such.", S5});
  f.Add({"warmup", "SECONDS", "0.5", "Load before measuring, per load point; discarded.", S5});
  f.Add({"min-requests", "N", "5", "Requests a window needs before it can close.", S5});

  f.Add({"output-dir", "DIR", "", "Directory for the JSON, CSV, PNG and server log [default: <build dir>/flashq-bench-results "
                                  "when flashq-bench runs from a build tree, else ./flashq-bench-results].", S6});
  f.Add({"name", "PREFIX", "", "File name prefix [default: flashq-bench-<UTC date>-<time>].", S6});
  f.Add({"json", "PATH", "", "JSON results path [default: <output-dir>/<name>.json].", S6});
  f.Add({"csv", "PATH", "", "CSV results path, one row per load point [default: <output-dir>/<name>.csv].", S6});
  f.Add({"plot", "PATH", "", "PNG latency-throughput plot path [default: <output-dir>/<name>.png].", S6});
  f.Add({"no-plot", "", "false", "Do not draw the plot.", S6});
  f.Add({"python", "PATH", "", "Python with matplotlib for the plot [default: the repository's .venv/bin/python, "
                               "else python3].", S6});
  f.Add({"progress", "auto|on|off", "auto", "Progress bar on stderr; auto: only when stderr is a terminal.", S6});
  f.Add({"help", "", "false", "Print this help and exit.", S6});
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipWhitespace())) out.emplace_back(absl::StripAsciiWhitespace(p));
  return out;
}

template <typename T>
bool ParseNum(const std::string& s, T* v) {
  if constexpr (std::is_same_v<T, double>) return absl::SimpleAtod(s, v);
  else return absl::SimpleAtoi(s, v);
}

std::string UtcNow(const char* fmt) {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), fmt, &tm);
  return buf;
}

std::string RunCapture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

bool Exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

std::string ShellQuote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

void MakeDirs(const std::string& dir) {
  std::string cur;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    cur += std::string(part) + "/";
    if (!part.empty()) mkdir(cur.c_str(), 0755);
  }
}

// Draws the plot with client/bench/plot.py; returns a line for the user.
std::string Plot(const flashq::FlagSet& f, const std::string& json, const std::string& png) {
  const std::string exe_dir = fb::ExecutableDir();
  std::string script;
  for (const std::string& c : {exe_dir + "/flashq_bench_plot.py", std::string(FLASHQ_SOURCE_DIR) + "/client/bench/plot.py"})
    if (Exists(c)) {
      script = c;
      break;
    }
  if (script.empty()) return "plot: skipped, plot.py not found next to flashq-bench or in the source tree";
  std::vector<std::string> pythons;
  if (f.WasSet("python")) pythons.push_back(f.Get("python"));
  else
    pythons = {exe_dir + "/../../.venv/bin/python", std::string(FLASHQ_SOURCE_DIR) + "/.venv/bin/python", "python3"};
  std::string python;
  for (const auto& p : pythons) {
    if (p != "python3" && !Exists(p)) continue;
    if (system((ShellQuote(p) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) {
      python = p;
      break;
    }
  }
  if (python.empty())
    return "plot: skipped, no Python with matplotlib (run scripts/setup.sh, or pass --python=PATH)";
  const std::string cmd = absl::StrCat(ShellQuote(python), " ", ShellQuote(script), " ", ShellQuote(json), " ", ShellQuote(png),
                                       " 2>&1");
  std::string out = RunCapture(cmd + "; echo \"rc=$?\"");
  if (out.size() >= 4 && out.substr(out.rfind("rc=")) == "rc=0") return "plot: " + png;
  return "plot: failed: " + out;
}

class ProgressPrinter {
 public:
  ProgressPrinter(bool enabled) : enabled_(enabled) {}
  void Update(const std::string& scenario, const fb::LoadPoint& lp, const fb::ProgressInfo& p) {
    if (!enabled_) return;
    const int width = 24;
    const double frac = p.max_s > 0 ? std::min(1.0, p.elapsed_s / p.max_s) : 0;
    const int filled = int(frac * width);
    std::string bar = std::string(filled, '#') + std::string(width - filled, '-');
    std::string line = absl::StrFormat("\r  %-16s %-14s [%s] %s %4.1f/%.0fs  win %d  %s req/s  p50 %s ms  in-flight %d",
                                       scenario, lp.Label(), bar, p.warmup ? "warm-up" : "measure", p.elapsed_s, p.max_s,
                                       p.windows, p.last_rps > 0 ? absl::StrFormat("%.1f", p.last_rps) : "-",
                                       p.last_p50_ms > 0 ? absl::StrFormat("%.2f", p.last_p50_ms) : "-", p.in_flight);
    if (p.errors) line += absl::StrFormat("  errors %d", p.errors);
    line += "\033[K";
    fputs(line.c_str(), stderr);
    fflush(stderr);
  }
  void Clear() {
    if (enabled_) fputs("\r\033[K", stderr);
  }

 private:
  bool enabled_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as flashq-server does (server/main.cc)
  flashq::ConfigureHeapForTensors();  // our own first-touch costs stay out of the measured latencies
  const std::string usage =
      "flashq-bench: load tester for flashq-server (KServe v2 gRPC)\n\n"
      "usage: flashq-bench [flags]\n"
      "  flashq-bench --spawn-server                  # the demo: start a server, run the default scenarios\n"
      "  flashq-bench --endpoints=host:8001 --model=attention --seq-len=lognormal:512:0.8 --concurrency=1,8,32\n"
      "  flashq-bench --scenarios=kv_decode --request-rate=2,5,10 --arrival=poisson   # new sessions/s\n\n"
      "Each scenario runs one load point per --concurrency (closed loop) or --request-rate (open loop) value.\n"
      "A point warms up, then measures windows until the last --stable-windows agree within --stability% or\n"
      "--max-time passes. Reported: req/s, tokens (or rows)/s, latency p50/p90/p95/p99/p99.9 of successful\n"
      "requests, errors by gRPC code, and the server's mean queue and compute time (ModelStatistics deltas).\n"
      "Exit status: 0 on success, 1 if a scenario failed or a load point had no successful request, 2 on bad flags.\n"
      "Environment: FLASHQ_COMMIT overrides the commit recorded in the JSON (default: git of the source tree).\n";
  flashq::FlagSet f(usage, flashq::FlagSet::HelpLayout::kSections);
  DefineFlags(f);
  bool help = false;
  if (std::string error; !f.Parse(argc, argv, &help, &error)) {
    fprintf(stderr, "flashq-bench: %s\n", error.c_str());
    return 2;
  }
  if (help || f.GetBool("help")) {
    fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (f.GetBool("list-scenarios")) {
    for (auto& p : fb::Presets()) printf("%-18s %s\n", p.name.c_str(), p.help.c_str());
    return 0;
  }
  auto bad = [](const std::string& msg) {
    fprintf(stderr, "flashq-bench: %s\n", msg.c_str());
    return 2;
  };

  // ---- measurement and load flags
  fb::MeasureOptions mo;
  int64_t seed = 1, channels = 0, max_out = 4096;  // channels 0: auto, set once the load points are known
  double request_timeout = 60, server_timeout = 300;
  if (!ParseNum(f.Get("window"), &mo.window_s) || mo.window_s <= 0) return bad("--window: need seconds > 0");
  if (!ParseNum(f.Get("stability"), &mo.stability_pct) || mo.stability_pct <= 0) return bad("--stability: need a percentage > 0");
  if (!ParseNum(f.Get("stable-windows"), &mo.stable_windows) || mo.stable_windows < 1) return bad("--stable-windows: need N >= 1");
  if (!ParseNum(f.Get("max-time"), &mo.max_time_s) || mo.max_time_s <= 0) return bad("--max-time: need seconds > 0");
  if (!ParseNum(f.Get("warmup"), &mo.warmup_s) || mo.warmup_s < 0) return bad("--warmup: need seconds >= 0");
  if (!ParseNum(f.Get("min-requests"), &mo.min_requests_per_window) || mo.min_requests_per_window < 0) return bad("--min-requests: need N >= 0");
  if (!ParseNum(f.Get("seed"), &seed)) return bad("--seed: need an integer");
  if (f.Get("channels") != "auto" && (!ParseNum(f.Get("channels"), &channels) || channels < 1))
    return bad("--channels: auto or N >= 1");
  if (!ParseNum(f.Get("max-outstanding"), &max_out) || max_out < 1) return bad("--max-outstanding: need N >= 1");
  if (!ParseNum(f.Get("request-timeout"), &request_timeout) || request_timeout < 0) return bad("--request-timeout: need seconds >= 0");
  if (!ParseNum(f.Get("server-timeout"), &server_timeout) || server_timeout <= 0) return bad("--server-timeout: need seconds > 0");
  mo.seed = uint64_t(seed);
  if (const std::string sl = f.Get("stability-latency"); sl != "mean") {
    if (sl.size() < 2 || sl[0] != 'p' || !ParseNum(sl.substr(1), &mo.stability_percentile) ||
        mo.stability_percentile <= 0 || mo.stability_percentile > 100)
      return bad("--stability-latency: mean or pNN (e.g. p50, p99.9)");
  }
  mo.max_outstanding = int(max_out);
  auto shm_kind = fb::ParseSharedMemoryKind(f.Get("shared-memory"));
  if (!shm_kind.ok()) return bad(std::string(shm_kind.status().message()));
  std::shared_ptr<fc::CudaRuntime> cuda;
  if (*shm_kind == fb::SharedMemoryKind::kCuda) {  // before any server starts
    auto rt = fc::CudaRuntime::Load(0);
    if (!rt.ok()) return bad(absl::StrCat("--shared-memory=cuda: ", rt.status().message()));
    cuda = std::move(*rt);
  }

  // ---- security and compression (checked, and the files read, before any server starts)
  fc::ClientOptions co;
  {
    const bool tls = f.GetBool("ssl-grpc-use-ssl");
    for (const char* flag :
         {"ssl-grpc-root-certifications-file", "ssl-grpc-private-key-file", "ssl-grpc-certificate-chain-file"})
      if (f.WasSet(flag) && !tls) return bad(absl::StrCat("--", flag, " needs --ssl-grpc-use-ssl"));
    if (f.WasSet("ssl-grpc-private-key-file") != f.WasSet("ssl-grpc-certificate-chain-file"))
      return bad("--ssl-grpc-private-key-file and --ssl-grpc-certificate-chain-file must be given together");
    co.tls.enabled = tls;
    struct PemFlag {
      const char* flag;
      std::string* field;
      fc::PemKind kind;
    };
    for (auto [flag, field, kind] :
         {PemFlag{"ssl-grpc-root-certifications-file", &co.tls.root_certs_pem, fc::PemKind::kCertificates},
          PemFlag{"ssl-grpc-private-key-file", &co.tls.private_key_pem, fc::PemKind::kPrivateKey},
          PemFlag{"ssl-grpc-certificate-chain-file", &co.tls.cert_chain_pem, fc::PemKind::kCertificates}}) {
      if (!f.WasSet(flag)) continue;
      auto pem = fc::ReadPemFile(f.Get(flag), absl::StrCat("--", flag), kind);
      if (!pem.ok()) return bad(std::string(pem.status().message()));
      *field = std::move(*pem);
    }
    for (const auto& h : f.GetAll("header")) {
      auto parsed = fc::ParseHeader(h);
      if (!parsed.ok()) return bad(absl::StrCat("--header: ", parsed.status().message()));
      co.headers.push_back(std::move(*parsed));
    }
    auto comp = fc::ParseCompression(f.Get("grpc-compression-algorithm"));
    if (!comp.ok()) return bad(absl::StrCat("--grpc-compression-algorithm: ", comp.status().message()));
    co.compression = *comp;
  }

  // ---- --input-data: the file's structure is checked now; its datatypes once the server answers
  std::optional<fb::InputData> input_data;
  if (f.WasSet("input-data")) {
    if (!f.WasSet("model")) return bad("--input-data needs --model (the model the file's tensors are for)");
    if (*shm_kind != fb::SharedMemoryKind::kNone) return bad("--input-data cannot be combined with --shared-memory");
    for (const char* flag : {"dtype", "seq-len", "seqs-per-request", "kv-extra", "heads-q", "heads-kv", "head-dim",
                             "cu-seqlens", "prefill-len", "decode-steps", "m", "linear-k"})
      if (f.WasSet(flag)) return bad(absl::StrCat("--", flag, " shapes generated requests; --input-data gives the tensors"));
    auto d = fb::LoadInputData(f.Get("input-data"));
    if (!d.ok()) return bad(std::string(d.status().message()));
    input_data = std::move(*d);
  }

  fb::Arrival arrival = fb::Arrival::kPoisson;
  if (f.Get("arrival") == "constant") arrival = fb::Arrival::kConstant;
  else if (f.Get("arrival") != "poisson") return bad("--arrival: constant or poisson");
  // The load points of a scenario: --request-rate, else --concurrency, else the preset's sweep.
  auto make_points = [&](const std::string& preset_concurrency,
                         std::vector<fb::LoadPoint>* points) -> absl::Status {
    points->clear();
    if (f.WasSet("request-rate")) {
      for (const auto& r : SplitList(f.Get("request-rate"))) {
        fb::LoadPoint lp;
        lp.mode = fb::LoadPoint::Mode::kOpen;
        lp.arrival = arrival;
        if (!ParseNum(r, &lp.rate) || lp.rate <= 0)
          return absl::InvalidArgumentError("--request-rate: '" + r + "' is not a rate > 0");
        points->push_back(lp);
      }
    } else {
      const std::string list =
          f.WasSet("concurrency") || preset_concurrency.empty() ? f.Get("concurrency") : preset_concurrency;
      for (const auto& c : SplitList(list)) {
        fb::LoadPoint lp;
        if (!ParseNum(c, &lp.concurrency) || lp.concurrency < 1)
          return absl::InvalidArgumentError("--concurrency: '" + c + "' is not an integer >= 1");
        points->push_back(lp);
      }
    }
    if (points->empty()) return absl::InvalidArgumentError("no load points (--concurrency or --request-rate)");
    return absl::OkStatus();
  };

  // ---- scenarios
  std::vector<fb::ScenarioSpec> specs;
  if (f.WasSet("model")) {
    fb::ScenarioSpec s;
    s.model = f.Get("model");
    s.name = s.model;
    s.kind = fb::KindForModel(s.model);
    if (f.WasSet("workload")) {
      auto k = fb::ParseKind(f.Get("workload"));
      if (!k.ok()) return bad(std::string(k.status().message()));
      s.kind = *k;
    }
    if (input_data && s.kind == fb::ScenarioSpec::Kind::kKv)
      return bad("--input-data does not drive kv_attention sessions (its requests need sequence parameters)");
    if (s.kind == fb::ScenarioSpec::Kind::kKv) s.heads_q = 32, s.heads_kv = 8, s.head_dim = 128;
    if (s.kind == fb::ScenarioSpec::Kind::kLinear) s.m = "fixed:8";
    specs.push_back(s);
  } else {
    for (const auto& n : SplitList(f.Get("scenarios"))) {
      auto s = fb::Preset(n);
      if (!s.ok()) return bad(std::string(s.status().message()));
      specs.push_back(*s);
    }
  }
  if (specs.empty()) return bad("no scenarios");
  int64_t max_concurrency = 1;
  for (auto& s : specs) {  // flags override the preset
    if (f.WasSet("dtype")) s.dtype = f.Get("dtype");
    if (f.WasSet("seq-len")) s.seq_len = f.Get("seq-len");
    if (f.WasSet("seqs-per-request")) s.seqs_per_request = f.Get("seqs-per-request");
    if (f.WasSet("kv-extra")) s.kv_extra = f.Get("kv-extra");
    if (f.WasSet("prefill-len")) s.prefill_len = f.Get("prefill-len");
    if (f.WasSet("decode-steps")) s.decode_steps = f.Get("decode-steps");
    if (f.WasSet("m")) s.m = f.Get("m");
    if (f.WasSet("causal")) s.causal = f.GetBool("causal");
    if (f.WasSet("cu-seqlens")) s.cu_seqlens = f.GetBool("cu-seqlens");
    for (auto [flag, field] : {std::pair{"heads-q", &s.heads_q}, {"heads-kv", &s.heads_kv}, {"head-dim", &s.head_dim}})
      if (f.WasSet(flag) && !ParseNum(f.Get(flag), field)) return bad(absl::StrCat("--", flag, ": need an integer"));
    if (f.WasSet("linear-k") && !ParseNum(f.Get("linear-k"), &s.k)) return bad("--linear-k: need an integer");
    // Check the shapes and loads now, before any server starts.
    auto w = fb::BuildWorkload(s, 1);
    if (!w.ok()) return bad(absl::StrCat(s.name, ": ", w.status().message()));
    std::vector<fb::LoadPoint> pts;
    if (absl::Status ps = make_points(s.concurrency, &pts); !ps.ok()) return bad(std::string(ps.message()));
    for (const fb::LoadPoint& p : pts) max_concurrency = std::max<int64_t>(max_concurrency, p.concurrency);
  }
  // perf_analyzer's gRPC clients share a channel among at most 6 of them.
  constexpr int64_t kRequestsPerChannel = 6;
  if (channels == 0) channels = (max_concurrency + kRequestsPerChannel - 1) / kRequestsPerChannel;

  // ---- output paths
  std::string out_dir = f.Get("output-dir");
  if (out_dir.empty()) {
    const std::string build = fb::ExecutableDir() + "/..";  // build/bin/.. = the build tree (ignored by git)
    out_dir = Exists(build + "/CMakeCache.txt") ? build + "/flashq-bench-results" : "flashq-bench-results";
    char buf[PATH_MAX];
    if (out_dir[0] == '/' && realpath(build.c_str(), buf)) out_dir = std::string(buf) + "/flashq-bench-results";
  }
  const std::string name = f.WasSet("name") ? f.Get("name") : "flashq-bench-" + UtcNow("%Y%m%d-%H%M%S");
  const std::string json_path = f.WasSet("json") ? f.Get("json") : out_dir + "/" + name + ".json";
  const std::string csv_path = f.WasSet("csv") ? f.Get("csv") : out_dir + "/" + name + ".csv";
  const std::string png_path = f.WasSet("plot") ? f.Get("plot") : out_dir + "/" + name + ".png";
  MakeDirs(out_dir);

  const std::string prog = f.Get("progress");
  ProgressPrinter progress(prog == "on" || (prog == "auto" && isatty(STDERR_FILENO)));

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // ---- the server
  fb::RunInfo info;
  info.date = UtcNow("%Y-%m-%dT%H:%M:%SZ");
  // FLASHQ_COMMIT names the commit where there is no checkout (a bundle, a container).
  info.commit = getenv("FLASHQ_COMMIT") ? getenv("FLASHQ_COMMIT")
                                        : RunCapture(absl::StrCat("git -C ", ShellQuote(FLASHQ_SOURCE_DIR),
                                                                  " rev-parse --short HEAD 2>/dev/null"));
  info.host = RunCapture("hostname 2>/dev/null");
  {
    // Header values (bearer tokens) stay out of the report.
    std::vector<std::string> args(argv, argv + argc);
    for (size_t i = 1; i < args.size(); ++i) {
      std::string& a = args[i];
      if ((a == "-H" || a == "--header") && i + 1 < args.size()) {
        std::string& v = args[++i];
        v = v.substr(0, v.find(':')) + ": <redacted>";
      } else if (a.rfind("-H", 0) == 0 || a.rfind("--header=", 0) == 0) {
        a = a.substr(0, a.find(':')) + ": <redacted>";
      }
    }
    info.command_line = absl::StrJoin(args, " ");
  }
  info.measure = mo;
  info.shared_memory = fb::SharedMemoryKindName(*shm_kind);
  info.security = !co.tls.enabled ? "plaintext" : co.tls.cert_chain_pem.empty() ? "tls" : "mutual tls";
  info.compression = fc::CompressionName(co.compression);
  for (const auto& h : co.headers) info.header_names.push_back(h.first);
  std::unique_ptr<fb::ServerProcess> server;
  std::vector<std::string> endpoints = SplitList(f.Get("endpoints"));
  std::string server_log;
  if (f.GetBool("spawn-server")) {
    fb::SpawnOptions so;
    so.binary = f.Get("server-binary");
    so.backend = f.Get("server-backend");
    so.extra_args = f.GetAll("server-arg");
    so.log_path = f.WasSet("server-log") ? f.Get("server-log") : out_dir + "/" + name + "-server.log";
    so.timeout_s = server_timeout;
    so.interrupt = &g_interrupt;
    server_log = so.log_path;
    fprintf(stderr, "flashq-bench: starting flashq-server (backend %s; log %s) ...\n", so.backend.c_str(), so.log_path.c_str());
    auto sp = fb::ServerProcess::Start(so);
    if (!sp.ok()) {
      fprintf(stderr, "flashq-bench: %s\n", std::string(sp.status().message()).c_str());
      return 1;
    }
    server = std::move(*sp);
    endpoints = {server->endpoint()};
    info.spawned_server = true;
    info.server_backend = so.backend;
    fprintf(stderr, "flashq-bench: flashq-server ready on %s (metrics :%d) after %.1f s\n", server->endpoint().c_str(),
            server->metrics_port(), server->startup_s());
  }
  info.endpoints = endpoints;

  co.endpoints = endpoints;
  co.channels_per_endpoint = int(channels);
  info.channels = int(channels);
  auto client_or = fc::Client::Create(co);
  if (!client_or.ok()) {
    fprintf(stderr, "flashq-bench: %s\n", std::string(client_or.status().message()).c_str());
    return 2;
  }
  auto& client = **client_or;
  if (absl::Status s = client.WaitUntilReady(absl::Seconds(server ? 30 : 10)); !s.ok()) {
    fprintf(stderr, "flashq-bench: %s\n", std::string(s.message()).c_str());
    // A server that closes the connection in the handshake says nothing more; name the usual causes.
    const std::string m(s.message());
    if (absl::StrContains(m, "Socket closed") || absl::StrContains(m, "andshake")) {
      fprintf(stderr, "flashq-bench: the connection was closed or its TLS handshake failed: %s\n",
              !co.tls.enabled ? "if the server serves TLS, add --ssl-grpc-use-ssl"
              : co.tls.cert_chain_pem.empty()
                  ? "check --ssl-grpc-root-certifications-file against the server's CA; a server that requires "
                    "mutual TLS also needs --ssl-grpc-private-key-file and --ssl-grpc-certificate-chain-file"
                  : "check --ssl-grpc-root-certifications-file against the server's CA, and that the server "
                    "trusts the CA of --ssl-grpc-certificate-chain-file");
    }
    if (server) fprintf(stderr, "flashq-bench: spawned server: %s; see %s\n", server->Stop().c_str(), server_log.c_str());
    return 1;
  }

  std::unique_ptr<fb::RegionFactory> regions;
  if (*shm_kind != fb::SharedMemoryKind::kNone) {
    auto rf = fb::MakeGrpcRegionFactory(client, *shm_kind, cuda);
    if (!rf.ok()) {
      fprintf(stderr, "flashq-bench: --shared-memory=%s: %s\n", info.shared_memory.c_str(),
              std::string(rf.status().message()).c_str());
      if (server) server->Stop();
      return 1;
    }
    regions = std::move(*rf);
  }

  // ---- run
  std::vector<fb::ScenarioResult> results;
  bool failed = false;
  for (auto& spec : specs) {
    if (g_interrupt) break;
    fb::ScenarioResult sr;
    sr.name = spec.name;
    sr.model = spec.model;
    bool ready = false;
    grpc::Status rs = client.ModelReady(0, spec.model, &ready);
    if (!ready) {
      sr.error = rs.ok() ? "model not ready" : absl::StrCat("ModelReady: ", rs.error_message());
    }
    if (sr.error.empty() && spec.kind == fb::ScenarioSpec::Kind::kLinear && spec.k == 0) {
      inference::ModelMetadataResponse md;
      if (client.ModelMetadata(0, spec.model, &md).ok())
        for (const auto& in : md.inputs())
          if (in.name() == "X" && in.shape_size() == 2 && in.shape(1) > 0) spec.k = in.shape(1);
    }
    if (sr.error.empty() && spec.kind == fb::ScenarioSpec::Kind::kLinear && spec.n == 0) {
      inference::ModelMetadataResponse md;
      if (client.ModelMetadata(0, spec.model, &md).ok())
        for (const auto& out : md.outputs())
          if (out.name() == "Y" && out.shape_size() == 2 && out.shape(1) > 0) spec.n = out.shape(1);
      if (spec.n == 0 && regions) sr.error = "--shared-memory: ModelMetadata gives no size N of output Y";
    }
    spec.resident_inputs = regions != nullptr;
    absl::StatusOr<std::unique_ptr<fb::Workload>> wl = absl::UnknownError("no workload");
    if (input_data && sr.error.empty()) {
      // The file's values are encoded as the datatypes the server declares.
      inference::ModelMetadataResponse md;
      if (grpc::Status ms = client.ModelMetadata(0, spec.model, &md); !ms.ok()) {
        sr.error = absl::StrCat("ModelMetadata: ", fb::GrpcCodeName(int(ms.error_code())), ": ", ms.error_message());
      } else {
        fb::InputDataWorkloadOptions io;
        io.model = spec.model;
        if (spec.kind == fb::ScenarioSpec::Kind::kAttention) {
          io.unit_input = "Q", io.unit_name = "tokens";
          io.causal = spec.causal;
        }
        if (spec.kind == fb::ScenarioSpec::Kind::kLinear) io.unit_input = "X", io.unit_name = "rows";
        wl = fb::MakeInputDataWorkload(*input_data, md, io);
      }
    } else {
      wl = fb::BuildWorkload(spec, uint64_t(seed));
    }
    if (sr.error.empty() && !wl.ok()) sr.error = std::string(wl.status().message());
    std::vector<fb::LoadPoint> points;
    (void)make_points(spec.concurrency, &points);  // checked above
    for (auto& lp : points) lp.rate_is_sessions = spec.kind == fb::ScenarioSpec::Kind::kKv;
    // The scenario's shared-memory slots; destroyed (unregistered) at the end of the iteration.
    std::unique_ptr<fb::SlotPool> slots;
    if (sr.error.empty() && regions) {
      const fb::SlotPlan plan = fb::PlanSlots((*wl)->max_request_bytes(), points, mo.max_outstanding);
      auto sp = fb::SlotPool::Create(*regions, plan.initial, plan.max, plan.slot_bytes, (*wl)->random_bytes());
      if (sp.ok()) slots = std::move(*sp);
      else sr.error = absl::StrCat("--shared-memory=", info.shared_memory, ": ", sp.status().message());
    }
    fb::GrpcTransport transport(client, request_timeout, slots.get());
    if (sr.error.empty()) {
      fb::Workload& w = **wl;
      sr.description = w.Describe();
      sr.unit = w.unit_name();
      sr.tags = w.tags();
      // One synchronous probe first: a bad shape fails here with the server's message.
      fb::Work probe = w.Next();
      grpc::Status ps = transport.Call(probe);
      (void)w.Complete(probe, ps.ok(), false);  // a kv probe session is ended by the first point's drain
      if (!ps.ok()) sr.error = absl::StrCat("probe request failed: ", fb::GrpcCodeName(int(ps.error_code())), ": ", ps.error_message());
    }
    if (!sr.error.empty()) {
      fprintf(stderr, "flashq-bench: scenario %s: %s\n", sr.name.c_str(), sr.error.c_str());
      failed = true;
      results.push_back(std::move(sr));
      continue;
    }
    fb::Workload& w = **wl;
    fprintf(stderr, "scenario %s: %s\n", sr.name.c_str(), sr.description.c_str());
    fb::GrpcServerStats stats(client, spec.model);
    for (const auto& lp : points) {
      if (g_interrupt) break;
      fb::PointResult pr = fb::RunPoint(w, transport, lp, mo, &stats, &g_interrupt,
                                        [&](const fb::ProgressInfo& p) { progress.Update(sr.name, lp, p); });
      progress.Clear();
      const auto& m = pr.m;
      std::string line = absl::StrFormat("  %-14s %8.1f req/s  p50 %7.2f ms  p99 %7.2f ms", lp.Label(), m.rps(),
                                         m.latency.Percentile(50) / 1e6, m.latency.Percentile(99) / 1e6);
      for (size_t t = 0; t < sr.tags.size() && t < m.by_tag.size(); ++t)
        if (m.by_tag[t].count())
          line += absl::StrFormat("  %s p50 %.2f p99 %.2f", sr.tags[t], m.by_tag[t].Percentile(50) / 1e6,
                                  m.by_tag[t].Percentile(99) / 1e6);
      if (m.error_count()) line += absl::StrFormat("  errors %d", m.error_count());
      line += pr.interrupted ? "  (interrupted)" : pr.stable ? "  stable" : absl::StrFormat("  not stable after %.0f s", pr.elapsed_s);
      fprintf(stderr, "%s\n", line.c_str());
      if (m.ok == 0 && !pr.interrupted) failed = true;
      sr.points.push_back(std::move(pr));
    }
    sr.sessions_completed = w.sessions_completed();
    if (slots) {
      sr.shared_memory_slots = slots->slots();
      if (std::string n = slots->note(); !n.empty()) sr.notes.push_back(n);
    }
    if (std::string e = transport.TakeFirstClientError(); !e.empty())
      sr.notes.push_back("first client-side error: " + e);
    for (const auto& n : sr.notes) fprintf(stderr, "  note: %s\n", n.c_str());
    results.push_back(std::move(sr));
  }
  if (g_interrupt) fprintf(stderr, "flashq-bench: interrupted; writing what was measured\n");

  // ---- report
  std::string stop_note;
  if (server) stop_note = server->Stop();
  printf("\n%s", fb::FormatTable(results).c_str());
  printf("  latency in ms from send (closed loop) or intended send (open loop) to response; units/s are %s\n",
         "tokens (attention, kv_attention) or rows M (linear)");
  if (absl::Status s = fb::WriteFile(json_path, fb::ToJson(info, results)); !s.ok())
    fprintf(stderr, "flashq-bench: %s\n", std::string(s.message()).c_str());
  else
    printf("json: %s\n", json_path.c_str());
  if (absl::Status s = fb::WriteFile(csv_path, fb::ToCsv(results)); !s.ok())
    fprintf(stderr, "flashq-bench: %s\n", std::string(s.message()).c_str());
  else
    printf("csv:  %s\n", csv_path.c_str());
  if (!f.GetBool("no-plot")) printf("%s\n", Plot(f, json_path, png_path).c_str());
  if (server) printf("server: stopped with SIGTERM (%s)\n", stop_note.c_str());
  fflush(stdout);
  return failed ? 1 : 0;
}
