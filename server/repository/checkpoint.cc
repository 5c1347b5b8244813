// Checkpoint folders. Which file holds a tensor:
//   model.safetensors.index.json (transformers' sharded save): {"metadata": {...},
//     "weight_map": {"<tensor>": "<file in the folder>", ...}};
//   otherwise one file: model.safetensors, AutoGPTQ's <model_file_base_name>.safetensors
//   (quantize_config.json), or the folder's only *.safetensors file.
#include "server/repository/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

absl::Status ReadIndex(const fs::path& dir, std::map<std::string, std::string>* index) {
  const fs::path path = dir / kIndexName;
  auto text = ReadText(path);
  if (!text.ok()) return text.status();
  auto doc = ParseJson(*text);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", what));
  };
  if (!doc.ok()) return bad(std::string(doc.status().message()));
  const JsonValue* map = doc->Find("weight_map");
  if (!map || !map->is_object()) return bad("no \"weight_map\" object");
  for (const auto& [tensor, file] : map->as_object()) {
    if (!file.is_string()) return bad(absl::StrCat("weight_map[\"", tensor, "\"] is not a file name"));
    const std::string& name = file.as_string();
    // Shards sit next to the index; a path would let a checkpoint read files outside it.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return bad(absl::StrCat("weight_map[\"", tensor, "\"] is '", name, "', not a file name in the folder"));
    if (!index->emplace(tensor, (dir / name).string()).second)
      return bad(absl::StrCat("weight_map names tensor '", tensor, "' twice"));
  }
  if (index->empty()) return bad("weight_map is empty");
  return absl::OkStatus();
}

// The single file of a folder without an index.
absl::StatusOr<std::string> SingleFile(const fs::path& dir, const std::string& base_name) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "model.safetensors", ec)) return (dir / "model.safetensors").string();
  if (!base_name.empty() && fs::is_regular_file(dir / (base_name + ".safetensors"), ec))
    return (dir / (base_name + ".safetensors")).string();
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors") found.push_back(it->path().filename().string());
  std::sort(found.begin(), found.end());
  if (found.size() == 1) return (dir / found[0]).string();
  if (found.empty())
    return absl::NotFoundError(absl::StrCat("checkpoint folder ", dir.string(), " holds neither ", kIndexName,
                                            " nor a .safetensors file"));
  return absl::InvalidArgumentError(absl::StrCat("checkpoint folder ", dir.string(), " holds ", found.size(),
                                                 " .safetensors files (", absl::StrJoin(found, ", "), ") but no ",
                                                 kIndexName, " saying which holds what"));
}

// AutoGPTQ names its weights file in quantize_config.json.
std::string ModelFileBaseName(const fs::path& dir) {
  auto text = ReadText(dir / "quantize_config.json");
  if (!text.ok()) return "";
  auto doc = ParseJson(*text);
  if (!doc.ok()) return "";
  const JsonValue* v = doc->Find("model_file_base_name");
  return v && v->is_string() ? v->as_string() : "";
}

}  // namespace

absl::StatusOr<std::string> Checkpoint::FileOf(const std::string& name) const {
  if (!single_file_.empty()) return single_file_;
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor '", name, "' (", kIndexName,
                                            " lists ", index_.size(), " tensors)"));
  }
  return it->second;
}

absl::StatusOr<bool> Checkpoint::Has(const std::string& name) const {
  if (single_file_.empty()) return index_.count(name) > 0;
  auto file = cache_->OpenFile(single_file_);
  if (!file.ok()) return file.status();
  return (*file)->tensors().count(name) > 0;
}

absl::StatusOr<SafeTensor> Checkpoint::Get(const std::string& name) const {
  auto path = FileOf(name);
  if (!path.ok()) return path.status();
  auto file = cache_->OpenFile(*path);
  if (!file.ok()) return file.status();
  auto it = (*file)->tensors().find(name);
  if (it == (*file)->tensors().end()) {
    if (!single_file_.empty())
      return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor '", name, "'"));
    return absl::InvalidArgumentError(absl::StrCat(kIndexName, " of ", path_, " places tensor '", name, "' in ", *path,
                                                   ", which does not hold it"));
  }
  return it->second;
}

std::vector<std::string> Checkpoint::files() const {
  if (!single_file_.empty()) return {single_file_};
  std::vector<std::string> out;
  for (const auto& [t, f] : index_) out.push_back(f);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<std::shared_ptr<const Checkpoint>> CheckpointCache::Load(const std::string& path, bool with_metadata) {
  std::error_code ec;
  const fs::path p(path);
  std::shared_ptr<Checkpoint> c(new Checkpoint());
  c->cache_ = this;
  c->path_ = path;
  if (fs::is_regular_file(p, ec)) {
    // One file: its folder's metadata applies (a bare file next to a config.json).
    c->single_file_ = path;
    if (!with_metadata) return std::shared_ptr<const Checkpoint>(std::move(c));
    auto q = ReadQuantMetadata(p.parent_path().string());
    if (!q.ok()) return q.status();
    c->quant_ = *std::move(q);
    return std::shared_ptr<const Checkpoint>(std::move(c));
  }
  if (!fs::is_directory(p, ec)) return absl::NotFoundError(absl::StrCat("checkpoint ", path, " does not exist"));
  if (fs::is_regular_file(p / kIndexName, ec)) {
    if (auto s = ReadIndex(p, &c->index_); !s.ok()) return s;
  } else {
    auto f = SingleFile(p, ModelFileBaseName(p));
    if (!f.ok()) return f.status();
    c->single_file_ = *f;
  }
  if (!with_metadata) return std::shared_ptr<const Checkpoint>(std::move(c));
  auto q = ReadQuantMetadata(path);
  if (!q.ok()) return q.status();
  c->quant_ = *std::move(q);
  return std::shared_ptr<const Checkpoint>(std::move(c));
}

absl::StatusOr<std::shared_ptr<const Checkpoint>> CheckpointCache::Open(const std::string& path, bool with_metadata) {
  std::error_code ec;
  fs::path key = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) key = fs::path(path);
  std::shared_ptr<Slot<Checkpoint>> slot;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& s = checkpoints_[std::make_pair(key.string(), with_metadata)];
    if (!s) s = std::make_shared<Slot<Checkpoint>>();
    slot = s;
  }
  std::lock_guard<std::mutex> l(slot->mu);  // a second opener waits for the first
  if (!slot->done) {
    slot->value = Load(key.string(), with_metadata);
    slot->done = true;
  }
  return slot->value;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> CheckpointCache::OpenFile(const std::string& path) {
  std::shared_ptr<Slot<SafetensorsFile>> slot;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto& s = files_[path];
    if (!s) s = std::make_shared<Slot<SafetensorsFile>>();
    slot = s;
  }
  std::lock_guard<std::mutex> l(slot->mu);
  if (!slot->done) {
    auto f = SafetensorsFile::Open(path);
    if (f.ok()) {
      slot->value = std::shared_ptr<const SafetensorsFile>(std::move(*f));
      std::lock_guard<std::mutex> g(mu_);
      ++files_mapped_;
    } else {
      slot->value = f.status();
    }
    slot->done = true;
  }
  return slot->value;
}

int CheckpointCache::files_mapped() const {
  std::lock_guard<std::mutex> l(mu_);
  return files_mapped_;
}

}  // namespace flashq::server
