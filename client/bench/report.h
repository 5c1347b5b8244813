// Results of a flashq-bench run: the terminal table, JSON and CSV files.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/bench/runner.h"

namespace flashq::bench {

struct ScenarioResult {
  std::string name;
  std::string description;
  std::string model;
  std::string unit;               // "tokens" or "rows"
  std::vector<std::string> tags;  // sub-histograms (kv: prefill, decode)
  std::vector<PointResult> points;
  int64_t sessions_completed = 0;
  int shared_memory_slots = 0;     // --shared-memory: regions made (one per client slot)
  std::vector<std::string> notes;  // client-side remarks (shared memory, output checks)
  std::string error;  // set when the scenario could not run at all
};

struct RunInfo {
  std::string date;        // UTC, ISO 8601
  std::string commit;
  std::string host;
  std::vector<std::string> endpoints;
  int channels = 1;        // gRPC channels (HTTP/2 connections) per endpoint
  std::string command_line;
  bool spawned_server = false;
  std::string server_backend;
  std::string shared_memory = "none";  // --shared-memory
  std::string security = "plaintext";  // plaintext, tls or mutual tls
  std::string compression = "none";    // of requests: none, gzip or deflate
  std::vector<std::string> header_names;  // --header names; values stay out of reports (they hold tokens)
  MeasureOptions measure;
};

std::string GrpcCodeName(int code);
// Tables, JSON and CSV report the overall latency of a load point, and for a workload
// with tags (kv: prefill, decode) each tag's count and percentiles next to it.
std::string FormatTable(const std::vector<ScenarioResult>& results);
std::string ToJson(const RunInfo& info, const std::vector<ScenarioResult>& results);
std::string ToCsv(const std::vector<ScenarioResult>& results);
absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace flashq::bench
