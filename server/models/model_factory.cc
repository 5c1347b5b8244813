#include "server/models/model_factory.h"

#include "absl/strings/str_cat.h"
#include "server/models/attention_model.h"
#include "server/models/kv_attention_model.h"
#include "server/models/linear_model.h"

namespace flashq::server {

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelEntry& entry, Backend& backend,
                                                   const ModelLoadOptions& options) {
  const std::string kind = ConfigParam(entry.config, "kind", "");
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (kind == "attention") {
    model = AttentionModel::Create(entry.config, backend);
  } else if (kind == "kv_attention") {
    model = KvAttentionModel::Create(entry.config, backend, options.kv_cache_blocks);
  } else if (kind == "linear") {
    model = LinearModel::Create(entry.config, entry.dir, backend);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("model '", entry.config.name(), "' (", entry.dir,
                                                   "): parameter 'kind' is '", kind,
                                                   "'; expected attention, kv_attention or linear"));
  }
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("loading model '", entry.config.name(), "': ", model.status().message()));
  }
  return model;
}

}  // namespace flashq::server
