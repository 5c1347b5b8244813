// Integer distributions for request shapes (sequence lengths, rows M, sequences
// per request), parsed from a short spec string:
//   fixed:N                      always N
//   uniform:A:B                  uniform integer in [A, B]
//   lognormal:MEDIAN:SIGMA[:MIN:MAX]  round(exp(N(ln MEDIAN, SIGMA))) clamped to [MIN, MAX]
//                                (defaults 1 and 1<<20); mean = MEDIAN*exp(SIGMA^2/2) unclamped
//   file:PATH                    the empirical distribution of the integers in PATH
//                                (whitespace-separated, '#' starts a comment), e.g. lengths
//                                taken from a production trace
// A plain integer "N" means fixed:N.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::bench {

class IntDistribution {
 public:
  enum class Kind { kFixed, kUniform, kLognormal, kFile };

  static absl::StatusOr<IntDistribution> Parse(std::string_view spec);
  static IntDistribution Fixed(int64_t n);

  int64_t Sample(std::mt19937_64& rng) const;
  Kind kind() const { return kind_; }
  int64_t min() const;  // smallest value Sample can return
  int64_t max() const;  // largest value Sample can return
  const std::vector<int64_t>& values() const { return values_; }  // kFile only
  const std::string& spec() const { return spec_; }

 private:
  Kind kind_ = Kind::kFixed;
  int64_t a_ = 1, b_ = 1;       // fixed: a; uniform: [a, b]; lognormal: clamp [a, b]
  double median_ = 1, sigma_ = 0;
  std::vector<int64_t> values_;  // file
  std::string spec_;
};

}  // namespace flashq::bench
