// The embedded demo repository: Llama-3-8B-shaped models generated from a fixed
// seed so that the first run works offline. Written once into a cache folder and
// reused while its stamp (generator version + seed) matches.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashq::server {

// Creates (or reuses) the demo repository under `cache_dir` and returns its path.
absl::StatusOr<std::string> EnsureDemoRepository(const std::string& cache_dir, uint64_t seed = 20261122);

}  // namespace flashq::server
