#include "server/repository/model_versions.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

bool IsVersionName(const std::string& s, int64_t* v) {
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  return absl::SimpleAtoi(s, v) && *v > 0;
}

}  // namespace

absl::StatusOr<std::vector<ModelVersion>> ServedVersions(const ModelEntry& entry) {
  std::error_code ec;
  std::set<int64_t> present;
  for (fs::directory_iterator it(entry.dir, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t v = 0;
    if (it->is_directory(ec) && IsVersionName(it->path().filename().string(), &v)) present.insert(v);
  }
  // A folder that cannot be listed (or does not exist: a model that reads no files, or
  // whose checkpoint lives elsewhere) has no version folders; loading reports missing files.
  const std::string& name = entry.config.name();
  const auto& policy = entry.config.version_policy();
  auto make = [&](int64_t v, bool in_folder) {
    ModelVersion mv;
    mv.version = v;
    mv.entry = entry;
    if (in_folder) mv.entry.dir = (fs::path(entry.dir) / std::to_string(v)).string();
    return mv;
  };
  std::vector<ModelVersion> out;
  if (present.empty()) {
    // No version folders: the folder itself is version 1.
    if (policy.has_specific() &&
        std::any_of(policy.specific().versions().begin(), policy.specific().versions().end(),
                    [](int64_t v) { return v != 1; })) {
      return absl::NotFoundError(absl::StrCat("model '", name,
                                              "': version_policy names versions other than 1, but the folder has no "
                                              "numbered version folders"));
    }
    out.push_back(make(1, false));
    return out;
  }
  std::vector<int64_t> chosen;
  if (policy.has_all()) {
    chosen.assign(present.begin(), present.end());
  } else if (policy.has_specific()) {
    for (int64_t v : policy.specific().versions()) {
      if (!present.count(v)) {
        std::vector<std::string> have;
        for (int64_t p : present) have.push_back(std::to_string(p));
        return absl::NotFoundError(absl::StrCat("model '", name, "': version_policy names version ", v,
                                                ", which has no folder (versions present: ", absl::StrJoin(have, ", "),
                                                ")"));
      }
      chosen.push_back(v);
    }
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  } else {
    const int64_t n = policy.has_latest() ? int64_t(policy.latest().num_versions()) : 1;
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("model '", name, "': version_policy latest needs num_versions >= 1"));
    for (auto it = present.rbegin(); it != present.rend() && int64_t(chosen.size()) < n; ++it) chosen.push_back(*it);
    std::sort(chosen.begin(), chosen.end());
  }
  if (chosen.empty()) return absl::NotFoundError(absl::StrCat("model '", name, "': version_policy selects no version"));
  for (int64_t v : chosen) out.push_back(make(v, true));
  return out;
}

absl::StatusOr<std::vector<std::string>> ListModelFolders(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return absl::NotFoundError(absl::StrCat("model repository '", root, "' is not a directory"));
  std::vector<std::string> names;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code e2;
    if (it->is_directory(e2) && fs::is_regular_file(it->path() / "config.pbtxt", e2)) names.push_back(name);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list model repository '", root, "': ", ec.message()));
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<ModelEntry> ReadModelEntry(const std::string& root, const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos || name == "..")
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a model name"));
  std::error_code ec;
  const fs::path dir = fs::absolute(fs::path(root) / name, ec);
  if (ec || !fs::is_regular_file(dir / "config.pbtxt", ec))
    return absl::NotFoundError(absl::StrCat("no model '", name, "' in the repository (", root, ")"));
  auto config = ParseModelConfigFile((dir / "config.pbtxt").string(), name);
  if (!config.ok()) return config.status();
  ModelEntry e;
  e.dir = dir.string();
  e.config = *std::move(config);
  return e;
}

std::string ModelFolderFingerprint(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> parts;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_directory(e2)) {  // a new, still empty version folder is a change too
      parts.push_back(fs::relative(it->path(), dir, e2).string() + "/");
      continue;
    }
    if (!it->is_regular_file(e2)) continue;
    const auto size = it->file_size(e2);
    const auto mtime = it->last_write_time(e2).time_since_epoch().count();
    parts.push_back(absl::StrCat(fs::relative(it->path(), dir, e2).string(), ":", size, ":", mtime));
  }
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, "\n");
}

}  // namespace flashq::server
