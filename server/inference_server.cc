#include "server/inference_server.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
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
constexpr auto kReleaseWait = std::chrono::seconds(2);

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

absl::StatusOr<ModelControlMode> ParseModelControlMode(const std::string& s) {
  if (s == "none") return ModelControlMode::kNone;
  if (s == "explicit") return ModelControlMode::kExplicit;
  if (s == "poll") return ModelControlMode::kPoll;
  return absl::InvalidArgumentError(absl::StrCat("model control mode ", Quoted(s), ": expected none, explicit or poll"));
}

absl::StatusOr<std::unique_ptr<InferenceServer>> InferenceServer::Create(const std::vector<ModelEntry>& entries,
                                                                         Backend& backend, ServerMetrics& metrics,
                                                                         const InferenceServerOptions& options) {
  std::unique_ptr<InferenceServer> server(new InferenceServer(backend, metrics, options));
  server->log_ = options.load.log;
  auto built = server->Build(entries, /*record_times=*/true);
  if (!built.ok()) return built.status();
  {
    absl::MutexLock l(&server->mu_);
    for (size_t i = 0; i < entries.size(); ++i) server->models_[entries[i].config.name()] = std::move((*built)[i]);
  }
  if (options.control == ModelControlMode::kPoll) {
    for (const ModelEntry& e : entries) server->fingerprints_[e.config.name()] = ModelFolderFingerprint(e.dir);
  }
  server->housekeeping_ = std::thread([s = server.get()] { s->Housekeeping(); });
  if (options.control == ModelControlMode::kPoll && !options.repository.empty()) {
    server->poll_ = std::thread([s = server.get()] { s->Poll(); });
  }
  return server;
}

absl::StatusOr<std::vector<InferenceServer::VersionSet>> InferenceServer::Build(const std::vector<ModelEntry>& entries,
                                                                                bool record_times) {
  // Every served version of every entry is one job.
  struct Job {
    size_t entry;
    ModelVersion version;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < entries.size(); ++i) {
    for (const std::string& w : entries[i].warnings) {
      if (log_) log_(entries[i].config.name(), w);
    }
    if (auto s = SchedulerOptionsFor(entries[i].config, options_, backend_.devices()); !s.ok()) return s.status();
    auto versions = ServedVersions(entries[i]);
    if (!versions.ok()) return versions.status();
    for (ModelVersion& v : *versions) jobs.push_back({i, std::move(v)});
  }
  const size_t n = jobs.size();

  // Models load in parallel on a bounded pool of threads, each taking the next job:
  // reading and unpacking weights is host work that scales with cores, and uploads and
  // warm-ups of different models overlap. Every model that reads a checkpoint file shares
  // one mapping of it through `checkpoints`, which unmaps everything once loading ends.
  CheckpointCache checkpoints;
  ModelLoadOptions load = options_.load;
  if (load.checkpoints == nullptr) load.checkpoints = &checkpoints;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t threads =
      std::min(n, size_t(options_.load_threads > 0 ? options_.load_threads : std::min(hw, kDefaultLoadThreads)));
  std::vector<std::optional<absl::StatusOr<std::unique_ptr<Model>>>> models(n);
  std::vector<double> seconds(n, 0.0), linear_end(n, 0.0);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto t_load = Clock::now();
  auto work = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < n;) {
      const auto t0 = Clock::now();
      models[i] = CreateModel(jobs[i].version.entry, backend_, load);
      const auto t1 = Clock::now();
      seconds[i] = std::chrono::duration<double>(t1 - t0).count();
      if (ConfigParam(jobs[i].version.entry.config, "kind", "") == "linear")
        linear_end[i] = std::chrono::duration<double>(t1 - t_load).count();
      if (!models[i]->ok()) failed = true;  // the others stop taking jobs
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  // The first failure in repository order, whichever thread met it first. The models
  // already built are destroyed here, which frees what they hold.
  for (size_t i = 0; i < n; ++i)
    if (models[i] && !models[i]->ok()) return models[i]->status();
  if (record_times) weights_seconds_ = n == 0 ? 0.0 : *std::max_element(linear_end.begin(), linear_end.end());

  std::vector<VersionSet> out(entries.size());
  for (size_t i = 0; i < n; ++i) {
    const Job& j = jobs[i];
    const bool several = (i > 0 && jobs[i - 1].entry == j.entry) || (i + 1 < n && jobs[i + 1].entry == j.entry);
    const std::string& name = j.version.entry.config.name();
    if (record_times) load_seconds_.emplace_back(several ? absl::StrCat(name, "/", j.version.version) : name, seconds[i]);
    auto served = Wrap(j.version.entry, j.version.version, std::move(**models[i]));
    if (!served.ok()) return served.status();
    out[j.entry][j.version.version] = std::move(*served);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<InferenceServer::Served>> InferenceServer::Wrap(const ModelEntry& entry, int64_t version,
                                                                                std::unique_ptr<Model> model) {
  auto sched = SchedulerOptionsFor(entry.config, options_, backend_.devices());
  if (!sched.ok()) return sched.status();
  auto s = std::make_shared<Served>();
  s->version = version;
  s->model = std::move(model);
  s->stats = std::make_unique<ModelStats>();
  s->metrics = &metrics_.ForModel(entry.config.name());
  if (s->model->KvBlocks()) metrics_.KvCacheUsageRatio(entry.config.name());
  UpdateKvGauges(*s);
  s->scheduler = std::make_unique<Scheduler>(*s->model, *sched, *s->metrics, *s->stats, responders_.get());
  return s;
}

InferenceServer::~InferenceServer() {
  {
    std::lock_guard<std::mutex> l(poll_mu_);
    stop_housekeeping_ = true;
  }
  poll_cv_.notify_all();
  if (poll_.joinable()) poll_.join();
  Drain();
  if (housekeeping_.joinable()) housekeeping_.join();
}

std::vector<std::shared_ptr<InferenceServer::Served>> InferenceServer::Snapshot() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<std::shared_ptr<Served>> out;
  for (const auto& [name, versions] : models_)
    for (const auto& [v, s] : versions) out.push_back(s);
  return out;
}

void InferenceServer::Housekeeping() {
  for (int tick = 0; !stop_housekeeping_; ++tick) {
    if (tick % 10 == 0) {
      for (const auto& s : Snapshot()) {
        s->model->Tick(Clock::now());
        UpdateKvGauges(*s);  // idle sessions may have been freed
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void InferenceServer::Poll() {
  const auto period = std::chrono::duration<double>(std::max(0.1, options_.poll_seconds));
  std::unique_lock<std::mutex> l(poll_mu_);
  while (!stop_housekeeping_) {
    poll_cv_.wait_for(l, period, [this] { return stop_housekeeping_.load(); });
    if (stop_housekeeping_) break;
    l.unlock();
    absl::Status st = PollRepository();
    if (!st.ok() && log_) log_("(repository)", absl::StrCat("poll: ", st.ToString()));
    l.lock();
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
  // A load in progress finishes first; it sees draining_ and publishes nothing.
  std::lock_guard<std::mutex> g(control_mu_);
  for (const auto& s : Snapshot()) s->scheduler->Shutdown();
}

InferenceServer::VersionSet InferenceServer::Publish(const std::string& name, VersionSet versions) {
  absl::MutexLock l(&mu_);
  VersionSet old = std::move(models_[name]);
  models_[name] = std::move(versions);
  unavailable_.erase(name);
  return old;
}

void InferenceServer::Retire(VersionSet& versions) {
  // No request can enter these queues any more (admission happens under mu_, and the
  // versions left the map under it): answer what they hold and stop their workers.
  for (auto& [v, s] : versions) s->scheduler->Shutdown();
  // What still holds a model now is brief (a metadata call, the housekeeping tick): wait
  // for it, so that unloads and reloads return with the memory freed. A holder that
  // stays longer than kReleaseWait only delays the destruction until it lets go.
  const auto until = Clock::now() + kReleaseWait;
  for (auto& [v, s] : versions)
    while (s.use_count() > 1 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  versions.clear();
}

absl::Status InferenceServer::RequireExplicitControl() const {
  if (control_ == ModelControlMode::kExplicit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "models load and unload on request only with --model-control-mode=explicit; this server runs with ",
      control_ == ModelControlMode::kPoll ? "poll (it follows the repository)" : "none (the repository's models, fixed)"));
}

absl::Status InferenceServer::LoadModel(const std::string& name) {
  if (absl::Status e = RequireExplicitControl(); !e.ok()) return e;
  std::lock_guard<std::mutex> g(control_mu_);
  return LoadLocked(name);
}

absl::Status InferenceServer::LoadLocked(const std::string& name) {
  if (draining_) return absl::UnavailableError("server is shutting down");
  if (options_.repository.empty()) return absl::FailedPreconditionError("this server has no model repository to load from");
  auto entry = ReadModelEntry(options_.repository, name);
  if (!entry.ok()) {
    // A model folder whose config does not parse is known, and unavailable for that reason.
    absl::MutexLock l(&mu_);
    if (entry.status().code() != absl::StatusCode::kNotFound && !models_.count(name))
      unavailable_[name] = std::string(entry.status().message());
    if (control_ == ModelControlMode::kPoll)
      fingerprints_[name] = ModelFolderFingerprint(options_.repository + "/" + name);
    return entry.status();
  }
  const std::string fingerprint = ModelFolderFingerprint(entry->dir);
  if (options_.adjust_entry) options_.adjust_entry(*entry);
  auto built = Build({*entry}, /*record_times=*/false);
  if (control_ == ModelControlMode::kPoll) fingerprints_[name] = fingerprint;
  if (!built.ok()) {
    absl::MutexLock l(&mu_);
    if (!models_.count(name)) unavailable_[name] = std::string(built.status().message());
    return built.status();
  }
  std::vector<std::string> versions;
  for (const auto& [v, s] : (*built)[0]) versions.insert(versions.begin(), std::to_string(v));
  VersionSet old = Publish(name, std::move((*built)[0]));
  const bool reloaded = !old.empty();
  Retire(old);
  if (log_) {
    log_(name, absl::StrCat(reloaded ? "reloaded" : "loaded", ", version(s) ", absl::StrJoin(versions, ", ")));
  }
  return absl::OkStatus();
}

absl::Status InferenceServer::UnloadModel(const std::string& name) {
  if (absl::Status e = RequireExplicitControl(); !e.ok()) return e;
  std::lock_guard<std::mutex> g(control_mu_);
  return UnloadLocked(name, "unloaded");
}

absl::Status InferenceServer::UnloadLocked(const std::string& name, const std::string& reason) {
  VersionSet old;
  {
    absl::MutexLock l(&mu_);
    auto it = models_.find(name);
    if (it == models_.end()) {
      // Unloading twice is not an error; unloading a name nobody knows is.
      if (unavailable_.count(name)) return absl::OkStatus();
      return absl::NotFoundError(absl::StrCat("unknown model ", Quoted(name), "; nothing to unload"));
    }
    old = std::move(it->second);
    models_.erase(it);
    unavailable_[name] = reason;
  }
  Retire(old);
  if (log_) log_(name, reason);
  return absl::OkStatus();
}

std::vector<ModelIndexEntry> InferenceServer::RepositoryIndex(bool ready_only) const {
  std::set<std::string> names;
  if (!options_.repository.empty()) {
    if (auto listed = ListModelFolders(options_.repository); listed.ok()) names.insert(listed->begin(), listed->end());
  }
  absl::ReaderMutexLock l(&mu_);
  for (const auto& [n, v] : models_) names.insert(n);
  for (const auto& [n, r] : unavailable_) names.insert(n);
  std::vector<ModelIndexEntry> out;
  for (const std::string& n : names) {
    if (auto it = models_.find(n); it != models_.end()) {
      for (auto v = it->second.rbegin(); v != it->second.rend(); ++v)
        out.push_back({n, std::to_string(v->first), "READY", ""});
    } else if (ready_only) {
      continue;
    } else if (auto u = unavailable_.find(n); u != unavailable_.end()) {
      out.push_back({n, "", "UNAVAILABLE", u->second});
    } else {
      out.push_back({n, "", "", ""});
    }
  }
  return out;
}

absl::Status InferenceServer::PollRepository() {
  std::lock_guard<std::mutex> g(control_mu_);
  if (draining_) return absl::OkStatus();
  auto listed = ListModelFolders(options_.repository);
  if (!listed.ok()) return listed.status();
  const std::set<std::string> present(listed->begin(), listed->end());
  std::set<std::string> known;
  for (const auto& [n, fp] : fingerprints_) known.insert(n);
  {
    absl::ReaderMutexLock l(&mu_);
    for (const auto& [n, v] : models_) known.insert(n);
  }
  for (const std::string& n : known) {
    if (present.count(n)) continue;
    (void)UnloadLocked(n, "removed from the repository");
    fingerprints_.erase(n);
    absl::MutexLock l(&mu_);
    unavailable_.erase(n);
  }
  absl::Status first;
  for (const std::string& n : *listed) {
    auto it = fingerprints_.find(n);
    if (it != fingerprints_.end() && it->second == ModelFolderFingerprint(options_.repository + "/" + n)) continue;
    absl::Status st = LoadLocked(n);
    if (!st.ok() && log_) log_(n, absl::StrCat("load failed: ", st.ToString()));
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

std::shared_ptr<InferenceServer::Served> InferenceServer::LookupLocked(const std::string& name,
                                                                      const std::string& version,
                                                                      absl::Status* error) const {
  auto it = models_.find(name);
  if (it == models_.end() || it->second.empty()) {
    if (auto u = unavailable_.find(name); u != unavailable_.end()) {
      *error = absl::UnavailableError(absl::StrCat("model ", Quoted(name), " is not loaded (", u->second, ")"));
      return nullptr;
    }
    std::vector<std::string> names;
    for (const auto& [n, s] : models_) names.push_back(n);
    *error = absl::NotFoundError(absl::StrCat("unknown model ", Quoted(name), "; this server serves ",
                                              names.empty() ? "no model" : absl::StrJoin(names, ", ")));
    return nullptr;
  }
  if (version.empty()) return it->second.begin()->second;  // the latest
  int64_t v = 0;
  auto found = absl::SimpleAtoi(version, &v) ? it->second.find(v) : it->second.end();
  if (found == it->second.end()) {
    std::vector<std::string> have;
    for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) have.push_back(std::to_string(r->first));
    *error = absl::NotFoundError(absl::StrCat("model ", Quoted(name), " has no version ", Quoted(version),
                                              "; it serves version", have.size() > 1 ? "s " : " ",
                                              absl::StrJoin(have, ", ")));
    return nullptr;
  }
  return found->second;
}

std::shared_ptr<const Model> InferenceServer::FindModel(const std::string& name, const std::string& version,
                                                        absl::Status* error) const {
  absl::Status ignored;
  absl::ReaderMutexLock l(&mu_);
  std::shared_ptr<Served> s = LookupLocked(name, version, error ? error : &ignored);
  if (!s) return nullptr;
  return std::shared_ptr<const Model>(s, s->model.get());
}

std::vector<int64_t> InferenceServer::Versions(const std::string& name) const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<int64_t> out;
  if (auto it = models_.find(name); it != models_.end())
    for (auto r = it->second.rbegin(); r != it->second.rend(); ++r) out.push_back(r->first);
  return out;
}

std::vector<std::shared_ptr<const Model>> InferenceServer::models() const {
  std::vector<std::shared_ptr<const Model>> out;
  for (const auto& s : Snapshot()) out.push_back(std::shared_ptr<const Model>(s, s->model.get()));
  return out;
}

void InferenceServer::FillStatistics(const std::string& name, inference::ModelStatisticsResponse* out) const {
  absl::ReaderMutexLock l(&mu_);
  for (const auto& [n, versions] : models_) {
    if (!name.empty() && n != name) continue;
    for (auto r = versions.rbegin(); r != versions.rend(); ++r) {
      auto* m = out->add_model_stats();
      m->set_name(n);
      m->set_version(std::to_string(r->first));
      r->second->stats->Fill(m);
    }
  }
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
  bool known;
  {
    absl::ReaderMutexLock l(&mu_);
    known = models_.count(model) > 0;
  }
  metrics_.CountRequest(known ? model : "(unknown)", CodeName(code));
}

void InferenceServer::Infer(const inference::ModelInferRequest& request, RawContents raw,
                            std::optional<Clock::time_point> deadline, std::function<bool()> cancelled, Done done) {
  const auto start = Clock::now();
  std::shared_ptr<Served> sp;
  absl::Status refused;  // answered once mu_ is released, so that `done` may call back in
  std::string label;     // the metrics label of a request for no served model
  Finish finish;
  {
    // Held until the request is admitted into its model's queue (see mu_).
    absl::ReaderMutexLock l(&mu_);
    sp = LookupLocked(request.model_name(), request.model_version(), &refused);
    if (!sp) {
      const bool known = refused.code() != absl::StatusCode::kNotFound || models_.count(request.model_name());
      label = known ? request.model_name() : request.model_name().empty() ? "(none)" : "(unknown)";
    } else {
      finish = [this, sp, start, deadline, cancelled](const absl::Status& status, Work* work, uint64_t queue_ns,
                                                      uint64_t compute_ns, const Done& done) {
        Served& s = *sp;
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
          s.stats->RecordSuccess(
              total_ns, queue_ns,
              ModelStats::Compute::Split(compute_ns, work ? work->input_ns : 0, work ? work->output_ns : 0));
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
      sp->metrics->inflight->Increment();
      refused = Admit(*sp, request, std::move(raw), deadline, std::move(cancelled), finish, done);
    }
  }
  if (!sp) {
    metrics_.CountRequest(label, CodeName(refused.code()));
    done(refused, nullptr);
  } else if (!refused.ok()) {
    finish(refused, nullptr, 0, 0, done);
  }
}

absl::Status InferenceServer::Admit(Served& s, const inference::ModelInferRequest& request, RawContents raw,
                                    std::optional<Clock::time_point> deadline, std::function<bool()> cancelled,
                                    const Finish& finish, const Done& done) {
  if (draining_) return absl::UnavailableError("server is shutting down");
  if (request.id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request id is ", request.id().size(), " bytes; the limit is ",
                                                   kMaxRequestIdBytes));
  }
  auto work = s.model->Prepare(request, RequestBytes{std::move(raw), shared_memory_});
  if (!work.ok()) return work.status();
  if (absl::Status bound = BindSharedMemoryOutputs(request, shared_memory_, **work); !bound.ok()) {
    s.model->Drop(**work, bound);
    return bound;
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
    return too_big;
  }
  auto p = std::make_unique<Pending>();
  p->work = std::move(*work);
  p->work->model_version = s.version;
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
      return bad;
    }
    if (key == "priority") p->priority = uint64_t(n);
    else if (n > 0) p->timeout = std::chrono::microseconds(n);
  }
  p->done = [finish, done](Pending& p, const absl::Status& st) { finish(st, p.work.get(), p.queue_ns, p.compute_ns, done); };
  return s.scheduler->Enqueue(std::move(p));  // a refusal has dropped the work
}

}  // namespace flashq::server
