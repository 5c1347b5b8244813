// The report of a kv_attention load point: prefill and decode latencies apart from
// each other (counts and percentiles) in the table, the JSON and the CSV, next to the
// overall figures that existing readers use.
#include "client/bench/report.h"

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"

namespace flashq::bench {
namespace {

ScenarioResult KvResult() {
  ScenarioResult sc;
  sc.name = "kv_decode";
  sc.model = "kv_attention";
  sc.unit = "tokens";
  sc.tags = {"prefill", "decode"};
  PointResult p;
  p.load.concurrency = 2;
  p.m.seconds = 2;
  p.m.by_tag.resize(2);
  for (int i = 0; i < 4; ++i) {  // prefills: 40 ms
    p.m.latency.Record(40'000'000);
    p.m.by_tag[0].Record(40'000'000);
  }
  for (int i = 0; i < 60; ++i) {  // decodes: 1 ms, one of 5 ms
    const int64_t ns = i == 0 ? 5'000'000 : 1'000'000;
    p.m.latency.Record(ns);
    p.m.by_tag[1].Record(ns);
  }
  p.m.ok = 64;
  sc.points.push_back(std::move(p));
  return sc;
}

std::string Field(const std::string& csv_header, const std::string& csv_row, const std::string& name) {
  std::vector<std::string> h = absl::StrSplit(csv_header, ','), r = absl::StrSplit(csv_row, ',');
  for (size_t i = 0; i < h.size() && i < r.size(); ++i)
    if (h[i] == name) return r[i];
  return "<missing>";
}

TEST(Report, KvPrefillAndDecodeApartInTheTable) {
  const std::string t = FormatTable({KvResult()});
  EXPECT_NE(t.find("prefill n=4"), std::string::npos) << t;
  EXPECT_NE(t.find("decode n=60"), std::string::npos) << t;
}

TEST(Report, KvPrefillAndDecodeApartInTheJson) {
  RunInfo info;
  info.shared_memory = "system";
  const std::string j = ToJson(info, {KvResult()});
  for (const char* f : {"\"shared_memory\": \"system\"", "\"latency_ms\": {\"count\": 64",
                        "\"latency_ms_by_kind\": {\"prefill\": {\"count\": 4", "\"decode\": {\"count\": 60",
                        "\"throughput_rps_by_kind\": {\"prefill\": 2, \"decode\": 30}", "\"shared_memory_slots\": 0"})
    EXPECT_NE(j.find(f), std::string::npos) << f << "\n" << j;
}

TEST(Report, KvPrefillAndDecodeApartInTheCsv) {
  const std::string csv = ToCsv({KvResult()});
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  // The existing columns keep their places; the new ones follow them.
  EXPECT_EQ(lines[0].rfind("scenario,model,mode,concurrency,rate,arrival,stable,windows,measured_s,requests,", 0), 0u);
  EXPECT_EQ(lines[0].find("avg_batch_requests,prefill_requests"), lines[0].find("avg_batch_requests"));
  EXPECT_EQ(Field(lines[0], lines[1], "requests"), "64");
  EXPECT_EQ(Field(lines[0], lines[1], "prefill_requests"), "4");
  EXPECT_EQ(Field(lines[0], lines[1], "decode_requests"), "60");
  EXPECT_NEAR(std::stod(Field(lines[0], lines[1], "prefill_p50_ms")), 40, 0.2);
  EXPECT_NEAR(std::stod(Field(lines[0], lines[1], "decode_p50_ms")), 1, 0.01);
  EXPECT_NEAR(std::stod(Field(lines[0], lines[1], "decode_p99_ms")), 5, 0.03);
  EXPECT_NE(Field(lines[0], lines[1], "decode_p90_ms"), "<missing>");
  // A scenario without those kinds leaves the columns empty, one per header.
  ScenarioResult plain = KvResult();
  plain.tags.clear();
  std::vector<std::string> l2 = absl::StrSplit(ToCsv({plain}), '\n', absl::SkipEmpty());
  EXPECT_EQ(std::count(l2[1].begin(), l2[1].end(), ','), std::count(l2[0].begin(), l2[0].end(), ','));
  EXPECT_EQ(Field(l2[0], l2[1], "decode_requests"), "");
}

}  // namespace
}  // namespace flashq::bench
