#include "client/bench/distribution.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace flashq::bench {
namespace {

absl::StatusOr<int64_t> ParseInt(std::string_view s, std::string_view spec) {
  int64_t v;
  if (!absl::SimpleAtoi(absl::string_view(s.data(), s.size()), &v)) return absl::InvalidArgumentError(absl::StrFormat("'%s': '%s' is not an integer", spec, s));
  return v;
}
absl::StatusOr<double> ParseDouble(std::string_view s, std::string_view spec) {
  double v;
  if (!absl::SimpleAtod(absl::string_view(s.data(), s.size()), &v)) return absl::InvalidArgumentError(absl::StrFormat("'%s': '%s' is not a number", spec, s));
  return v;
}

}  // namespace

IntDistribution IntDistribution::Fixed(int64_t n) {
  IntDistribution d;
  d.kind_ = Kind::kFixed;
  d.a_ = d.b_ = n;
  d.spec_ = absl::StrFormat("fixed:%d", n);
  return d;
}

absl::StatusOr<IntDistribution> IntDistribution::Parse(std::string_view spec) {
  IntDistribution d;
  d.spec_ = std::string(spec);
  if (spec.substr(0, 5) == "file:") {
    const std::string path(spec.substr(5));
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrFormat("cannot open length file '%s'", path));
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      for (absl::string_view tok : absl::StrSplit(line, absl::ByAnyChar(" \t,\r"), absl::SkipEmpty())) {
        int64_t v;
        if (!absl::SimpleAtoi(tok, &v) || v < 0)
          return absl::InvalidArgumentError(absl::StrFormat("%s:%d: '%s' is not a length", path, lineno, tok));
        d.values_.push_back(v);
      }
    }
    if (d.values_.empty()) return absl::InvalidArgumentError(absl::StrFormat("length file '%s' is empty", path));
    d.kind_ = Kind::kFile;
    d.a_ = *std::min_element(d.values_.begin(), d.values_.end());
    d.b_ = *std::max_element(d.values_.begin(), d.values_.end());
    return d;
  }
  std::vector<std::string_view> parts;
  for (absl::string_view p : absl::StrSplit(absl::string_view(spec.data(), spec.size()), ':'))
    parts.emplace_back(p.data(), p.size());
  if (parts.size() == 1) {
    auto n = ParseInt(parts[0], spec);
    if (!n.ok()) return n.status();
    IntDistribution f = Fixed(*n);
    f.spec_ = d.spec_;
    return f;
  }
  const std::string_view kind = parts[0];
  if (kind == "fixed" && parts.size() == 2) {
    auto n = ParseInt(parts[1], spec);
    if (!n.ok()) return n.status();
    d.kind_ = Kind::kFixed;
    d.a_ = d.b_ = *n;
  } else if (kind == "uniform" && parts.size() == 3) {
    auto a = ParseInt(parts[1], spec), b = ParseInt(parts[2], spec);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (*a > *b) return absl::InvalidArgumentError(absl::StrFormat("'%s': A > B", spec));
    d.kind_ = Kind::kUniform;
    d.a_ = *a;
    d.b_ = *b;
  } else if (kind == "lognormal" && (parts.size() == 3 || parts.size() == 5)) {
    auto med = ParseDouble(parts[1], spec), sig = ParseDouble(parts[2], spec);
    if (!med.ok()) return med.status();
    if (!sig.ok()) return sig.status();
    if (*med <= 0 || *sig < 0) return absl::InvalidArgumentError(absl::StrFormat("'%s': need MEDIAN > 0, SIGMA >= 0", spec));
    d.kind_ = Kind::kLognormal;
    d.median_ = *med;
    d.sigma_ = *sig;
    d.a_ = 1;
    d.b_ = int64_t(1) << 20;
    if (parts.size() == 5) {
      auto lo = ParseInt(parts[3], spec), hi = ParseInt(parts[4], spec);
      if (!lo.ok()) return lo.status();
      if (!hi.ok()) return hi.status();
      if (*lo > *hi) return absl::InvalidArgumentError(absl::StrFormat("'%s': MIN > MAX", spec));
      d.a_ = *lo;
      d.b_ = *hi;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad distribution '%s' (fixed:N, uniform:A:B, lognormal:MEDIAN:SIGMA[:MIN:MAX], file:PATH)", spec));
  }
  if (d.a_ < 0) return absl::InvalidArgumentError(absl::StrFormat("'%s': negative values", spec));
  return d;
}

int64_t IntDistribution::Sample(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kFixed: return a_;
    case Kind::kUniform: return std::uniform_int_distribution<int64_t>(a_, b_)(rng);
    case Kind::kLognormal: {
      const double x = std::lognormal_distribution<double>(std::log(median_), sigma_)(rng);
      return std::clamp<int64_t>(int64_t(std::llround(std::min(x, 1e15))), a_, b_);
    }
    case Kind::kFile: return values_[std::uniform_int_distribution<size_t>(0, values_.size() - 1)(rng)];
  }
  return a_;
}

int64_t IntDistribution::min() const { return a_; }
int64_t IntDistribution::max() const { return b_; }

}  // namespace flashq::bench
