// The models, their schedulers and the request path between the frontend and the
// backends: decode and validate, admit into the model's bounded queue, answer
// exactly once, and record metrics at every stage.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/backend.h"
#include "server/batcher/scheduler.h"
#include "server/core/model.h"
#include "server/core/model_stats.h"
#include "server/core/shared_memory.h"
#include "server/metrics/metrics.h"
#include "server/models/model_factory.h"

namespace flashq::server {

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
  // The largest response the frontend can send (its message limit); a request whose
  // outputs would not fit is refused before compute. 0: no limit.
  int64_t max_response_bytes = 0;
  // Where tensors that name a shared-memory region are read and written; it must outlive
  // the server. Null: such tensors are refused (UNIMPLEMENTED).
  const SharedMemoryRegistry* shared_memory = nullptr;
  ModelLoadOptions load;
  // Threads that load models in parallel; 0: the machine's cores, at most 8.
  int load_threads = 0;
};

// A model's queue and workers: its config (dynamic_batching and its queue policy,
// instance_group, the queue parameters) under the server's overrides. `devices` is the
// number of GPUs (1 on CPU), which an instance_group without `gpus` places count on each.
absl::StatusOr<SchedulerOptions> SchedulerOptionsFor(const inference::ModelConfig& c, const InferenceServerOptions& o,
                                                     int devices);

// Each model serves one version, "1"; an empty version means the latest. NOT_FOUND
// naming the model and the version for any other.
absl::Status CheckModelVersion(const std::string& model, const std::string& version);

class InferenceServer {
 public:
  // Loads every model; fails if any fails (naming it).
  static absl::StatusOr<std::unique_ptr<InferenceServer>> Create(const std::vector<ModelEntry>& entries,
                                                                 Backend& backend, ServerMetrics& metrics,
                                                                 const InferenceServerOptions& options);
  ~InferenceServer();

  // Called exactly once per request: with the finished work, or with an error (work may be null).
  using Done = std::function<void(const absl::Status&, Work* work)>;
  void Infer(const inference::ModelInferRequest& request, std::optional<Clock::time_point> deadline,
             std::function<bool()> cancelled, Done done);

  // Counts a request the frontend refused before Infer (e.g. UNAUTHENTICATED) in
  // flashq_requests_total, under its model if that model is served.
  void CountRejected(const std::string& model, absl::StatusCode code);
  const Model* FindModel(const std::string& name) const;
  std::vector<const Model*> models() const;
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
    std::unique_ptr<Model> model;
    std::unique_ptr<ModelStats> stats;
    ServerMetrics::Model* metrics = nullptr;
    std::unique_ptr<Scheduler> scheduler;
  };
  InferenceServer(ServerMetrics& metrics, int64_t max_response_bytes, const SharedMemoryRegistry* shared_memory)
      : metrics_(metrics), max_response_bytes_(max_response_bytes), shared_memory_(shared_memory) {}
  void Housekeeping();
  static void UpdateKvGauges(Served& s);

  // A request that failed through the server's own fault (INTERNAL, UNKNOWN, DATA_LOSS):
  // logged, the first ones and then one in a thousand, so that operators see it.
  void LogFault(const std::string& model, const absl::Status& status);

  ServerMetrics& metrics_;
  const int64_t max_response_bytes_;
  std::function<void(const std::string& model, const std::string& line)> log_;
  std::atomic<uint64_t> faults_{0};
  const SharedMemoryRegistry* const shared_memory_;
  double weights_seconds_ = 0;
  std::vector<std::pair<std::string, double>> load_seconds_;
  std::map<std::string, Served> models_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_housekeeping_{false};
  std::thread housekeeping_;
};

}  // namespace flashq::server
