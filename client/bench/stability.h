// perf_analyzer's stability rule: a measurement is stable when, over the last
// `count` windows, every window's throughput and every window's latency lie within
// +-pct% of those windows' average.
#pragma once

#include <vector>

namespace flashq::bench {

struct WindowSummary {
  double throughput = 0;  // requests/s
  double latency = 0;     // the latency statistic compared: the mean (perf_analyzer's default) or a percentile
};

bool IsStable(const std::vector<WindowSummary>& windows, int count, double pct);

}  // namespace flashq::bench
