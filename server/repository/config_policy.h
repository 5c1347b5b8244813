// What flashq does with each field of Triton's ModelConfig: honour it, refuse the
// config because serving it without the field's meaning would be wrong, or accept it
// and log that the field is ignored. One table (config_policy.cc) decides, so that the
// code, the log and docs/configuration.md say the same thing.
#pragma once

#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/status/status.h"
#include "model_config.pb.h"

namespace flashq::server {

enum class FieldPolicy { kHonour, kRefuse, kIgnore };

struct FieldRule {
  const char* path;    // dotted field path from ModelConfig; the longest matching prefix decides
  FieldPolicy policy;
  const char* reason;  // why: the meaning flashq gives it, or why it is refused or ignored
  // A string value that is honoured whatever `policy` says (`backend: "flashq"` names this
  // server, and is what its own configs write). Null: none.
  const char* honoured_value = nullptr;
};

// The table, for tests and docs.
const std::vector<FieldRule>& ModelConfigFieldRules();

// Applies the table to every field `config` sets (a proto3 scalar at its default value is
// not set). Refused: INVALID_ARGUMENT "<file>:<line>: <field> is refused: <reason>".
// Ignored: one line per field in `warnings`, "<file>:<line>: <field> is ignored: <reason>".
// `where` (may be null) gives the lines; `file` names the config in messages.
absl::Status ApplyFieldPolicy(const inference::ModelConfig& config, const std::string& file,
                              const google::protobuf::TextFormat::ParseInfoTree* where,
                              std::vector<std::string>* warnings);

}  // namespace flashq::server
