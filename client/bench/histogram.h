// A log-bucketed latency histogram in the style of HdrHistogram: values below
// 2*kSub are exact, above that each power of two is split into kSub linear
// sub-buckets, so any reported percentile is within 1/(2*kSub) (0.4%) of a real
// sample. It stores bucket counts, not samples: recording is O(1) and memory is
// fixed (about 50 KB), however long the run. Values are nanoseconds.
#pragma once

#include <cstdint>
#include <vector>

namespace flashq::bench {

class Histogram {
 public:
  static constexpr int kSubBits = 7;
  static constexpr int64_t kSub = int64_t(1) << kSubBits;  // 128 sub-buckets per power of two
  static constexpr int kMaxExp = 46;                         // up to 2^47 ns (~39 hours)

  Histogram();
  void Record(int64_t value, int64_t count = 1);
  void Merge(const Histogram& other);
  void Reset();

  int64_t count() const { return count_; }
  int64_t min() const { return count_ ? min_ : 0; }
  int64_t max() const { return count_ ? max_ : 0; }
  double mean() const { return count_ ? double(sum_) / double(count_) : 0.0; }
  // Nearest-rank percentile, p in [0, 100]: the value of the sample at rank
  // ceil(p/100 * count), reported as the middle of its bucket (clamped to [min, max]).
  int64_t Percentile(double p) const;

  // Bucket arithmetic, public for tests.
  static int BucketIndex(int64_t value);
  static int64_t BucketLow(int index);
  static int64_t BucketHigh(int index);  // exclusive
  static int NumBuckets();

 private:
  std::vector<int64_t> counts_;
  int64_t count_ = 0, min_ = 0, max_ = 0;
  __int128 sum_ = 0;
};

}  // namespace flashq::bench
