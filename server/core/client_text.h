// Client-supplied text (model, tensor and parameter names, sequence ids) as error
// messages quote it: cut to a bounded length, so that an answer does not grow with what
// the client sent and stays within gRPC's limits on status messages.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flashq::server {

inline std::string Quoted(absl::string_view text, size_t max_bytes = 64) {
  if (text.size() <= max_bytes) return absl::StrCat("'", text, "'");
  return absl::StrCat("'", text.substr(0, max_bytes), "...' (", text.size(), " bytes)");
}

}  // namespace flashq::server
