// flashq-server: KServe v2 gRPC inference server for fused attention and
// quantized linear layers. See README.md for the flags, models and metrics.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/heap.h"
#include "server/backends/cpu/cpu_backend.h"
#include "common/flags.h"
#include "server/inference_server.h"
#include "server/core/shared_memory.h"
#include "server/frontend/auth.h"
#include "server/frontend/grpc_keepalive.h"
#include "server/frontend/grpc_service.h"
#include "server/frontend/http_service.h"
#include "server/metrics/gpu_metrics.h"
#include "server/metrics/http_exposer.h"
#include "server/metrics/triton_metrics.h"
#include "server/repository/demo_repository.h"
#include "server/repository/model_repository.h"
#include "server/repository/model_versions.h"
#ifdef FLASHQ_CUDA_BACKEND
#include "server/backends/cuda/cuda_backend.h"
#endif

namespace flashq::server {

constexpr int64_t kMaxQueueDelayUs = 60'000'000, kMaxQueueSize = 10'000'000;

struct Options {
  std::string host = "0.0.0.0";
  int64_t http_port = 8000, grpc_port = 8001, metrics_port = 8002;
  int64_t http_thread_count = HttpOptions().threads;
  std::string model_repository, demo_cache_dir, backend = "auto";
  std::string model_control_mode = "none";
  std::vector<std::string> load_model;
  int64_t repository_poll_secs = 15;
  std::string metrics_compat = "none";
  int64_t max_queue_delay_us = -1, max_queue_size = -1, max_batch_tokens = -1;
  // gRPC's own ceiling, as in Triton: the token budget and --max-tensor-bytes bound a request, so
  // any request within a model's token budget fits (docs/security.md, "Request limits").
  int64_t grpc_max_message_bytes = INT32_MAX;
  int64_t stream_max_unanswered = StreamLimits().max_answers, stream_max_unsent_bytes = StreamLimits().max_bytes;
  int64_t kv_cache_blocks = 0, workers_per_model = -1, cpu_threads = 0, idle_spin_us = -1, response_threads = 0;
  int64_t gpu_streams = 4, gpu_staging_mb = 128, gpu_arena_mb = 2048;
  int64_t heap_reserve_mb = int64_t(kHeapPrefaultBytes >> 20);
  bool batch_invariant = true;
  int64_t max_tensor_bytes = 0, max_sequences_per_request = 0;
  int64_t max_shared_memory_regions = SharedMemoryRegistry::kDefaultMaxRegions;
  std::string tls_cert, tls_key, tls_ca, auth_token, auth_token_file;
  bool auth_inference = true;
  GrpcKeepaliveOptions keepalive;
};

void AddFlags(FlagSet& f, Options& o) {
  f.Add("host", &o.host, "Address to listen on (HTTP, gRPC and metrics).");
  f.Add("http-port", &o.http_port,
        "HTTP/REST port (KServe v2 inference protocol: JSON and binary tensors); 0 disables.", 0, 65535);
  f.Add("http-thread-count", &o.http_thread_count,
        "HTTP threads; each open HTTP connection holds one while it runs a request or is kept alive, so this bounds "
        "the concurrent HTTP clients.",
        1, 1024);
  f.Add("grpc-port", &o.grpc_port, "gRPC port (KServe v2 inference protocol, health, reflection).", 0, 65535);
  f.Add("metrics-port", &o.metrics_port, "HTTP port serving Prometheus metrics at /metrics; 0 disables.", 0, 65535);
  f.Add("metrics-compat", &o.metrics_compat,
        "none, or triton: /metrics also exports Triton's per-model names (nv_inference_request_success, "
        "nv_inference_count, nv_inference_queue_duration_us, ...) for tools written against Triton.");
  f.Add("model-repository", &o.model_repository,
        "Model repository: one folder per model with config.pbtxt (and model.safetensors for linear layers). "
        "Empty: generate the embedded Llama-3-8B-shaped demo repository.");
  f.Add("model-control-mode", &o.model_control_mode,
        "none: serve every model of the repository, fixed. explicit: load only the --load-model models at start-up; "
        "RepositoryModelLoad/RepositoryModelUnload load and unload models while the server runs. poll: serve every "
        "model, and rescan the repository every --repository-poll-secs, loading new and changed models and unloading "
        "removed ones.");
  f.Add("load-model", &o.load_model,
        "With --model-control-mode=explicit: a model to load at start-up (repeat the flag for several; * for all).");
  f.Add("repository-poll-secs", &o.repository_poll_secs,
        "With --model-control-mode=poll: seconds between rescans of the model repository.", 1, 86400);
  f.Add("demo-cache-dir", &o.demo_cache_dir,
        "Where the demo repository is generated and cached (default $XDG_CACHE_HOME/flashq or ~/.cache/flashq).");
  f.Add("backend", &o.backend, "Compute backend: auto (cuda when a GPU is visible, else cpu), cpu or cuda.");
  f.Add("max-queue-delay-us", &o.max_queue_delay_us,
        "Override every model's max queue delay in microseconds (-1: each model's config).", -1, kMaxQueueDelayUs);
  f.Add("max-queue-size", &o.max_queue_size, "Override every model's bounded queue length (-1: each model's config).",
        -1, kMaxQueueSize);
  f.Add("max-batch-tokens", &o.max_batch_tokens, "Override every model's token budget per batch (-1: each model's config).",
        -1, INT32_MAX);
  f.Add("grpc-max-message-bytes", &o.grpc_max_message_bytes,
        "Largest gRPC message accepted or sent; a larger request gets RESOURCE_EXHAUSTED, and so does a request whose "
        "response would be larger, before it is computed. It bounds HTTP request bodies too (413 past it).",
        4096, INT32_MAX);
  AddGrpcKeepaliveFlags(f, o.keepalive);
  f.Add("stream-max-unanswered", &o.stream_max_unanswered,
        "ModelStreamInfer: most requests of one stream read but not yet answered on the wire (queued, computing or "
        "unsent); the server stops reading that stream's requests until answers are written.",
        1, INT32_MAX);
  f.Add("stream-max-unsent-bytes", &o.stream_max_unsent_bytes,
        "ModelStreamInfer: most bytes of answers one stream holds unsent (waiting to be written, plus those still "
        "computing counted at the stream's largest answer); the server stops reading that stream's requests until "
        "answers are written.",
        1, INT64_MAX);
  f.Add("max-tensor-bytes", &o.max_tensor_bytes,
        "Largest input tensor accepted, in bytes (shape x datatype), checked before any copy; a larger one gets "
        "RESOURCE_EXHAUSTED. 0: only --grpc-max-message-bytes applies.",
        0, INT64_MAX);
  f.Add("max-sequences-per-request", &o.max_sequences_per_request,
        "attention: most sequences (CU_SEQLENS entries - 1) in one request; more gets RESOURCE_EXHAUSTED. 0: no limit "
        "beyond the token budget.",
        0, INT32_MAX);
  f.Add("max-shared-memory-regions", &o.max_shared_memory_regions,
        "Most system shared-memory regions registered at once (each holds a file descriptor and a mapping); "
        "0 turns the system shared-memory extension off.",
        0, 65536);
  f.Add("tls-cert", &o.tls_cert,
        "PEM certificate chain of the gRPC and HTTP servers; with --tls-key, both are served over TLS only (HTTPS).");
  f.Add("tls-key", &o.tls_key, "PEM private key for --tls-cert.");
  f.Add("tls-ca", &o.tls_ca,
        "PEM CA bundle: mutual TLS, every client must present a certificate signed by it (needs --tls-cert/--tls-key).");
  f.Add("auth-token", &o.auth_token,
        "Bearer token (gRPC metadata or HTTP header 'authorization: Bearer <token>') required on inference, metadata, "
        "config and statistics requests; liveness, readiness and grpc.health.v1 stay open. Prefer --auth-token-file "
        "(argv is visible).");
  f.Add("auth-token-file", &o.auth_token_file, "File whose first line is the bearer token (see --auth-token).");
  f.Add("auth-inference", &o.auth_inference,
        "With a token: require it on ModelInfer/ModelStreamInfer and HTTP /infer too (false: only the administrative "
        "requests need it).");
  f.Add("kv-cache-blocks", &o.kv_cache_blocks, "Override kv_attention's number of KV-cache blocks (0: the model's config).",
        0, INT32_MAX);
  f.Add("batch-invariant", &o.batch_invariant,
        "Batch-invariant mode: a request's output is bitwise identical whatever else shares its batch.");
  f.Add("heap-reserve-mb", &o.heap_reserve_mb,
        "Free host heap kept mapped for the next tensors, in MiB; free heap above it that stays unused for about "
        "2 s goes back to the OS. -1: keep all freed memory.",
        -1, int64_t(1) << 30);
  f.Add("workers-per-model", &o.workers_per_model,
        "Batches executed concurrently per model; overrides instance_group. -1: the model's instance_group, else 4 per "
        "GPU (2 with the CPU backend): each batch's host work (copies, answers) overlaps the others' and the GPU's.",
        -1, 256);
  f.Add("idle-spin-us", &o.idle_spin_us,
        "After a batch, one idle worker per model polls its queue this long (busy, one core) before it sleeps, so "
        "that a request arriving meanwhile starts without a thread wake-up; 0: sleep at once. -1: 500 with the CUDA "
        "backend, 0 with the CPU backend (whose cores do the compute).", -1, 10'000);
  f.Add("response-threads", &o.response_threads,
        "Threads that send the answers of a batch beyond its first 4 while its worker takes the next batch; 0: each "
        "worker sends its whole batch's answers. Helps where the host has cores to spare for them (docs/perf/server.md).",
        0, 256);
  f.Add("cpu-threads", &o.cpu_threads, "Threads of the CPU backend (0: all cores).", 0, 1024);
  f.Add("gpu-streams", &o.gpu_streams,
        "CUDA backend: streams per GPU, each with its own pinned and device staging; batches overlap across them.", 1, 64);
  f.Add("gpu-staging-mb", &o.gpu_staging_mb, "CUDA backend: staging buffer per stream, host (pinned) and device, in MiB.",
        1, 1 << 20);
  f.Add("gpu-arena-mb", &o.gpu_arena_mb,
        "CUDA backend: device memory arena per GPU allocated at start-up (staging, KV cache, workspaces), in MiB.", 1,
        1 << 24);
}

std::string DefaultCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/flashq";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/flashq";
  return "/tmp/flashq-cache";
}

std::optional<int64_t> Override(int64_t v) { return v >= 0 ? std::optional<int64_t>(v) : std::nullopt; }

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& kind, const BackendOptions& options,
                                                     ServerMetrics& metrics) {
#ifdef FLASHQ_CUDA_BACKEND
  if (kind == "cuda" || (kind == "auto" && CudaDeviceCount() > 0)) return CreateCudaBackend(options, metrics);
#else
  if (kind == "cuda") return absl::FailedPreconditionError("this build has no CUDA backend (built without nvcc)");
#endif
  if (kind != "cpu" && kind != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--backend=", kind, ": expected auto, cpu or cuda"));
  }
  return std::unique_ptr<Backend>(new CpuBackend(options));
}

int Run(const Options& o) {
  // Request buffers (up to tens of MB) come from the heap and stay there once freed, so requests
  // pay no mmap or page faults for their tensors; what stays unused beyond a warm reserve goes
  // back to the OS after a while, so a burst does not keep its peak (common/heap.h).
  ConfigureHeapForTensors();
  // Signals are taken by one thread with sigwait, so block them everywhere first.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::optional<IdleHeapReleaser> heap_releaser;
  if (o.heap_reserve_mb >= 0) heap_releaser.emplace(size_t(o.heap_reserve_mb) << 20);
  const auto t0 = std::chrono::steady_clock::now();
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  if (o.metrics_compat != "none" && o.metrics_compat != "triton") {
    std::cerr << "flashq-server: --metrics-compat=" << o.metrics_compat << ": expected none or triton\n";
    return 2;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  ServerMetrics metrics(registry);

  // The backend (CUDA contexts, cuBLASLt, arena, pinned staging) starts on its own thread
  // while gRPC, metrics and the model repository come up here.
  BackendOptions bopts;
  bopts.batch_invariant = o.batch_invariant;
  bopts.cpu_threads = int(o.cpu_threads);
  bopts.streams_per_device = int(o.gpu_streams);
  bopts.staging_bytes = o.gpu_staging_mb << 20;
  bopts.arena_bytes = o.gpu_arena_mb << 20;
  double backend_s = 0;
  auto backend_future = std::async(std::launch::async, [&] {
    auto b = MakeBackend(o.backend, bopts, metrics);
    backend_s = since_start();
    return b;
  });
  std::unique_ptr<MetricsHttpServer> metrics_http;
  const std::string host = o.host;
  if (o.metrics_port > 0) {
    auto m = MetricsHttpServer::Start(host, o.metrics_port, registry);
    if (!m.ok()) {
      std::cerr << "flashq-server: metrics: " << m.status() << "\n";
      return 1;
    }
    metrics_http = std::move(*m);
  }
  // Computed when /metrics is scraped: Triton's per-model names (from the ModelStatistics
  // counters, once the models are loaded) and the GPUs' gauges.
  auto triton_metrics = std::make_shared<TritonCompatMetrics>();
  std::shared_ptr<GpuMetrics> gpu_metrics;
  if (metrics_http) {
    if (o.metrics_compat == "triton") metrics_http->AddCollectable(triton_metrics);
    auto sampler = CreateNvmlSampler();
    if (sampler.ok()) {
      gpu_metrics = std::make_shared<GpuMetrics>(std::move(*sampler));
      metrics_http->AddCollectable(gpu_metrics);
    }
    std::cerr << "flashq-server: GPU metrics (nv_gpu_*): "
              << (sampler.ok() ? std::string("from NVML") : absl::StrCat("none: ", sampler.status().message()))
              << "\n";
  }

  auto credentials = MakeServerCredentials({o.tls_cert, o.tls_key, o.tls_ca});
  if (!credentials.ok()) {
    std::cerr << "flashq-server: TLS: " << credentials.status() << "\n";
    return 2;
  }
  auto auth = TokenAuth::Create(o.auth_token, o.auth_token_file);
  if (!auth.ok()) {
    std::cerr << "flashq-server: auth: " << auth.status() << "\n";
    return 2;
  }

  // Regions registered by clients; it outlives the service and the server, which use it.
  std::unique_ptr<SharedMemoryRegistry> shared_memory;
  if (o.max_shared_memory_regions > 0) shared_memory = std::make_unique<SharedMemoryRegistry>(o.max_shared_memory_regions);

  // gRPC first, so that liveness and health answer while the models load.
  GrpcInferenceService service(FLASHQ_VERSION);
  service.SetAuth(auth->get(), o.auth_inference);
  service.SetStreamLimits({o.stream_max_unanswered, o.stream_max_unsent_bytes});
  service.SetSharedMemory(shared_memory.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", o.grpc_port), *credentials, &bound_port);
  const int max_msg = int(o.grpc_max_message_bytes);
  builder.SetMaxReceiveMessageSize(max_msg);
  builder.SetMaxSendMessageSize(max_msg);
  // Tensors are megabytes: start each stream with a large HTTP/2 window instead of
  // letting the first big request crawl through 64 KB windows while BDP probing grows it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  ApplyGrpcKeepalive(o.keepalive, builder);
  std::vector<std::pair<std::string, std::string>> channel_args;  // as gRPC core receives them
  RecordChannelArgs(builder, &channel_args);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (!grpc_server || bound_port == 0) {
    std::cerr << "flashq-server: cannot listen on " << host << ":" << o.grpc_port << "\n";
    return 1;
  }
  // HTTP/REST beside gRPC, with the same TLS, token and shared-memory registry.
  std::unique_ptr<HttpInferenceService> http;
  if (o.http_port > 0) {
    HttpOptions hopts;
    hopts.threads = int(o.http_thread_count);
    hopts.max_body_bytes = size_t(o.grpc_max_message_bytes);
    hopts.tls = {o.tls_cert, o.tls_key, o.tls_ca};
    hopts.auth = auth->get();
    hopts.auth_inference = o.auth_inference;
    hopts.shared_memory = shared_memory.get();
    auto h = HttpInferenceService::Start(host, int(o.http_port), FLASHQ_VERSION, hopts);
    if (!h.ok()) {
      std::cerr << "flashq-server: HTTP: " << h.status() << "\n";
      return 1;
    }
    http = std::move(*h);
  }
  auto* health = grpc_server->GetHealthCheckService();
  // "" is the whole server; the service's own name is what Kubernetes and grpc_health_probe
  // ask for with -service. SetServingStatus(bool) then switches every registered name.
  health->SetServingStatus(inference::GRPCInferenceService::service_full_name(), false);
  health->SetServingStatus(false);
  std::cerr << "flashq-server: gRPC on " << host << ":" << bound_port
            << (o.tls_cert.empty() ? "" : o.tls_ca.empty() ? " (TLS)" : " (mutual TLS)")
            << ((*auth)->enabled() ? " (bearer token)" : "") << ", HTTP on :" << (http ? http->port() : 0)
            << ", metrics on :"
            << (metrics_http ? metrics_http->port() : 0) << "\n";
  std::cerr << "flashq-server: gRPC channel arguments: " << DescribeChannelArgs(channel_args) << "\n";

  std::string repo = o.model_repository;
  if (repo.empty()) {
    std::string cache = o.demo_cache_dir;
    auto demo = EnsureDemoRepository(cache.empty() ? DefaultCacheDir() : cache);
    if (!demo.ok()) {
      std::cerr << "flashq-server: demo repository: " << demo.status() << "\n";
      return 1;
    }
    repo = *demo;
  }
  auto control = ParseModelControlMode(o.model_control_mode);
  if (!control.ok()) {
    std::cerr << "flashq-server: --model-control-mode: " << control.status().message() << "\n";
    return 2;
  }
  if (!o.load_model.empty() && *control != ModelControlMode::kExplicit) {
    std::cerr << "flashq-server: --load-model needs --model-control-mode=explicit\n";
    return 2;
  }
  // Request size limits travel as model parameters (a model's config may also set them);
  // models loaded later get them the same way.
  auto adjust = [max_tensor_bytes = o.max_tensor_bytes, max_sequences = o.max_sequences_per_request](ModelEntry& e) {
    auto& params = *e.config.mutable_parameters();
    if (max_tensor_bytes > 0) params["max_tensor_bytes"].set_string_value(std::to_string(max_tensor_bytes));
    if (max_sequences > 0) params["max_sequences_per_request"].set_string_value(std::to_string(max_sequences));
  };
  absl::StatusOr<std::vector<ModelEntry>> entries;
  if (*control == ModelControlMode::kExplicit) {
    // Only the named models load now; the others wait for RepositoryModelLoad.
    std::vector<std::string> names = o.load_model;
    if (std::find(names.begin(), names.end(), "*") != names.end()) {
      auto all = ListModelFolders(repo);
      if (!all.ok()) {
        std::cerr << "flashq-server: " << all.status() << "\n";
        return 1;
      }
      names = *all;
    }
    entries.emplace();
    for (const std::string& name : names) {
      auto e = ReadModelEntry(repo, name);
      if (!e.ok()) {
        std::cerr << "flashq-server: --load-model=" << name << ": " << e.status() << "\n";
        return 1;
      }
      entries->push_back(*std::move(e));
    }
  } else {
    entries = ScanModelRepository(repo);
  }
  if (!entries.ok()) {
    std::cerr << "flashq-server: " << entries.status() << "\n";
    return 1;
  }
  for (ModelEntry& e : *entries) adjust(e);
  const double repository_s = since_start();
  auto backend = backend_future.get();
  if (!backend.ok()) {
    std::cerr << "flashq-server: backend: " << backend.status() << "\n";
    return 1;
  }
  if (shared_memory) shared_memory->SetDeviceAccess((*backend)->device_memory());
  std::cerr << "flashq-server: " << (*backend)->name() << " backend up at " << backend_s
            << " s; gRPC, metrics and repository up at " << repository_s << " s; heap: " << HeapAllocatorName()
            << "\n";
  InferenceServerOptions opts;
  opts.max_queue_size = Override(o.max_queue_size);
  opts.max_queue_delay_us = Override(o.max_queue_delay_us);
  opts.max_batch_tokens = Override(o.max_batch_tokens);
  // Four batches in flight per GPU, so that each one's host work (copies, answers) overlaps the others' and the
  // GPU's; the CPU backend's two share its cores.
  const int default_workers = (*backend)->name() == "cpu" ? 2 : 4 * (*backend)->devices();
  opts.workers_per_model = int(o.workers_per_model > 0 ? o.workers_per_model : default_workers);
  opts.workers_per_model_from_flag = o.workers_per_model > 0;
  opts.response_threads = int(o.response_threads);
  // With the CUDA backend a worker's core waits on the GPU; with the CPU backend the
  // cores compute, and a polling worker would take one from them.
  opts.idle_spin_us = o.idle_spin_us >= 0 ? o.idle_spin_us : (*backend)->name() == "cpu" ? 0 : 500;
  opts.max_response_bytes = o.grpc_max_message_bytes;
  opts.shared_memory = shared_memory.get();
  opts.load.kv_cache_blocks = o.kv_cache_blocks;
  opts.repository = repo;
  opts.control = *control;
  opts.poll_seconds = double(o.repository_poll_secs);
  opts.adjust_entry = adjust;
  std::mutex log_mu;  // models load on several threads
  opts.load.log = [&log_mu](const std::string& model, const std::string& line) {
    std::lock_guard<std::mutex> l(log_mu);
    std::cerr << "flashq-server: model " << model << ": " << line << "\n";
  };
  auto server = InferenceServer::Create(*entries, **backend, metrics, opts);
  if (!server.ok()) {
    std::cerr << "flashq-server: " << server.status() << "\n";
    return 1;
  }
  service.SetServer(server->get());
  InferenceServer* served = server->get();
  triton_metrics->SetSources(
      [served](inference::ModelStatisticsResponse* out) { served->FillStatistics("", out); },
      [&metrics](const std::string& model) { return metrics.ForModel(model).queue_depth->Value(); });
  if (http) http->SetServer(served);
  service.SetReady(true);
  if (http) http->SetReady(true);
  health->SetServingStatus(true);
  for (const auto& [name, seconds] : (*server)->load_seconds()) {
    std::cerr << "flashq-server: model " << name << " loaded and warmed up in " << seconds << " s\n";
  }
  std::cerr << "flashq-server: " << (*server)->models().size() << " models from " << repo << " on the "
            << (*backend)->name() << " backend\n";
  std::cerr << "flashq-server ready in " << since_start() << " s (weights loaded and uploaded in "
            << (*server)->weights_seconds() << " s)" << std::endl;

  int sig = 0;
  sigwait(&sigs, &sig);
  std::cerr << "flashq-server: signal " << sig << ", draining\n";
  // Stop admitting, answer everything queued, then close gRPC.
  service.SetReady(false);
  if (http) http->SetReady(false);
  health->SetServingStatus(false);
  (*server)->Drain();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc_server->Wait();
  if (http) http->Stop();  // its handlers have their answers: Drain answered every request
  service.WaitForControlCalls();  // a load or unload still running uses the server
  triton_metrics->SetSources({}, {});  // waits for a scrape that reads the server
  server->reset();
  // Regions page-locked or opened by the backend are released while it still runs.
  if (shared_memory) {
    shared_memory->UnregisterAll();
    shared_memory->UnregisterAll(/*cuda=*/true);
  }
  std::cerr << "flashq-server: stopped" << std::endl;
  return 0;
}

}  // namespace flashq::server

int main(int argc, char** argv) {
  // gRPC locks absl::Mutex on every call. Debian's Abseil is built with deadlock detection
  // on, which takes one process-wide lock per acquisition: under load it showed in profiles
  // as GraphCycles and SpinLock time on every gRPC thread.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  flashq::server::Options options;
  flashq::FlagSet flags(
      "flashq-server: KServe v2 gRPC server for fused attention and quantized linear layers.\n"
      "Usage: flashq-server [--model-repository=DIR] [--http-port=8000] [--grpc-port=8001] [--metrics-port=8002] [--backend=auto] ...");
  flashq::server::AddFlags(flags, options);
  bool help = false;
  std::string error;
  if (!flags.Parse(argc, argv, &help, &error)) {
    std::cerr << "flashq-server: " << error << "\n";
    return 2;
  }
  if (help) {
    std::cout << flags.Help();
    return 0;
  }
  // An empty token would turn authentication off without a word; a token file that holds
  // none is refused the same way (TokenAuth::Create).
  if (flags.WasSet("auth-token") && options.auth_token.empty()) {
    std::cerr << "flashq-server: --auth-token is empty; give a token, or leave the flag out to serve without one\n";
    return 2;
  }
  return flashq::server::Run(options);
}
