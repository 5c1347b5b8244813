// A model's versions: numbered sub-folders of its folder (`1/`, `2/`, ...) that hold
// the model's files, filtered by the config's version_policy (Triton's rules: default
// the latest one). A folder without numbered sub-folders is version 1, with its files
// in the model folder itself, so that repositories without version folders keep working.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/repository/model_repository.h"

namespace flashq::server {

struct ModelVersion {
  int64_t version = 1;
  ModelEntry entry;  // config of the model; dir is the version's folder
};

// The versions `entry`'s version_policy serves, in ascending order. Errors name the
// model and what is missing (no version folder, a specific version without a folder).
absl::StatusOr<std::vector<ModelVersion>> ServedVersions(const ModelEntry& entry);

// Names of the repository's model folders (sub-folders holding a config.pbtxt, hidden
// ones skipped), sorted. An empty repository is not an error here.
absl::StatusOr<std::vector<std::string>> ListModelFolders(const std::string& root);

// Reads `root`/`name`/config.pbtxt into an entry (ParseModelConfigFile's checks).
absl::StatusOr<ModelEntry> ReadModelEntry(const std::string& root, const std::string& name);

// A fingerprint of a model folder: the names of its sub-folders and the names, sizes
// and modification times of every file under it (the config included). Two equal fingerprints mean nothing to reload.
std::string ModelFolderFingerprint(const std::string& dir);

}  // namespace flashq::server
