#include "client/bench/stability.h"

#include <cmath>

namespace flashq::bench {

bool IsStable(const std::vector<WindowSummary>& w, int count, double pct) {
  if (count <= 0 || int(w.size()) < count) return false;
  double tput = 0, lat = 0;
  for (size_t i = w.size() - count; i < w.size(); ++i) {
    if (w[i].throughput <= 0) return false;  // an empty window proves nothing
    tput += w[i].throughput;
    lat += w[i].latency;
  }
  tput /= count;
  lat /= count;
  const double tol = pct / 100.0;
  for (size_t i = w.size() - count; i < w.size(); ++i) {
    if (std::fabs(w[i].throughput - tput) > tol * tput) return false;
    if (std::fabs(w[i].latency - lat) > tol * lat) return false;
  }
  return true;
}

}  // namespace flashq::bench
