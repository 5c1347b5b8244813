#include "server/inference_server.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/client_text.h"
#include "server/core/request_decoder.h"
#include "server/repository/model_repository.h"

namespace flashq::server {
namespace {

// gRPC code names, as Prometheus labels.
std::string CodeName(absl::StatusCode c) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  int i = int(c);
  return i >= 0 && i < int(std::size(kNames)) ? kNames[i] : "UNKNOWN";
}

constexpr int64_t kMaxRequestIdBytes = 1024;
constexpr int kDefaultLoadThreads = 8;
constexpr int64_t kResponseOverheadBytes = 2048;

uint64_t Ns(Clock::duration d) { return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()); }

constexpr int64_t kMaxWorkersPerModel = 256;
constexpr uint64_t kMaxQueueTimeoutUs = uint64_t(24) * 3600 * 1'000'000;

// Workers of a model from Triton's instance_group: `count` instances (default 1) on each
// GPU of `gpus`, on every GPU when `gpus` is empty, or `count` for a KIND_CPU group.
absl::StatusOr<int> WorkersFromInstanceGroups(const inference::ModelConfig& c, int devices) {
  int64_t workers = 0;
  for (const auto& g : c.instance_group()) {
    if (g.count() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("model '", c.name(), "': instance_group count is ", g.count(),
                                                     "; it must be >= 1"));
    }
    const int64_t places = g.kind() == inference::ModelInstanceGroup::KIND_CPU ? 1
                           : g.gpus().empty()                                  ? std::max(devices, 1)
                                                                               : g.gpus_size();
    workers += int64_t(std::max(g.count(), 1)) * places;
  }
  if (workers > kMaxWorkersPerModel) {
    return absl::InvalidArgumentError(absl::StrCat("model '", c.name(), "': instance_group asks for ", workers,
                                                   " workers; the limit is ", kMaxWorkersPerModel));
  }
  return int(workers);
}

}  // namespace

absl::StatusOr<SchedulerOptions> SchedulerOptionsFor(const inference::ModelConfig& c, const InferenceServerOptions& o,
                                                     int devices) {
  SchedulerOptions s;
  int64_t size = 1024, delay = 0;
  if (c.has_dynamic_batching()) {
    const auto& policy = c.dynamic_batching().default_queue_policy();
    delay = int64_t(c.dynamic_batching().max_queue_delay_microseconds());
    if (policy.max_queue_size() > 0) size = policy.max_queue_size();
    if (policy.default_timeout_microseconds() > kMaxQueueTimeoutUs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", c.name(), "': default_queue_policy.default_timeout_microseconds is ",
          policy.default_timeout_microseconds(), "; it must be at most ", kMaxQueueTimeoutUs, " (a day)"));
    }
    const uint64_t levels = c.dynamic_batching().priority_levels();
    const uint64_t def = c.dynamic_batching().default_priority_level();
    if (levels > 0 && (def < 1 || def > levels)) {
      return absl::InvalidArgumentError(absl::StrCat("model '", c.name(), "': dynamic_batching.default_priority_level is ",
                                                     def, "; with priority_levels ", levels, " it must be in 1..",
                                                     levels));
    }
    s.preserve_ordering = c.dynamic_batching().preserve_ordering();
    for (const auto& [level, lp] : c.dynamic_batching().priority_queue_policy()) {
      if (level < 1 || level > levels) {
        return absl::InvalidArgumentError(absl::StrCat("model '", c.name(), "': dynamic_batching.priority_queue_policy has level ",
                                                       level, "; the levels are 1..", levels, " (priority_levels)"));
      }
      if (lp.default_timeout_microseconds() > kMaxQueueTimeoutUs) {
        return absl::InvalidArgumentError(absl::StrCat("model '", c.name(), "': priority_queue_policy of level ", level,
                                                       ": default_timeout_microseconds must be at most ",
                                                       kMaxQueueTimeoutUs, " (a day)"));
      }
      SchedulerOptions::LevelPolicy& out = s.level_policies[level];
      out.max_queue_size = lp.max_queue_size();
      out.queue_timeout = std::chrono::microseconds(lp.default_timeout_microseconds());
      out.allow_timeout_override = lp.allow_timeout_override();
      out.delay_on_timeout = lp.timeout_action() == inference::ModelQueuePolicy::DELAY;
    }
    s.priority_levels = levels;
    s.default_priority = def;
    s.queue_timeout = std::chrono::microseconds(policy.default_timeout_microseconds());
    s.allow_timeout_override = policy.allow_timeout_override();
    s.delay_on_timeout = policy.timeout_action() == inference::ModelQueuePolicy::DELAY;
  }
  auto p_size = ConfigIntParam(c, "max_queue_size", size, 1, 10'000'000);
  auto p_delay = ConfigIntParam(c, "max_queue_delay_us", delay, 0, 60'000'000);
  auto p_tokens = ConfigIntParam(c, "max_batch_tokens", 16384, 1, INT32_MAX);
  for (const auto* v : {&p_size, &p_delay, &p_tokens}) {
    if (!v->ok()) return v->status();
  }
  s.max_queue_size = o.max_queue_size.value_or(*p_size);
  s.max_queue_delay = std::chrono::microseconds(o.max_queue_delay_us.value_or(*p_delay));
  s.max_batch_tokens = o.max_batch_tokens.value_or(*p_tokens);
  s.workers = o.workers_per_model;
  if (!o.workers_per_model_from_flag && c.instance_group_size() > 0) {
    auto w = WorkersFromInstanceGroups(c, devices);
    if (!w.ok()) return w.status();
    s.workers = *w;
  }
  s.idle_spin = std::chrono::microseconds(o.idle_spin_us);
  if (s.max_queue_size < 1 || s.max_batch_tokens < 1 || s.max_queue_delay.count() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("model '", c.name(),
                                                   "': max_queue_size and max_batch_tokens must be >= 1, max_queue_delay_us >= 0"));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<InferenceServer>> InferenceServer::Create(const std::vector<ModelEntry>& entries,
                                                                         Backend& backend, ServerMetrics& metrics,
                                                                         const InferenceServerOptions& options) {
  std::unique_ptr<InferenceServer> server(
      new InferenceServer(metrics, options.max_response_bytes, options.shared_memory));
  server->log_ = options.load.log;
  const size_t n = entries.size();
  std::vector<SchedulerOptions> sched(n);
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& w : entries[i].warnings) {
      if (options.load.log) options.load.log(entries[i].config.name(), w);
    }
    auto s = SchedulerOptionsFor(entries[i].config, options, backend.devices());
    if (!s.ok()) return s.status();
    sched[i] = *s;
  }

  // Models load in parallel on a bounded pool of threads, each taking the next entry:
  // reading and unpacking weights is host work that scales with cores, and uploads and
  // warm-ups of different models overlap. Every model that reads a checkpoint file shares
  // one mapping of it through `checkpoints`, which unmaps everything once loading ends.
  CheckpointCache checkpoints;
  ModelLoadOptions load = options.load;
  if (load.checkpoints == nullptr) load.checkpoints = &checkpoints;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t threads =
      std::min(n, size_t(options.load_threads > 0 ? options.load_threads : std::min(hw, kDefaultLoadThreads)));
  std::vector<std::optional<absl::StatusOr<std::unique_ptr<Model>>>> models(n);
  std::vector<double> seconds(n, 0.0), linear_end(n, 0.0);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto t_load = Clock::now();
  auto work = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < n;) {
      const auto t0 = Clock::now();
      models[i] = CreateModel(entries[i], backend, load);
      const auto t1 = Clock::now();
      seconds[i] = std::chrono::duration<double>(t1 - t0).count();
      if (ConfigParam(entries[i].config, "kind", "") == "linear")
        linear_end[i] = std::chrono::duration<double>(t1 - t_load).count();
      if (!models[i]->ok()) failed = true;  // the others stop taking entries
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  // The first failure in repository order, whichever thread met it first.
  for (size_t i = 0; i < n; ++i)
    if (models[i] && !models[i]->ok()) return models[i]->status();
  server->weights_seconds_ = n == 0 ? 0.0 : *std::max_element(linear_end.begin(), linear_end.end());

  for (size_t i = 0; i < n; ++i) {
    const ModelEntry& e = entries[i];
    server->load_seconds_.emplace_back(e.config.name(), seconds[i]);
    Served s;
    s.model = std::move(**models[i]);
    s.stats = std::make_unique<ModelStats>();
    s.metrics = &metrics.ForModel(e.config.name());
    if (s.model->KvBlocks()) metrics.KvCacheUsageRatio(e.config.name());
    UpdateKvGauges(s);
    s.scheduler = std::make_unique<Scheduler>(*s.model, sched[i], *s.metrics, *s.stats);
    server->models_.emplace(e.config.name(), std::move(s));
  }
  server->housekeeping_ = std::thread([s = server.get()] { s->Housekeeping(); });
  return server;
}

InferenceServer::~InferenceServer() {
  Drain();
  stop_housekeeping_ = true;
  if (housekeeping_.joinable()) housekeeping_.join();
}

void InferenceServer::Housekeeping() {
  for (int tick = 0; !stop_housekeeping_; ++tick) {
    if (tick % 10 == 0) {
      for (auto& [name, s] : models_) {
        s.model->Tick(Clock::now());
        UpdateKvGauges(s);  // idle sessions may have been freed
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void InferenceServer::UpdateKvGauges(Served& s) {
  if (auto kv = s.model->KvBlocks()) {
    s.metrics->kv_blocks_in_use->Set(double(kv->in_use));
    s.metrics->kv_blocks_total->Set(double(kv->total));
    if (s.metrics->kv_usage_ratio) {
      s.metrics->kv_usage_ratio->Set(kv->total > 0 ? double(kv->in_use) / double(kv->total) : 0.0);
    }
  }
}

void InferenceServer::Drain() {
  draining_ = true;
  for (auto& [name, s] : models_) s.scheduler->Shutdown();
}

const Model* InferenceServer::FindModel(const std::string& name) const {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second.model.get();
}

std::vector<const Model*> InferenceServer::models() const {
  std::vector<const Model*> out;
  for (const auto& [name, s] : models_) out.push_back(s.model.get());
  return out;
}

void InferenceServer::FillStatistics(const std::string& name, inference::ModelStatisticsResponse* out) const {
  for (const auto& [n, s] : models_) {
    if (!name.empty() && n != name) continue;
    auto* m = out->add_model_stats();
    m->set_name(n);
    m->set_version("1");
    s.stats->Fill(m);
  }
}

absl::Status CheckModelVersion(const std::string& model, const std::string& version) {
  if (version.empty() || version == "1") return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model '", model, "' has no version ", Quoted(version), "; it serves version 1"));
}

void InferenceServer::LogFault(const std::string& model, const absl::Status& status) {
  const auto c = status.code();
  if (!log_ || (c != absl::StatusCode::kInternal && c != absl::StatusCode::kUnknown && c != absl::StatusCode::kDataLoss)) {
    return;
  }
  const uint64_t n = ++faults_;
  if (n <= 20 || n % 1000 == 0) log_(model, absl::StrCat("request failed (server fault ", n, "): ", status.ToString()));
}

void InferenceServer::CountRejected(const std::string& model, absl::StatusCode code) {
  metrics_.CountRequest(models_.count(model) ? model : "(unknown)", CodeName(code));
}

void InferenceServer::Infer(const inference::ModelInferRequest& request, std::optional<Clock::time_point> deadline,
                            std::function<bool()> cancelled, Done done) {
  const auto start = Clock::now();
  auto it = models_.find(request.model_name());
  if (it == models_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, s] : models_) names.push_back(n);
    metrics_.CountRequest(request.model_name().empty() ? "(none)" : "(unknown)", "NOT_FOUND");
    done(absl::NotFoundError(absl::StrCat("unknown model ", Quoted(request.model_name()), "; this server serves ",
                                          absl::StrJoin(names, ", "))),
         nullptr);
    return;
  }
  Served& s = it->second;
  auto finish = [this, &s, start, deadline, cancelled](const absl::Status& status, Work* work, uint64_t queue_ns,
                                                       uint64_t compute_ns, const Done& done) {
    absl::Status st = status.ok() && work ? work->status : status;
    // A client that gave up while its request computed never sees the result: count it
    // as the client saw it, not as OK.
    if (st.ok() && deadline && Clock::now() >= *deadline) {
      st = absl::DeadlineExceededError("the request passed its deadline while it was computed");
    } else if (st.ok() && cancelled && cancelled()) {
      st = absl::CancelledError("the client cancelled the request while it was computed");
    }
    const uint64_t total_ns = Ns(Clock::now() - start);
    if (st.ok()) {
      s.stats->RecordSuccess(total_ns, queue_ns, compute_ns);
      s.metrics->total_seconds->Observe(double(total_ns) * 1e-9);
    } else {
      s.stats->RecordFailure(total_ns);
    }
    metrics_.CountRequest(s.model->name(), CodeName(st.code()));
    LogFault(s.model->name(), st);
    s.metrics->inflight->Decrement();
    UpdateKvGauges(s);
    done(st, work);
  };
  s.metrics->inflight->Increment();
  if (draining_) {
    finish(absl::UnavailableError("server is shutting down"), nullptr, 0, 0, done);
    return;
  }
  if (absl::Status v = CheckModelVersion(s.model->name(), request.model_version()); !v.ok()) {
    finish(v, nullptr, 0, 0, done);
    return;
  }
  if (request.id().size() > kMaxRequestIdBytes) {
    finish(absl::InvalidArgumentError(absl::StrCat("request id is ", request.id().size(), " bytes; the limit is ",
                                                   kMaxRequestIdBytes)),
           nullptr, 0, 0, done);
    return;
  }
  auto work = s.model->Prepare(request, shared_memory_);
  if (!work.ok()) {
    finish(work.status(), nullptr, 0, 0, done);
    return;
  }
  if (absl::Status bound = BindSharedMemoryOutputs(request, shared_memory_, **work); !bound.ok()) {
    s.model->Drop(**work, bound);
    finish(bound, nullptr, 0, 0, done);
    return;
  }
  // Refused before compute: a response over the frontend's message limit could not be sent.
  const int64_t message_bytes = (*work)->MessageBytes();
  // Besides the outputs a response holds their names, datatypes and shapes, the model name and
  // the request id: a few hundred bytes, bounded here generously.
  const int64_t overhead = kResponseOverheadBytes + int64_t(request.id().size() + request.model_name().size());
  if (max_response_bytes_ > 0 && message_bytes > 0 && message_bytes + overhead > max_response_bytes_) {
    absl::Status too_big = absl::ResourceExhaustedError(absl::StrCat(
        "the outputs of this request come to ", message_bytes, " bytes; responses are limited to ",
        max_response_bytes_, " bytes (--grpc-max-message-bytes); send fewer tokens or rows per request"));
    s.model->Drop(**work, too_big);
    finish(too_big, nullptr, 0, 0, done);
    return;
  }
  auto p = std::make_unique<Pending>();
  p->work = std::move(*work);
  p->enqueued = Clock::now();  // queue time counts from here, not from the decoding before
  p->deadline = deadline;
  p->cancelled = std::move(cancelled);
  // Triton's per-request queue timeout (microseconds), which the model's queue policy may
  // let replace default_timeout_microseconds, and priority level (0: the model's default).
  for (const std::string_view key : {"timeout", "priority"}) {
    auto t = request.parameters().find(std::string(key));
    if (t == request.parameters().end()) continue;
    const auto& v = t->second;
    const int64_t n = v.has_int64_param() ? v.int64_param() : v.has_uint64_param() ? int64_t(v.uint64_param()) : -1;
    const uint64_t hi = key == "timeout" ? kMaxQueueTimeoutUs : uint64_t(INT64_MAX);
    if (n < 0 || uint64_t(n) > hi) {
      absl::Status bad = absl::InvalidArgumentError(
          absl::StrCat("parameter '", absl::string_view(key.data(), key.size()), "' must be an integer in 0..", hi,
                       key == "timeout" ? " (microseconds)" : ""));
      s.model->Drop(*p->work, bad);
      finish(bad, nullptr, 0, 0, done);
      return;
    }
    if (key == "priority") p->priority = uint64_t(n);
    else if (n > 0) p->timeout = std::chrono::microseconds(n);
  }
  p->done = [finish, done](Pending& p, const absl::Status& st) { finish(st, p.work.get(), p.queue_ns, p.compute_ns, done); };
  absl::Status admitted = s.scheduler->Enqueue(std::move(p));
  if (!admitted.ok()) finish(admitted, nullptr, 0, 0, done);
}

}  // namespace flashq::server
