// A float64 attention reference that shares no code with the implementation: not the CPU
// backend's AttendRows/VarlenAttentionRef templates, not the server's dtype conversions. Plain
// loops over doubles, written from the definition: o_i = sum_j softmax_j(scale * q_i . k_j) v_j,
// causal masks aligned bottom-right (query i of lq sees keys j <= i + lk - lq), GQA query head h
// reads kv head h / (Hq / Hkv). The 16-bit decoders and round-to-nearest-even encoders are
// written here from the IEEE / bfloat16 bit layouts for the same reason.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace flashq::plainref {

enum class Half { kF16, kBF16 };

inline double DecodeBf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double DecodeF16(uint16_t b) {
  const int sign = b >> 15, exp = (b >> 10) & 0x1f, man = b & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(double(man), -24);                    // subnormal
  else if (exp == 31) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(double(man | 0x400), exp - 25);
  return sign ? -v : v;
}

inline double Decode(Half t, uint16_t b) { return t == Half::kBF16 ? DecodeBf16(b) : DecodeF16(b); }

// Nearest value with `bits` significant bits (ties to even) and exponent >= min_exp (the
// subnormal spacing is 2^(min_exp - bits + 1)); overflow to infinity above max_finite.
inline double RoundToPrecision(double x, int bits, int min_exp, double max_finite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, exp - bits + 1);
  const double r = std::nearbyint(x / ulp) * ulp;  // the default rounding mode is to nearest even
  return std::fabs(r) > max_finite ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

inline double RoundTo(Half t, double x) {
  return t == Half::kBF16 ? RoundToPrecision(x, 8, -126, 3.3895313892515355e38) : RoundToPrecision(x, 11, -14, 65504.0);
}

inline uint16_t EncodeBits(Half t, double x) {  // exact: x already rounded to the dtype
  if (t == Half::kBF16) {
    const float f = float(x);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
  }
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | 0x7c00;
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  if (e - 1 < -14) return sign | uint16_t(std::ldexp(a, 24));  // subnormal
  return sign | uint16_t((e - 1 + 15) << 10) | uint16_t(std::ldexp(m, 11) - 1024);
}

inline std::vector<double> DecodeAll(Half t, std::string_view bytes) {
  std::vector<double> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    out[i] = Decode(t, b);
  }
  return out;
}

// Varlen attention. q [total_q][hq][d], k/v [total_k][hkv][d]; o [total_q][hq][d]; lse [hq][total_q].
// A row that sees no key gets o = 0 and lse = -inf.
inline void Attention(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                      const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k, int hq, int hkv, int d,
                      double scale, bool causal, std::vector<double>* o, std::vector<double>* lse) {
  const int total_q = cu_q.back();
  o->assign(size_t(total_q) * hq * d, 0.0);
  lse->assign(size_t(hq) * total_q, -std::numeric_limits<double>::infinity());
  for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const int lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
    for (int i = 0; i < lq; ++i) {
      const int visible = causal ? std::min(lk, std::max(0, i + lk - lq + 1)) : lk;
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / (hq / hkv);
        const double* qi = &q[(size_t(cu_q[s] + i) * hq + h) * d];
        std::vector<double> score(static_cast<size_t>(visible));
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < visible; ++j) {
          const double* kj = &k[(size_t(cu_k[s] + j) * hkv + kvh) * d];
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += qi[c] * kj[c];
          score[size_t(j)] = scale * dot;
          mx = std::max(mx, score[size_t(j)]);
        }
        if (visible == 0) continue;
        double sum = 0;
        double* oi = &(*o)[(size_t(cu_q[s] + i) * hq + h) * d];
        for (int j = 0; j < visible; ++j) {
          const double p = std::exp(score[size_t(j)] - mx);
          sum += p;
          const double* vj = &v[(size_t(cu_k[s] + j) * hkv + kvh) * d];
          for (int c = 0; c < d; ++c) oi[c] += p * vj[c];
        }
        for (int c = 0; c < d; ++c) oi[c] /= sum;
        (*lse)[size_t(h) * total_q + cu_q[s] + i] = mx + std::log(sum);
      }
    }
  }
}

// Elements of `got` (16-bit bits in `t`) outside atol + rtol * |ref rounded to t|; the first few
// are described in *why.
inline int CountOutside(Half t, std::string_view got, const std::vector<double>& ref, double atol, double rtol,
                        std::string* why) {
  if (got.size() != 2 * ref.size()) {
    *why = "size " + std::to_string(got.size() / 2) + ", expected " + std::to_string(ref.size());
    return int(ref.size()) + 1;
  }
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, got.data() + 2 * i, 2);
    const double g = Decode(t, b), r = RoundTo(t, ref[i]);
    if (!(std::fabs(g - r) <= atol + rtol * std::fabs(r))) {  // NaN fails too
      if (++bad <= 5) *why += "element " + std::to_string(i) + ": " + std::to_string(g) + " vs " + std::to_string(r) + "; ";
    }
  }
  return bad;
}

}  // namespace flashq::plainref
