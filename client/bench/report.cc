#include "client/bench/report.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flashq::bench {
namespace {

constexpr double kPcts[] = {50, 90, 95, 99, 99.9};
constexpr const char* kPctNames[] = {"p50", "p90", "p95", "p99", "p99.9"};
// Tags with columns of their own in the CSV (kv_attention's request kinds).
constexpr const char* kCsvTags[] = {"prefill", "decode"};
constexpr double kCsvTagPcts[] = {50, 90, 99};

std::string Json(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) o += absl::StrFormat("\\u%04x", c);
        else o += c;
    }
  }
  return o + "\"";
}
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}
double Ms(int64_t ns) { return double(ns) / 1e6; }

std::string HistJson(const Histogram& h) {
  std::string s = absl::StrFormat("{\"count\": %d, \"mean\": %s, \"min\": %s", h.count(), Num(h.mean() / 1e6), Num(Ms(h.min())));
  for (int i = 0; i < 5; ++i) absl::StrAppend(&s, ", \"", kPctNames[i], "\": ", Num(Ms(h.Percentile(kPcts[i]))));
  absl::StrAppend(&s, ", \"max\": ", Num(Ms(h.max())), "}");
  return s;
}

std::string FmtMs(double ms) {
  if (ms <= 0) return "-";
  if (ms < 10) return absl::StrFormat("%.2f", ms);
  if (ms < 100) return absl::StrFormat("%.1f", ms);
  return absl::StrFormat("%.0f", ms);
}
std::string FmtRate(double v) {
  if (v < 10) return absl::StrFormat("%.2f", v);
  if (v < 1000) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.0f", v);
}

}  // namespace

std::string GrpcCodeName(int code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                 "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  if (code >= 0 && code < int(std::size(kNames))) return kNames[code];
  if (code == kCodeBadOutput) return "BAD_OUTPUT";
  if (code == kCodeClientError) return "CLIENT_ERROR";
  return absl::StrCat("CODE_", code);
}

std::string FormatTable(const std::vector<ScenarioResult>& results) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"scenario", "load", "req/s", "units/s", "p50 ms", "p90", "p95", "p99", "p99.9", "errors",
                  "srv queue", "srv compute", "batch", "stable"});
  std::vector<std::string> notes;
  for (const auto& sc : results) {
    if (!sc.error.empty()) {
      rows.push_back({sc.name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "failed"});
      notes.push_back(absl::StrCat(sc.name, ": ", sc.error));
      continue;
    }
    for (const auto& n : sc.notes) notes.push_back(absl::StrCat(sc.name, ": ", n));
    for (const auto& p : sc.points) {
      const auto& m = p.m;
      const char* unit = sc.unit == "rows" ? "rows" : sc.unit == "requests" ? "req" : "tok";
      std::vector<std::string> row = {sc.name, p.load.Label(), FmtRate(m.rps()),
                                      absl::StrCat(FmtRate(m.units_per_s()), " ", unit)};
      for (double q : kPcts) row.push_back(FmtMs(Ms(m.latency.Percentile(q))));
      std::string err = absl::StrCat(m.error_count());
      if (m.error_count()) {
        std::vector<std::string> parts;
        for (auto& [code, n] : m.errors) parts.push_back(absl::StrCat(GrpcCodeName(code), ":", n));
        notes.push_back(absl::StrCat(sc.name, " ", p.load.Label(), " errors: ", absl::StrJoin(parts, ", ")));
      }
      row.push_back(err);
      row.push_back(m.server.valid ? FmtMs(m.server.queue_us() / 1e3) + " ms" : "-");
      row.push_back(m.server.valid ? FmtMs(m.server.compute_us() / 1e3) + " ms" : "-");
      row.push_back(m.server.valid && m.server.execution_count ? absl::StrFormat("%.1f", m.server.avg_batch()) : "-");
      row.push_back(p.interrupted ? "interrupted" : p.stable ? "yes" : absl::StrFormat("no (%d win)", p.windows));
      rows.push_back(std::move(row));
      for (size_t t = 0; t < sc.tags.size() && t < m.by_tag.size(); ++t) {
        const Histogram& h = m.by_tag[t];
        if (!h.count()) continue;
        std::vector<std::string> sub = {"", absl::StrCat("  ", sc.tags[t], " n=", h.count()),
                                        FmtRate(m.seconds > 0 ? h.count() / m.seconds : 0), ""};
        for (double q : kPcts) sub.push_back(FmtMs(Ms(h.Percentile(q))));
        sub.resize(rows[0].size());
        rows.push_back(std::move(sub));
      }
      if (p.load.mode == LoadPoint::Mode::kOpen && m.send_lag.count() &&
          m.send_lag.Percentile(99) > 1000000)  // the client fell > 1 ms behind its schedule
        notes.push_back(absl::StrFormat("%s %s: sender lag p99 %.1f ms (counted in the latencies)", sc.name,
                                        p.load.Label(), Ms(m.send_lag.Percentile(99))));
    }
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::string out;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    std::string line;
    for (size_t i = 0; i < rows[ri].size(); ++i) {
      const bool left = i < 2 || i == rows[ri].size() - 1;
      const std::string& c = rows[ri][i];
      std::string pad(w[i] - c.size(), ' ');
      line += left ? c + pad : pad + c;
      if (i + 1 < rows[ri].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (ri == 0) {
      size_t total = 0;
      for (size_t x : w) total += x + 2;
      out += std::string(total - 2, '-') + "\n";
    }
  }
  for (auto& n : notes) out += "  " + n + "\n";
  return out;
}

std::string ToJson(const RunInfo& info, const std::vector<ScenarioResult>& results) {
  std::string s = "{\n";
  absl::StrAppend(&s, "  \"tool\": \"flashq-bench\",\n  \"date\": ", Json(info.date), ",\n  \"commit\": ", Json(info.commit),
                  ",\n  \"host\": ", Json(info.host), ",\n  \"command\": ", Json(info.command_line), ",\n");
  std::vector<std::string> eps;
  for (auto& e : info.endpoints) eps.push_back(Json(e));
  absl::StrAppend(&s, "  \"endpoints\": [", absl::StrJoin(eps, ", "), "],\n  \"channels_per_endpoint\": ", info.channels,
                  ",\n  \"spawned_server\": ",
                  info.spawned_server ? "true" : "false", ",\n  \"server_backend\": ", Json(info.server_backend),
                  ",\n  \"shared_memory\": ", Json(info.shared_memory), ",\n");
  std::vector<std::string> hdrs;
  for (auto& h : info.header_names) hdrs.push_back(Json(h));
  absl::StrAppend(&s, "  \"security\": ", Json(info.security), ",\n  \"compression\": ", Json(info.compression),
                  ",\n  \"headers\": [", absl::StrJoin(hdrs, ", "), "],\n");
  const auto& mo = info.measure;
  absl::StrAppend(&s, "  \"measurement\": {\"window_s\": ", Num(mo.window_s), ", \"stability_pct\": ", Num(mo.stability_pct),
                  ", \"stable_windows\": ", mo.stable_windows,
                  ", \"stability_latency\": ", mo.stability_percentile > 0 ? absl::StrCat("\"p", mo.stability_percentile, "\"") : "\"mean\"", ", \"max_time_s\": ", Num(mo.max_time_s),
                  ", \"warmup_s\": ", Num(mo.warmup_s), ", \"latency\": \"ms; percentiles from a log-bucketed histogram (<=0.4% error)\"},\n");
  s += "  \"scenarios\": [\n";
  for (size_t si = 0; si < results.size(); ++si) {
    const auto& sc = results[si];
    absl::StrAppend(&s, "    {\"name\": ", Json(sc.name), ", \"model\": ", Json(sc.model), ", \"description\": ",
                    Json(sc.description), ", \"unit\": ", Json(sc.unit), ", \"error\": ", sc.error.empty() ? "null" : Json(sc.error),
                    ", \"sessions_completed\": ", sc.sessions_completed, ", \"shared_memory_slots\": ", sc.shared_memory_slots,
                    ", \"notes\": [");
    for (size_t i = 0; i < sc.notes.size(); ++i) absl::StrAppend(&s, i ? ", " : "", Json(sc.notes[i]));
    s += "],\n     \"points\": [\n";
    for (size_t pi = 0; pi < sc.points.size(); ++pi) {
      const auto& p = sc.points[pi];
      const auto& m = p.m;
      const bool open = p.load.mode == LoadPoint::Mode::kOpen;
      absl::StrAppend(&s, "      {\"label\": ", Json(p.load.Label()), ", \"mode\": ", open ? "\"open\"" : "\"closed\"",
                      ", \"concurrency\": ", open ? "null" : absl::StrCat(p.load.concurrency),
                      ", \"rate\": ", open ? Num(p.load.rate) : "null",
                      ", \"rate_unit\": ", open ? (p.load.rate_is_sessions ? "\"sessions/s\"" : "\"requests/s\"") : "null", ", \"arrival\": ",
                      open ? (p.load.arrival == Arrival::kPoisson ? "\"poisson\"" : "\"constant\"") : "null",
                      ",\n       \"stable\": ", p.stable ? "true" : "false", ", \"interrupted\": ", p.interrupted ? "true" : "false",
                      ", \"windows\": ", p.windows, ", \"windows_merged\": ", p.windows_merged, ", \"elapsed_s\": ", Num(p.elapsed_s),
                      ", \"measured_s\": ", Num(m.seconds), ", \"sent\": ", p.sent, ", \"warmup_requests\": ", p.warmup_ok, ", \"warmup_errors\": ", p.warmup_errors, ",\n");
      s += "       \"windows_rps_latency\": [";  // every window: throughput, stability statistic (ms)
      for (size_t i = 0; i < p.window_summaries.size(); ++i)
        absl::StrAppend(&s, i ? ", " : "", "[", Num(p.window_summaries[i].throughput), ", ",
                        Num(p.window_summaries[i].latency / 1e6), "]");
      s += "],\n";
      absl::StrAppend(&s, "       \"requests\": ", m.ok, ", \"throughput_rps\": ", Num(m.rps()), ", \"units_per_s\": ",
                      Num(m.units_per_s()), ",\n       \"latency_ms\": ", HistJson(m.latency), ",\n");
      if (!sc.tags.empty()) {
        s += "       \"latency_ms_by_kind\": {";
        for (size_t t = 0; t < sc.tags.size() && t < m.by_tag.size(); ++t)
          absl::StrAppend(&s, t ? ", " : "", Json(sc.tags[t]), ": ", HistJson(m.by_tag[t]));
        s += "},\n       \"throughput_rps_by_kind\": {";
        for (size_t t = 0; t < sc.tags.size() && t < m.by_tag.size(); ++t)
          absl::StrAppend(&s, t ? ", " : "", Json(sc.tags[t]), ": ",
                          Num(m.seconds > 0 ? double(m.by_tag[t].count()) / m.seconds : 0));
        s += "},\n";
      }
      if (open) absl::StrAppend(&s, "       \"send_lag_ms\": ", HistJson(m.send_lag), ",\n");
      s += "       \"errors\": {";
      bool first = true;
      for (auto& [code, n] : m.errors) {
        absl::StrAppend(&s, first ? "" : ", ", Json(GrpcCodeName(code)), ": ", n);
        first = false;
      }
      absl::StrAppend(&s, "}, \"error_count\": ", m.error_count(), ",\n");
      const auto& sv = m.server;
      if (sv.valid)
        absl::StrAppend(&s, "       \"server\": {\"requests\": ", sv.success_count, ", \"queue_ms\": ", Num(sv.queue_us() / 1e3),
                        ", \"compute_ms\": ", Num(sv.compute_us() / 1e3), ", \"compute_infer_ms\": ",
                        Num(sv.compute_infer_count ? double(sv.compute_infer_ns) / sv.compute_infer_count / 1e6 : 0),
                        ", \"server_total_ms\": ", Num(sv.server_us() / 1e3), ", \"executions\": ", sv.execution_count,
                        ", \"avg_batch_requests\": ", Num(sv.avg_batch()),
                        ", \"client_overhead_ms\": ", Num(sv.success_count ? m.latency.mean() / 1e6 - sv.server_us() / 1e3 : 0), "}");
      else
        s += "       \"server\": null";
      s += "\n      }";
      s += pi + 1 < sc.points.size() ? ",\n" : "\n";
    }
    s += "    ]}";
    s += si + 1 < results.size() ? ",\n" : "\n";
  }
  s += "  ]\n}\n";
  return s;
}

std::string ToCsv(const std::vector<ScenarioResult>& results) {
  std::string s =
      "scenario,model,mode,concurrency,rate,arrival,stable,windows,measured_s,requests,throughput_rps,units_per_s,unit,"
      "mean_ms,p50_ms,p90_ms,p95_ms,p99_ms,p99_9_ms,max_ms,errors,server_queue_ms,server_compute_ms,server_total_ms,"
      "avg_batch_requests";
  for (const char* tag : kCsvTags) {
    absl::StrAppend(&s, ",", tag, "_requests");
    for (double q : kCsvTagPcts) absl::StrAppend(&s, ",", tag, "_p", q, "_ms");
  }
  s += "\n";
  for (const auto& sc : results) {
    for (const auto& p : sc.points) {
      const auto& m = p.m;
      const bool open = p.load.mode == LoadPoint::Mode::kOpen;
      absl::StrAppend(&s, sc.name, ",", sc.model, ",", open ? "open" : "closed", ",", open ? "" : absl::StrCat(p.load.concurrency),
                      ",", open ? Num(p.load.rate) : "", ",", open ? (p.load.arrival == Arrival::kPoisson ? "poisson" : "constant") : "",
                      ",", p.stable ? 1 : 0, ",", p.windows, ",", Num(m.seconds), ",", m.ok, ",", Num(m.rps()), ",",
                      Num(m.units_per_s()), ",", sc.unit, ",", Num(m.latency.mean() / 1e6));
      for (double q : kPcts) absl::StrAppend(&s, ",", Num(Ms(m.latency.Percentile(q))));
      absl::StrAppend(&s, ",", Num(Ms(m.latency.max())), ",", m.error_count(), ",");
      if (m.server.valid)
        absl::StrAppend(&s, Num(m.server.queue_us() / 1e3), ",", Num(m.server.compute_us() / 1e3), ",",
                        Num(m.server.server_us() / 1e3), ",", Num(m.server.avg_batch()));
      else
        s += ",,,";
      for (const char* tag : kCsvTags) {
        const Histogram* h = nullptr;
        for (size_t t = 0; t < sc.tags.size() && t < m.by_tag.size(); ++t)
          if (sc.tags[t] == tag) h = &m.by_tag[t];
        if (!h) {
          s += std::string(1 + std::size(kCsvTagPcts), ',');
          continue;
        }
        absl::StrAppend(&s, ",", h->count());
        for (double q : kCsvTagPcts) absl::StrAppend(&s, ",", h->count() ? Num(Ms(h->Percentile(q))) : "");
      }
      s += "\n";
    }
  }
  return s;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrFormat("cannot write %s", path));
  out << contents;
  out.close();
  if (!out) return absl::DataLossError(absl::StrFormat("error writing %s", path));
  return absl::OkStatus();
}

}  // namespace flashq::bench
