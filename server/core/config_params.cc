#include "server/core/config_params.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flashq::server {

std::string ConfigParam(const inference::ModelConfig& config, const std::string& key, const std::string& def) {
  auto it = config.parameters().find(key);
  return it == config.parameters().end() ? def : it->second.string_value();
}

absl::StatusOr<int64_t> ConfigIntParam(const inference::ModelConfig& config, const std::string& key, int64_t def,
                                       int64_t lo, int64_t hi) {
  auto it = config.parameters().find(key);
  if (it == config.parameters().end()) return def;
  int64_t v;
  if (!absl::SimpleAtoi(it->second.string_value(), &v))
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': parameter ", key, " is '",
                                                   it->second.string_value(), "', not an integer"));
  if (v < lo || v > hi)
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name(), "': parameter ", key, " is ", v,
                                                   "; it must be in ", lo, "..", hi));
  return v;
}

}  // namespace flashq::server
