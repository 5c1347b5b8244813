// CPU references: dequantize one weight row at a time into a float buffer, then one
// contiguous dot product per activation row. Threads split N when the layer is large.
#include "kernels/gemm/gemm_ref.h"

#include <algorithm>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/dtype.h"

namespace flashq::gemm {
namespace {

// Calls fn(n0, n1) over [0, N) split across threads when the work is large.
template <typename Fn>
void ParallelOverN(int N, double work, Fn fn) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  int threads = work < 4e6 ? 1 : int(std::min<unsigned>(hw, 16));
  threads = std::min(threads, N);
  if (threads <= 1) {
    fn(0, N);
    return;
  }
  std::vector<std::thread> pool;
  int chunk = (N + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    int n0 = t * chunk, n1 = std::min(N, n0 + chunk);
    if (n0 < n1) pool.emplace_back(fn, n0, n1);
  }
  for (auto& th : pool) th.join();
}

// Dot product with 8 independent partial sums (vectorizable without -ffast-math),
// combined in a fixed order: deterministic, and a row's result never depends on M.
template <typename Acc, typename X>
inline Acc Dot(const X* x, const Acc* w, int K) {
  Acc s[8] = {};
  int k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) s[j] += Acc(x[k + j]) * w[k + j];
  Acc t = 0;
  for (; k < K; ++k) t += Acc(x[k]) * w[k];
  return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + t;
}

// Shared driver: row(n, buf) fills buf[0..K) with dequantized weight row n (as Acc).
template <typename Acc, typename RowFn>
void LinearRows(const float* x, int M, int K, int N, float* y, RowFn row, float (*post)(int m, int n, Acc v, const void*) = nullptr,
                const void* ctx = nullptr) {
  ParallelOverN(N, double(M) * N * K, [&](int n0, int n1) {
    std::vector<Acc> wrow(K), xacc;
    const bool convert_x = !std::is_same_v<Acc, float>;
    if (convert_x) xacc.assign(x, x + size_t(M) * K);
    for (int n = n0; n < n1; ++n) {
      row(n, wrow.data());
      for (int m = 0; m < M; ++m) {
        const Acc s = convert_x ? Dot(xacc.data() + size_t(m) * K, wrow.data(), K) : Dot(x + size_t(m) * K, wrow.data(), K);
        y[size_t(m) * N + n] = post ? post(m, n, s, ctx) : float(s);
      }
    }
  });
}

}  // namespace

template <typename Acc>
void LinearRefBf16(const float* x, int M, int K, const uint16_t* w_bf16, int N, float* y) {
  LinearRows<Acc>(x, M, K, N, y, [&](int n, Acc* r) {
    const uint16_t* src = w_bf16 + size_t(n) * K;
    for (int k = 0; k < K; ++k) r[k] = Acc(Bf16ToFloat(src[k]));
  });
}

template <typename Acc>
void LinearRefF32(const float* x, int M, int K, const float* w, int N, float* y) {
  LinearRows<Acc>(x, M, K, N, y, [&](int n, Acc* r) {
    const float* src = w + size_t(n) * K;
    for (int k = 0; k < K; ++k) r[k] = Acc(src[k]);
  });
}

template <typename Acc>
void LinearRefInt4(const float* x, int M, const Int4Weights& w, float* y) {
  const int K = w.K, G = w.num_groups();
  LinearRows<Acc>(x, M, K, w.N, y, [&](int n, Acc* r) {
    const uint8_t* q = w.q.data() + size_t(n) * K;
    const float* s = w.scales.data() + size_t(n) * G;
    const float* z = w.zeros.data() + size_t(n) * G;
    if (w.g_idx.empty()) {
      for (int k0 = 0; k0 < K; k0 += w.group_size) {
        int g = k0 / w.group_size, k1 = std::min(K, k0 + w.group_size);
        for (int k = k0; k < k1; ++k) r[k] = Acc((float(q[k]) - z[g]) * s[g]);
      }
    } else {
      for (int k = 0; k < K; ++k) {
        int g = w.g_idx[k];
        r[k] = Acc((float(q[k]) - z[g]) * s[g]);
      }
    }
  });
}

template <typename Acc>
void LinearRefFp8W8A16(const float* x, int M, const Fp8Weights& w, float* y) {
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = Fp8E4M3ToFloat(uint8_t(i));
  LinearRows<Acc>(x, M, w.K, w.N, y, [&](int n, Acc* r) {
    const uint8_t* src = w.w.data() + size_t(n) * w.K;
    float s = w.scale_of(n);
    for (int k = 0; k < w.K; ++k) r[k] = Acc(lut[src[k]] * s);
  });
}

namespace {
// y = (xq·wqᵀ) * xs[m] * sw[n], with xq already quantized.
template <typename Acc>
void LinearFp8Quantized(const uint8_t* xq, const float* xs, int M, const Fp8Weights& w, float* y) {
  const int K = w.K;
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = Fp8E4M3ToFloat(uint8_t(i));
  std::vector<float> xd(size_t(M) * K);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = lut[xq[i]];
  struct Ctx { const float* xs; const Fp8Weights* w; } ctx{xs, &w};
  LinearRows<Acc>(
      xd.data(), M, K, w.N, y,
      [&](int n, Acc* r) {
        const uint8_t* src = w.w.data() + size_t(n) * K;
        for (int k = 0; k < K; ++k) r[k] = Acc(lut[src[k]]);
      },
      [](int m, int n, Acc v, const void* c) {
        auto* cx = static_cast<const Ctx*>(c);
        return float(v * Acc(cx->xs[m]) * Acc(cx->w->scale_of(n)));
      },
      &ctx);
}
}  // namespace

template <typename Acc>
void LinearRefFp8W8A8(const float* x, int M, const Fp8Weights& w, bool per_row_act, float* y) {
  std::vector<uint8_t> xq(size_t(M) * w.K);
  std::vector<float> xs(std::max(M, 1));
  QuantizeActFp8(x, M, w.K, per_row_act, xq.data(), xs.data());
  LinearFp8Quantized<Acc>(xq.data(), xs.data(), M, w, y);
}

template <typename Acc>
void LinearRefFp8W8A8Static(const float* x, int M, const Fp8Weights& w, float input_scale, float* y) {
  std::vector<uint8_t> xq(size_t(M) * w.K);
  std::vector<float> xs(std::max(M, 1), input_scale);
  for (size_t i = 0; i < xq.size(); ++i) xq[i] = FloatToFp8E4M3(x[i] / input_scale);
  LinearFp8Quantized<Acc>(xq.data(), xs.data(), M, w, y);
}

#define FQ_INSTANTIATE(Acc)                                                                          \
  template void LinearRefBf16<Acc>(const float*, int, int, const uint16_t*, int, float*);            \
  template void LinearRefF32<Acc>(const float*, int, int, const float*, int, float*);                \
  template void LinearRefInt4<Acc>(const float*, int, const Int4Weights&, float*);                   \
  template void LinearRefFp8W8A16<Acc>(const float*, int, const Fp8Weights&, float*);                \
  template void LinearRefFp8W8A8<Acc>(const float*, int, const Fp8Weights&, bool, float*);          \
  template void LinearRefFp8W8A8Static<Acc>(const float*, int, const Fp8Weights&, float, float*);
FQ_INSTANTIATE(float)
FQ_INSTANTIATE(double)
#undef FQ_INSTANTIATE

}  // namespace flashq::gemm
