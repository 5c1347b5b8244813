#include "client/bench/schedule.h"

#include <cmath>

namespace flashq::bench {

ArrivalSchedule::ArrivalSchedule(Arrival kind, double rate_per_s, uint64_t seed)
    : kind_(kind), rate_(rate_per_s > 0 ? rate_per_s : 1.0), rng_(seed) {}

int64_t ArrivalSchedule::NextOffsetNs() {
  if (kind_ == Arrival::kConstant) return int64_t(std::llround(double(index_++) * 1e9 / rate_));
  const int64_t now = int64_t(std::llround(t_ns_));
  t_ns_ += std::exponential_distribution<double>(rate_)(rng_) * 1e9;
  ++index_;
  return now;
}

}  // namespace flashq::bench
