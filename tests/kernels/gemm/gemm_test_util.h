// Shared helpers for the gemm tests: seeded random data and error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace flashq::gemm::testing {

inline std::vector<float> RandomVec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Act-order style g_idx: a random permutation of channels, cut into groups of `g`.
inline std::vector<int32_t> RandomGIdx(int K, int g, uint32_t seed) {
  std::vector<int> perm(K);
  for (int i = 0; i < K; ++i) perm[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> gi(K);
  for (int p = 0; p < K; ++p) gi[perm[p]] = p / g;
  return gi;
}

// ||a - b|| / ||b||
inline double RelErr(const float* a, const double* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Plain float64 GEMM against a float weight matrix: y[M][N] = x · wᵀ.
inline std::vector<double> GemmF64(const std::vector<float>& x, int M, int K, const std::vector<float>& w, int N) {
  std::vector<double> y(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(x[size_t(m) * K + k]) * double(w[size_t(n) * K + k]);
      y[size_t(m) * N + n] = s;
    }
  return y;
}

}  // namespace flashq::gemm::testing
