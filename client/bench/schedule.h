// Open-loop arrival schedules. Send times are fixed in advance of the server's
// behaviour: request i is *intended* to leave at t0 + offset(i), and its latency
// is measured from that intended time, so a server (or client) that falls behind
// cannot hide its delay by slowing the sender (no coordinated omission).
#pragma once

#include <cstdint>
#include <random>

namespace flashq::bench {

enum class Arrival { kConstant, kPoisson };

class ArrivalSchedule {
 public:
  ArrivalSchedule(Arrival kind, double rate_per_s, uint64_t seed);
  // Offset of the next request from the start of the schedule, in nanoseconds.
  // Constant: i / rate exactly (no drift). Poisson: a sum of exponential gaps.
  int64_t NextOffsetNs();

 private:
  Arrival kind_;
  double rate_;
  int64_t index_ = 0;
  double t_ns_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace flashq::bench
