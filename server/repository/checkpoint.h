// A Hugging Face checkpoint as linear models read it: a folder holding sharded
// safetensors files with model.safetensors.index.json (or one model.safetensors) and
// its quantization metadata, or one .safetensors file.
//
// Files are memory-mapped once and shared: the CheckpointCache that opens checkpoints
// is owned by whoever loads a repository, lives for the load, and hands every model the
// same Checkpoint and the same mapping of each shard, however many models read it. A
// shard is mapped the first time one of its tensors is asked for. The cache is
// thread-safe, so models load in parallel; no state outlives it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/repository/quant_metadata.h"
#include "server/repository/safetensors.h"

namespace flashq::server {

class CheckpointCache;

class Checkpoint {
 public:
  const std::string& path() const { return path_; }
  const QuantMetadata& quant() const { return quant_; }
  // Whether the checkpoint holds `name` (maps the single file if it is not yet).
  absl::StatusOr<bool> Has(const std::string& name) const;
  // The tensor (a view into its shard's mapping, valid while the cache lives). NOT_FOUND
  // names the tensor and the checkpoint; a shard that the index names but that does not
  // hold the tensor is INVALID_ARGUMENT naming both.
  absl::StatusOr<SafeTensor> Get(const std::string& name) const;
  // The files the checkpoint's tensors live in (one for a single-file checkpoint).
  std::vector<std::string> files() const;

 private:
  friend class CheckpointCache;
  Checkpoint() = default;
  // The file that holds `name` per the index; the single file when there is no index.
  absl::StatusOr<std::string> FileOf(const std::string& name) const;

  CheckpointCache* cache_ = nullptr;
  std::string path_;                          // the folder, or the single file
  std::string single_file_;                   // set when there is no index
  std::map<std::string, std::string> index_;  // tensor -> absolute file path
  QuantMetadata quant_;
};

class CheckpointCache {
 public:
  CheckpointCache() = default;
  CheckpointCache(const CheckpointCache&) = delete;
  CheckpointCache& operator=(const CheckpointCache&) = delete;

  // `path`: a folder or a .safetensors file. Reads the index and, with_metadata, the
  // quantization metadata (not the shards). The same path (after resolving symlinks) gives
  // the same Checkpoint.
  absl::StatusOr<std::shared_ptr<const Checkpoint>> Open(const std::string& path, bool with_metadata = true);
  // One mapping per file for the cache's lifetime.
  absl::StatusOr<std::shared_ptr<const SafetensorsFile>> OpenFile(const std::string& path);
  // Files mapped so far (tests: each shard is mapped once however many models read it).
  int files_mapped() const;

 private:
  template <typename T>
  struct Slot {
    std::mutex mu;
    bool done = false;
    absl::StatusOr<std::shared_ptr<const T>> value = absl::UnknownError("not opened");
  };
  absl::StatusOr<std::shared_ptr<const Checkpoint>> Load(const std::string& path, bool with_metadata);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, bool>, std::shared_ptr<Slot<Checkpoint>>> checkpoints_;  // (path, with_metadata)
  std::map<std::string, std::shared_ptr<Slot<SafetensorsFile>>> files_;
  int files_mapped_ = 0;
};

}  // namespace flashq::server
