// Element types and exact host-side conversions (round to nearest even), shared by
// the CPU references, the server's tensor decoding and the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace flashq {

enum class DType { kF32, kF16, kBF16, kF8E4M3, kI32, kI64, kU8 };

constexpr int DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

// KServe v2 datatype strings (const char*: Debian's Abseil has its own string_view).
constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "FP32";
    case DType::kF16: return "FP16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "FP8_E4M3";
    case DType::kI32: return "INT32";
    case DType::kI64: return "INT64";
    case DType::kU8: return "UINT8";
  }
  return "?";
}

inline uint32_t FloatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float BitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(uint32_t(h) << 16); }
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float F16ToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t FloatToF16(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (a < 0x38800000u) {                         // subnormal or zero in fp16
    float v = BitsFloat(a);
    float scaled = v * 16777216.0f;              // 2^24: units of the fp16 subnormal step
    return sign | uint16_t(std::nearbyint(scaled));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return sign | uint16_t((r - 0x38000000u) >> 13);
}

// FP8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN, max 448).
inline float Fp8E4M3ToFloat(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  float r;
  if (exp == 0xf && man == 0x7) r = NAN;
  else if (exp == 0) r = std::ldexp(float(man), -9);
  else r = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
  return sign ? -r : r;
}

inline uint8_t FloatToFp8E4M3(float f) {  // saturating, round to nearest even
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;
  int e;
  std::frexp(a, &e);                 // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 7;               // biased exponent of a normal number
  float step = exp <= 0 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, e - 1 - 3);
  float q = std::nearbyint(a / step) * step;
  if (q == 0.0f) return sign;
  std::frexp(q, &e);
  exp = e - 1 + 7;
  if (exp <= 0) return sign | uint8_t(q / std::ldexp(1.0f, -9));
  uint8_t man = uint8_t((q / std::ldexp(1.0f, e - 1) - 1.0f) * 8.0f);
  return sign | uint8_t(exp << 3) | man;
}

// Round a float through a storage type and back (what a kernel's output would hold).
inline float RoundThrough(DType t, float v) {
  switch (t) {
    case DType::kF16: return F16ToFloat(FloatToF16(v));
    case DType::kBF16: return Bf16ToFloat(FloatToBf16(v));
    case DType::kF8E4M3: return Fp8E4M3ToFloat(FloatToFp8E4M3(v));
    default: return v;
  }
}

}  // namespace flashq
