#include "client/bench/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace flashq::bench {

int Histogram::NumBuckets() { return int(kSub) * (kMaxExp - kSubBits + 2); }

int Histogram::BucketIndex(int64_t v) {
  if (v < 0) v = 0;
  if (v < 2 * kSub) return int(v);
  int e = 63 - std::countl_zero(uint64_t(v));  // v in [2^e, 2^(e+1))
  if (e > kMaxExp) return NumBuckets() - 1;
  const int shift = e - kSubBits;                // v >> shift in [kSub, 2*kSub)
  return int(kSub) * shift + int(v >> shift);
}

int64_t Histogram::BucketLow(int index) {
  if (index < 2 * kSub) return index;
  const int shift = index / int(kSub) - 1;
  return int64_t(index - int(kSub) * shift) << shift;
}

int64_t Histogram::BucketHigh(int index) {
  if (index < 2 * kSub) return index + 1;
  const int shift = index / int(kSub) - 1;
  return BucketLow(index) + (int64_t(1) << shift);
}

Histogram::Histogram() : counts_(NumBuckets(), 0) {}

void Histogram::Record(int64_t v, int64_t n) {
  if (n <= 0) return;
  if (v < 0) v = 0;
  counts_[BucketIndex(v)] += n;
  if (count_ == 0) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  count_ += n;
  sum_ += __int128(v) * n;
}

void Histogram::Merge(const Histogram& o) {
  if (o.count_ == 0) return;
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
  if (count_ == 0) {
    min_ = o.min_;
    max_ = o.max_;
  } else {
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
  }
  count_ += o.count_;
  sum_ += o.sum_;
}

void Histogram::Reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = min_ = max_ = 0;
  sum_ = 0;
}

int64_t Histogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  p = std::clamp(p, 0.0, 100.0);
  int64_t rank = int64_t(std::ceil(p / 100.0 * double(count_)));
  rank = std::clamp<int64_t>(rank, 1, count_);
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const int64_t lo = BucketLow(int(i)), hi = BucketHigh(int(i));
      return std::clamp(lo + (hi - lo) / 2, min_, max_);
    }
  }
  return max_;
}

}  // namespace flashq::bench
