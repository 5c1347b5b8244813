// Builds a Model from a repository entry according to its `kind` parameter.
#pragma once

#include <memory>

#include "server/backends/backend.h"
#include "server/core/model.h"
#include "server/repository/model_repository.h"

namespace flashq::server {

struct ModelLoadOptions {
  int64_t kv_cache_blocks = 0;  // > 0 overrides kv_attention's num_blocks (--kv-cache-blocks)
};

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelEntry& entry, Backend& backend,
                                                   const ModelLoadOptions& options);

}  // namespace flashq::server
