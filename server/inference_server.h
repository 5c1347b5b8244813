// The models, their schedulers and the request path between the frontend and the
// backends: decode and validate, admit into the model's bounded queue, answer
// exactly once, and record metrics at every stage.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/backends/backend.h"
#include "server/batcher/responder.h"
#include "server/batcher/scheduler.h"
#include "server/core/model.h"
#include "server/core/model_stats.h"
#include "server/core/shared_memory.h"
#include "server/metrics/metrics.h"
#include "server/models/model_factory.h"
#include "server/repository/model_versions.h"

namespace flashq::server {

// Triton's --model-control-mode. none: every model of the repository loads at start-up
// and the set never changes. explicit: models load and unload on request
// (RepositoryModelLoad/Unload). poll: the repository is rescanned periodically; new and
// changed models load, removed ones unload.
enum class ModelControlMode { kNone, kExplicit, kPoll };
absl::StatusOr<ModelControlMode> ParseModelControlMode(const std::string& s);

struct InferenceServerOptions {
  // Overrides of the models' config (unset: each model's own setting).
  std::optional<int64_t> max_queue_size;
  std::optional<int64_t> max_queue_delay_us;
  std::optional<int64_t> max_batch_tokens;
  int workers_per_model = 1;
  // True: workers_per_model was given (--workers-per-model) and overrides the models'
  // instance_group counts. False: a model with instance_group gets the workers it asks for.
  bool workers_per_model_from_flag = false;
  int64_t idle_spin_us = 0;  // SchedulerOptions::idle_spin
  // Threads that send the answers of a batch beyond its first few, shared by all models
  // (ResponderPool); 0: each batch worker answers its whole batch.
  int response_threads = 0;
  // The largest response the frontend can send (its message limit); a request whose
  // outputs would not fit is refused before compute. 0: no limit.
  int64_t max_response_bytes = 0;
  // Where tensors that name a shared-memory region are read and written; it must outlive
  // the server. Null: such tensors are refused (UNIMPLEMENTED).
  const SharedMemoryRegistry* shared_memory = nullptr;
  ModelLoadOptions load;
  // Threads that load models in parallel; 0: the machine's cores, at most 8.
  int load_threads = 0;
  // The repository that LoadModel and the index read (empty: none; loads are refused).
  std::string repository;
  ModelControlMode control = ModelControlMode::kNone;
  // poll: seconds between rescans of the repository.
  double poll_seconds = 15;
  // Applied to every entry read from the repository before it loads (server-wide
  // parameters such as request size limits).
  std::function<void(ModelEntry&)> adjust_entry;
};

// One row of the repository index (Triton's RepositoryIndex).
struct ModelIndexEntry {
  std::string name, version, state, reason;  // state: READY, UNAVAILABLE or "" (never loaded)
};

// A model's queue and workers: its config (dynamic_batching and its queue policy,
// instance_group, the queue parameters) under the server's overrides. `devices` is the
// number of GPUs (1 on CPU), which an instance_group without `gpus` places count on each.
absl::StatusOr<SchedulerOptions> SchedulerOptionsFor(const inference::ModelConfig& c, const InferenceServerOptions& o,
                                                     int devices);

// Models are served through shared references: a request holds its model for its
// lifetime, so an unload or a reload never pulls a model from under a request. Unloading
// removes the model from the served set (new requests get UNAVAILABLE), answers every
// request already admitted, stops its workers, then destroys it, which frees its
// weights and KV cache (backend memory owned by the model). Loading builds and warms up
// the new model fully before it is published; a reload swaps atomically, and a failed
// reload leaves the old model serving.
class InferenceServer {
 public:
  // Loads every entry (each of its versions, per version_policy); fails if any fails
  // (naming it).
  static absl::StatusOr<std::unique_ptr<InferenceServer>> Create(const std::vector<ModelEntry>& entries,
                                                                 Backend& backend, ServerMetrics& metrics,
                                                                 const InferenceServerOptions& options);
  ~InferenceServer();

  // Called exactly once per request: with the finished work, or with an error (work may be
  // null); on the calling thread or a worker, never under the server's locks.
  using Done = std::function<void(const absl::Status&, Work* work)>;
  // `raw`: the request's raw_input_contents when they stayed in the transport's buffers
  // (RequestBytes::raw); they, like `request`, must outlive the call to `done`.
  void Infer(const inference::ModelInferRequest& request, RawContents raw, std::optional<Clock::time_point> deadline,
             std::function<bool()> cancelled, Done done);

  // Counts a request the frontend refused before Infer (e.g. UNAUTHENTICATED) in
  // flashq_requests_total, under its model if that model is served.
  void CountRejected(const std::string& model, absl::StatusCode code);
  // The served model `name` at `version` (empty: the latest served). Null with `error`
  // set: NOT_FOUND for an unknown model or version (naming the served versions),
  // UNAVAILABLE for a model that is not loaded.
  std::shared_ptr<const Model> FindModel(const std::string& name, const std::string& version,
                                         absl::Status* error = nullptr) const;
  // Served versions of `name`, ascending (empty if not served).
  std::vector<int64_t> Versions(const std::string& name) const;
  // Every served model version.
  std::vector<std::shared_ptr<const Model>> models() const;

  // Model control (explicit mode; FAILED_PRECONDITION in the others). Both block for
  // seconds (weights, warm-up, draining): call them from a thread that may wait. Loads
  // and unloads run one at a time. LoadModel reads the model's folder from the
  // repository, loads and warms up its versions, then publishes them (replacing a loaded
  // model's versions at once). Errors name the model and the cause; the models already
  // served are untouched.
  absl::Status LoadModel(const std::string& name);
  // Stops admitting requests to `name`, answers those admitted, then destroys the model
  // (returning once it is, after at most a short wait for transient holders). OK if it
  // is already unloaded; NOT_FOUND for a name the server does not know.
  absl::Status UnloadModel(const std::string& name);
  // Every model of the repository (and any served model no longer in it), by name and
  // version, with its state. ready_only: only the served ones.
  std::vector<ModelIndexEntry> RepositoryIndex(bool ready_only) const;
  // poll mode: loads new and changed models, unloads removed ones. Called by the poll
  // thread; public for tests. Returns the first load error (the others still apply).
  absl::Status PollRepository();
  ModelControlMode control_mode() const { return control_; }
  void FillStatistics(const std::string& name, inference::ModelStatisticsResponse* out) const;
  // Wall-clock seconds from the start of loading until the last linear layer's weights were
  // read, unpacked, repacked and uploaded (models load in parallel).
  double weights_seconds() const { return weights_seconds_; }
  // Per model, in repository order: seconds to load its weights (if any), build and warm it up.
  const std::vector<std::pair<std::string, double>>& load_seconds() const { return load_seconds_; }
  // Stops admitting (UNAVAILABLE), runs everything queued, stops the schedulers.
  void Drain();

 private:
  struct Served {
    int64_t version = 1;
    std::unique_ptr<Model> model;
    std::unique_ptr<ModelStats> stats;
    ServerMetrics::Model* metrics = nullptr;
    std::unique_ptr<Scheduler> scheduler;
  };
  // A model's served versions, highest first.
  using VersionSet = std::map<int64_t, std::shared_ptr<Served>, std::greater<>>;
  InferenceServer(Backend& backend, ServerMetrics& metrics, const InferenceServerOptions& options)
      : backend_(backend), metrics_(metrics), options_(options), max_response_bytes_(options.max_response_bytes),
        shared_memory_(options.shared_memory), control_(options.control),
        responders_(options.response_threads > 0 ? std::make_unique<ResponderPool>(options.response_threads)
                                                  : nullptr) {}
  // Builds (loads and warms up) every version of every entry, in parallel.
  absl::StatusOr<std::vector<VersionSet>> Build(const std::vector<ModelEntry>& entries, bool record_times);
  absl::StatusOr<std::shared_ptr<Served>> Wrap(const ModelEntry& entry, int64_t version, std::unique_ptr<Model> model);
  // Publishes `versions` as `name`'s served set; returns the set it replaced.
  VersionSet Publish(const std::string& name, VersionSet versions);
  using Finish = std::function<void(const absl::Status&, Work*, uint64_t queue_ns, uint64_t compute_ns, const Done&)>;
  // Prepares a request and admits it into `s`'s queue, under mu_ (shared). An error:
  // nothing was admitted, and the caller answers it.
  absl::Status Admit(Served& s, const inference::ModelInferRequest& request, RawContents raw,
                     std::optional<Clock::time_point> deadline,
                     std::function<bool()> cancelled, const Finish& finish, const Done& done)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Drains versions taken out of the served set and destroys them.
  void Retire(VersionSet& versions);
  // FAILED_PRECONDITION naming the mode, unless models load and unload on request.
  absl::Status RequireExplicitControl() const;
  absl::Status LoadLocked(const std::string& name);
  absl::Status UnloadLocked(const std::string& name, const std::string& reason);
  std::vector<std::shared_ptr<Served>> Snapshot() const;
  std::shared_ptr<Served> LookupLocked(const std::string& name, const std::string& version, absl::Status* error) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Housekeeping();
  void Poll();
  static void UpdateKvGauges(Served& s);

  // A request that failed through the server's own fault (INTERNAL, UNKNOWN, DATA_LOSS):
  // logged, the first ones and then one in a thousand, so that operators see it.
  void LogFault(const std::string& model, const absl::Status& status);

  Backend& backend_;
  ServerMetrics& metrics_;
  const InferenceServerOptions options_;
  const int64_t max_response_bytes_;
  std::function<void(const std::string& model, const std::string& line)> log_;
  std::atomic<uint64_t> faults_{0};
  const SharedMemoryRegistry* const shared_memory_;
  double weights_seconds_ = 0;
  std::vector<std::pair<std::string, double>> load_seconds_;
  const ModelControlMode control_;
  // --response-threads > 0 only; declared before the models, so that it outlives their schedulers.
  const std::unique_ptr<ResponderPool> responders_;
  // Requests hold mu_ shared from the model look-up until their admission into its
  // queue, so that once a writer has replaced or removed a model no request can still
  // enter the old one's queue; its drain then answers everything it admitted.
  mutable absl::Mutex mu_;
  std::map<std::string, VersionSet> models_ ABSL_GUARDED_BY(mu_);
  // Models known but not served: the reason (unloaded, or the load error).
  std::map<std::string, std::string> unavailable_ ABSL_GUARDED_BY(mu_);
  // Serializes loads, unloads and polls (a model is built outside mu_).
  std::mutex control_mu_;
  std::map<std::string, std::string> fingerprints_;  // poll mode, under control_mu_
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_housekeeping_{false};
  std::thread housekeeping_;
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  std::thread poll_;
};

}  // namespace flashq::server
