// Builds a Model from a repository entry according to its `kind` parameter.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/backends/backend.h"
#include "server/core/model.h"
#include "server/repository/checkpoint.h"
#include "server/repository/model_repository.h"

namespace flashq::server {

struct ModelLoadOptions {
  int64_t kv_cache_blocks = 0;  // > 0 overrides kv_attention's num_blocks (--kv-cache-blocks)
  // Maps each checkpoint file once for all the models that read it; it must outlive the
  // CreateModel calls. Null: each call maps what it reads for itself.
  CheckpointCache* checkpoints = nullptr;
  // Told, one line at a time, what loading a model detected or overrode (a checkpoint's
  // zero-point convention, a parameter overriding its metadata). May be called from
  // several threads at once. Null: not reported.
  std::function<void(const std::string& model, const std::string& line)> log;
};

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelEntry& entry, Backend& backend,
                                                   const ModelLoadOptions& options);

}  // namespace flashq::server
