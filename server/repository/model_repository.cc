// Scans a model repository: every sub-folder holding a config.pbtxt is a model.
// Checks here are the ones every model shares (name, kind, tensor names, dims);
// each model kind checks its own shapes and weights when it is loaded.
#include "server/repository/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/repository/config_policy.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKinds[] = {"attention", "kv_attention", "linear"};

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectErrors(std::string path) : path_(std::move(path)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    // protobuf counts from 0; editors count from 1. line -1 means "no position".
    if (line < 0) errors_.push_back(absl::StrCat(path_, ": ", message));
    else errors_.push_back(absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {}
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::string path_;
  std::vector<std::string> errors_;
};

absl::Status CheckConfig(const std::string& path, const std::string& folder,
                         const google::protobuf::TextFormat::ParseInfoTree& where, inference::ModelConfig* config) {
  // "<path>:<line>" of a top-level field (the index-th element of a repeated one), or the
  // path alone where the config does not write the field.
  auto at = [&](const char* field, int index = -1) {
    const auto* f = inference::ModelConfig::descriptor()->FindFieldByName(field);
    auto loc = where.GetLocation(f, f->is_repeated() ? std::max(index, 0) : -1);
    // Elements after the first of a list (`input [ {...}, {...} ]`) may have no location
    // of their own: the list's is the nearest.
    if (loc.line < 0 && f->is_repeated()) loc = where.GetLocation(f, 0);
    return loc.line < 0 ? path : absl::StrCat(path, ":", loc.line + 1);
  };
  auto bad_at = [&](const std::string& where_, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", what));
  };
  auto bad = [&](const std::string& what) { return bad_at(path, what); };
  if (config->name().empty()) config->set_name(folder);
  if (config->name() != folder)
    return bad_at(at("name"), absl::StrCat("name '", config->name(), "' differs from the folder name '", folder, "'"));
  if (config->max_batch_size() != 0)
    return bad_at(at("max_batch_size"), absl::StrCat("max_batch_size is ", config->max_batch_size(),
                            "; it must be 0 (requests are batched inside ragged tensors, not along a batch dimension)"));
  // Triton refuses these too; checked here as well as where the scheduler reads them, so
  // that the error names the line.
  for (int i = 0; i < config->instance_group_size(); ++i) {
    if (config->instance_group(i).count() < 0)
      return bad_at(at("instance_group", i), absl::StrCat("instance_group count is ", config->instance_group(i).count(),
                                                          "; it must be >= 1"));
  }
  if (config->has_dynamic_batching()) {
    const uint64_t levels = config->dynamic_batching().priority_levels();
    const uint64_t def = config->dynamic_batching().default_priority_level();
    if (levels > 0 && (def < 1 || def > levels))
      return bad_at(at("dynamic_batching"), absl::StrCat("dynamic_batching.default_priority_level is ", def,
                                                         "; with priority_levels ", levels, " it must be in 1..",
                                                         levels));
    for (const auto& [level, policy] : config->dynamic_batching().priority_queue_policy()) {
      if (level < 1 || level > levels)
        return bad_at(at("dynamic_batching"), absl::StrCat("dynamic_batching.priority_queue_policy has level ", level,
                                                           "; the levels are 1..", levels, " (priority_levels)"));
    }
  }
  auto kind = config->parameters().find("kind");
  if (kind == config->parameters().end())
    return bad("parameters has no \"kind\" (one of attention, kv_attention, linear)");
  const std::string& k = kind->second.string_value();
  if (std::find(std::begin(kKinds), std::end(kKinds), k) == std::end(kKinds))
    return bad(absl::StrCat("parameter kind is '", k, "'; expected one of attention, kv_attention, linear"));

  std::set<std::string> names;
  auto check_tensor = [&](const std::string& io, int index, const std::string& name, inference::DataType dtype,
                          const google::protobuf::RepeatedField<int64_t>& dims) -> absl::Status {
    auto bad = [&](const std::string& what) { return bad_at(at(io.c_str(), index), what); };
    if (name.empty()) return bad(absl::StrCat("an ", io, " has no name"));
    if (!names.insert(name).second) return bad(absl::StrCat("tensor name '", name, "' is used twice"));
    if (dtype == inference::TYPE_INVALID) return bad(absl::StrCat(io, " '", name, "' has no data_type"));
    if (dims.empty()) return bad(absl::StrCat(io, " '", name, "' has no dims"));
    for (int64_t d : dims)
      if (d < -1 || d == 0)
        return bad(absl::StrCat(io, " '", name, "' has dimension ", d, "; use a positive size or -1 (variable)"));
    return absl::OkStatus();
  };
  if (config->input().empty()) return bad("no input");
  if (config->output().empty()) return bad("no output");
  for (int i = 0; i < config->input_size(); ++i) {
    const auto& in = config->input(i);
    absl::Status s = check_tensor("input", i, in.name(), in.data_type(), in.dims());
    if (!s.ok()) return s;
  }
  for (int i = 0; i < config->output_size(); ++i) {
    const auto& out = config->output(i);
    absl::Status s = check_tensor("output", i, out.name(), out.data_type(), out.dims());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<inference::ModelConfig> ParseModelConfigFile(const std::string& path, const std::string& folder,
                                                            std::vector<std::string>* warnings) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << f.rdbuf();
  inference::ModelConfig config;
  CollectErrors errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  google::protobuf::TextFormat::ParseInfoTree where;
  parser.WriteLocationsTo(&where);
  if (!parser.ParseFromString(text.str(), &config)) {
    if (errors.errors().empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot parse"));
    return absl::InvalidArgumentError(absl::StrJoin(errors.errors(), "; "));
  }
  std::vector<std::string> own;
  if (absl::Status s = ApplyFieldPolicy(config, path, &where, warnings ? warnings : &own); !s.ok()) return s;
  absl::Status s = CheckConfig(path, folder, where, &config);
  if (!s.ok()) return s;
  return config;
}

absl::StatusOr<std::vector<ModelEntry>> ScanModelRepository(const std::string& root) {
  std::error_code ec;
  fs::path dir = fs::absolute(root, ec);
  if (ec || !fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat("model repository '", root, "' is not a directory"));
  std::vector<fs::path> folders;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // hidden folders: editors, our own temp folders
    if (it->is_directory(ec) && fs::is_regular_file(it->path() / "config.pbtxt", ec)) folders.push_back(it->path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list model repository '", dir.string(), "': ", ec.message()));
  std::sort(folders.begin(), folders.end());
  if (folders.empty())
    return absl::NotFoundError(
        absl::StrCat("model repository '", dir.string(), "' holds no model folder with a config.pbtxt"));

  std::vector<ModelEntry> models;
  std::set<std::string> names;
  for (const fs::path& folder : folders) {
    ModelEntry entry;
    entry.dir = folder.string();
    auto config =
        ParseModelConfigFile((folder / "config.pbtxt").string(), folder.filename().string(), &entry.warnings);
    if (!config.ok()) return config.status();
    entry.config = *std::move(config);
    if (!names.insert(entry.config.name()).second)
      return absl::AlreadyExistsError(absl::StrCat("model '", entry.config.name(), "' is defined twice in '",
                                                   dir.string(), "' (second in ", entry.dir, ")"));
    models.push_back(std::move(entry));
  }
  return models;
}

}  // namespace flashq::server
