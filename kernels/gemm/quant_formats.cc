// Int4 / FP8 host formats, quantizers, and GPTQ / AWQ packers and loaders.
#include "kernels/gemm/quant_formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/dtype.h"

namespace flashq::gemm {
namespace {

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds column kAwqOrder[i]
constexpr int kAwqSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};   // column j sits in nibble kAwqSlot[j]

std::string Shape(int K, int N, int g) {
  return "K=" + std::to_string(K) + " N=" + std::to_string(N) + " group_size=" + std::to_string(g);
}

float RoundF16(float v) { return F16ToFloat(FloatToF16(v)); }

// Word i of packed little-endian int32 data at any alignment.
uint32_t Word(const void* base, size_t i) {
  uint32_t v;
  std::memcpy(&v, static_cast<const char*>(base) + 4 * i, 4);
  return v;
}

// Act-order g_idx [K]: every entry a group of the ceil(K / group_size) groups (a larger
// one is a malformed checkpoint; refusing it first bounds what is allocated), no group
// holding more than group_size channels. *G becomes max(g_idx) + 1.
Status CheckGIdx(const void* g_idx, int K, int group_size, const char* who, int* G) {
  const int groups = (K + group_size - 1) / group_size;
  std::vector<int> count(groups, 0);
  int mx = -1;
  for (int k = 0; k < K; ++k) {
    int32_t g = int32_t(Word(g_idx, k));
    if (g < 0 || g >= groups)
      return InvalidArgument(std::string(who) + ": g_idx entry " + std::to_string(g) + " is outside 0.." +
                             std::to_string(groups - 1) + " (ceil(K / group_size) groups)");
    if (++count[g] > group_size)
      return InvalidArgument(std::string(who) + ": g_idx assigns more than group_size channels to group " + std::to_string(g));
    mx = std::max(mx, int(g));
  }
  *G = mx + 1;
  return Status::Ok();
}

// Checks a checkpoint's act-order g_idx (CheckGIdx) and keeps it in w->g_idx, unless it is the
// trivial k / group_size, which is the plain layout.
Status TakeGIdx(const void* g_idx, int K, int group_size, const char* who, int* G, Int4Weights* w) {
  FQ_RETURN_IF_ERROR(CheckGIdx(g_idx, K, group_size, who, G));
  w->g_idx.resize(K);
  std::memcpy(w->g_idx.data(), g_idx, size_t(K) * 4);
  bool trivial = true;
  for (int k = 0; trivial && k < K; ++k) trivial = w->g_idx[k] == k / group_size;
  if (trivial) w->g_idx.clear();
  return Status::Ok();
}

Status CheckGroupShape(int K, int N, int group_size, const char* who) {
  if (K <= 0 || N <= 0) return InvalidArgument(std::string(who) + ": K and N must be positive (" + Shape(K, N, group_size) + ")");
  if (group_size <= 0) return InvalidArgument(std::string(who) + ": group_size must be positive (" + Shape(K, N, group_size) + ")");
  if (N % 8 != 0) return InvalidArgument(std::string(who) + ": N must be a multiple of 8 (zeros pack 8 columns per int32; " + Shape(K, N, group_size) + ")");
  return Status::Ok();
}

}  // namespace

float ScalesView::at(size_t i) const {
  const char* p = static_cast<const char*>(data);
  if (type == ScaleType::kF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return type == ScaleType::kF16 ? F16ToFloat(h) : Bf16ToFloat(h);
}

int Int4Weights::num_groups() const {
  if (!g_idx.empty()) {
    int mx = -1;
    for (int32_t g : g_idx) mx = std::max(mx, int(g));
    return mx + 1;
  }
  return group_size > 0 ? (K + group_size - 1) / group_size : 0;
}

Status Int4Weights::Validate() const {
  if (K <= 0 || N <= 0 || group_size <= 0) return InvalidArgument("Int4Weights: K, N, group_size must be positive (" + Shape(K, N, group_size) + ")");
  if (!g_idx.empty()) {
    if (g_idx.size() != size_t(K)) return InvalidArgument("Int4Weights: g_idx must hold K entries");
    for (int32_t g : g_idx)
      if (g < 0 || g >= (K + group_size - 1) / group_size)
        return InvalidArgument("Int4Weights: g_idx entries must be in 0..ceil(K / group_size) - 1");
  }
  const int G = num_groups();
  if (q.size() != size_t(N) * K) return InvalidArgument("Int4Weights: q must hold N*K values");
  if (scales.size() != size_t(N) * G || zeros.size() != size_t(N) * G)
    return InvalidArgument("Int4Weights: scales and zeros must hold N*num_groups values");
  for (uint8_t v : q)
    if (v > 15) return InvalidArgument("Int4Weights: q values must be 0..15");
  return Status::Ok();
}

Status Fp8Weights::Validate() const {
  if (K <= 0 || N <= 0) return InvalidArgument("Fp8Weights: K and N must be positive");
  if (w.size() != size_t(N) * K) return InvalidArgument("Fp8Weights: w must hold N*K bytes");
  if (scale.size() != 1 && scale.size() != size_t(N)) return InvalidArgument("Fp8Weights: scale must hold 1 or N floats");
  for (float s : scale)
    if (!std::isfinite(s) || s <= 0.0f) return InvalidArgument("Fp8Weights: scales must be finite and > 0");
  return Status::Ok();
}

Int4Weights QuantizeInt4(const float* w, int N, int K, int group_size, bool symmetric, const int32_t* g_idx) {
  Int4Weights out;
  out.K = K;
  out.N = N;
  out.group_size = group_size;
  if (g_idx) out.g_idx.assign(g_idx, g_idx + K);
  const int G = out.num_groups();
  out.q.assign(size_t(N) * K, 0);
  out.scales.assign(size_t(N) * G, 1.0f);
  out.zeros.assign(size_t(N) * G, symmetric ? 8.0f : 0.0f);
  std::vector<float> lo(G), hi(G);
  for (int n = 0; n < N; ++n) {
    const float* row = w + size_t(n) * K;
    std::fill(lo.begin(), lo.end(), 0.0f);  // include 0 so the grid always holds it
    std::fill(hi.begin(), hi.end(), 0.0f);
    for (int k = 0; k < K; ++k) {
      int g = out.group_of(k);
      lo[g] = std::min(lo[g], row[k]);
      hi[g] = std::max(hi[g], row[k]);
    }
    for (int g = 0; g < G; ++g) {
      float s, z;
      if (symmetric) {
        float amax = std::max(-lo[g], hi[g]);
        s = RoundF16(amax / 7.0f);
        z = 8.0f;
      } else {
        s = RoundF16((hi[g] - lo[g]) / 15.0f);
        z = s > 0 ? std::clamp(std::nearbyint(-lo[g] / s), 0.0f, 15.0f) : 8.0f;
      }
      if (!(s > 0)) s = 1.0f;
      out.scales[size_t(n) * G + g] = s;
      out.zeros[size_t(n) * G + g] = z;
    }
    for (int k = 0; k < K; ++k) {
      int g = out.group_of(k);
      float s = out.scales[size_t(n) * G + g], z = out.zeros[size_t(n) * G + g];
      out.q[size_t(n) * K + k] = uint8_t(std::clamp(std::nearbyint(row[k] / s) + z, 0.0f, 15.0f));
    }
  }
  return out;
}

Fp8Weights QuantizeFp8(const float* w, int N, int K, bool per_channel) {
  Fp8Weights out;
  out.K = K;
  out.N = N;
  out.w.resize(size_t(N) * K);
  auto amax_of = [&](int n0, int n1) {
    float a = 0;
    for (size_t i = size_t(n0) * K; i < size_t(n1) * K; ++i) a = std::max(a, std::fabs(w[i]));
    return a;
  };
  if (per_channel) {
    out.scale.resize(N);
    for (int n = 0; n < N; ++n) out.scale[n] = amax_of(n, n + 1) / 448.0f;
  } else {
    out.scale = {amax_of(0, N) / 448.0f};
  }
  for (float& s : out.scale)
    if (!(s > 0)) s = 1.0f;
  for (int n = 0; n < N; ++n) {
    float s = out.scale_of(n);
    for (int k = 0; k < K; ++k) out.w[size_t(n) * K + k] = FloatToFp8E4M3(w[size_t(n) * K + k] / s);
  }
  return out;
}

void QuantizeActFp8(const float* x, int M, int K, bool per_row, uint8_t* xq, float* scales) {
  float tensor_amax = 0;
  for (int m = 0; m < M; ++m) {
    float a = 0;
    for (int k = 0; k < K; ++k) a = std::max(a, std::fabs(x[size_t(m) * K + k]));
    scales[m] = a;
    tensor_amax = std::max(tensor_amax, a);
  }
  for (int m = 0; m < M; ++m) {
    float a = per_row ? scales[m] : tensor_amax;
    float s = a > 0 ? a / 448.0f : 1.0f;
    scales[m] = s;
    for (int k = 0; k < K; ++k) xq[size_t(m) * K + k] = FloatToFp8E4M3(x[size_t(m) * K + k] / s);
  }
}

std::vector<float> DequantizeInt4(const Int4Weights& w) {
  const int G = w.num_groups();
  std::vector<float> out(size_t(w.N) * w.K);
  for (int n = 0; n < w.N; ++n)
    for (int k = 0; k < w.K; ++k) {
      int g = w.group_of(k);
      out[size_t(n) * w.K + k] = (float(w.q[size_t(n) * w.K + k]) - w.zeros[size_t(n) * G + g]) * w.scales[size_t(n) * G + g];
    }
  return out;
}

std::vector<float> DequantizeFp8(const Fp8Weights& w) {
  std::vector<float> out(size_t(w.N) * w.K);
  for (int n = 0; n < w.N; ++n)
    for (int k = 0; k < w.K; ++k) out[size_t(n) * w.K + k] = Fp8E4M3ToFloat(w.w[size_t(n) * w.K + k]) * w.scale_of(n);
  return out;
}

// ---------------- GPTQ ----------------

GptqTensors PackGptq(const Int4Weights& w, bool v1) {
  GptqTensors t;
  t.K = w.K;
  t.N = w.N;
  t.group_size = w.group_size;
  t.v1 = v1;
  t.g_idx = w.g_idx;
  const int G = w.num_groups(), K8 = (w.K + 7) / 8, N8 = (w.N + 7) / 8;
  t.qweight.assign(size_t(K8) * w.N, 0);
  for (int k = 0; k < w.K; ++k)
    for (int n = 0; n < w.N; ++n) {
      uint32_t v = w.q[size_t(n) * w.K + k] & 0xFu;
      uint32_t& word = reinterpret_cast<uint32_t&>(t.qweight[size_t(k / 8) * w.N + n]);
      word |= v << (4 * (k % 8));
    }
  t.qzeros.assign(size_t(G) * N8, 0);
  t.scales_f16.assign(size_t(G) * w.N, 0);
  for (int g = 0; g < G; ++g)
    for (int n = 0; n < w.N; ++n) {
      int z = int(std::nearbyint(w.zeros[size_t(n) * G + g]));
      uint32_t stored = uint32_t(v1 ? z - 1 : z) & 0xFu;
      uint32_t& word = reinterpret_cast<uint32_t&>(t.qzeros[size_t(g) * N8 + n / 8]);
      word |= stored << (4 * (n % 8));
      t.scales_f16[size_t(g) * w.N + n] = FloatToF16(w.scales[size_t(n) * G + g]);
    }
  return t;
}

Status UnpackGptq(const GptqTensors& t, Int4Weights* out) {
  FQ_RETURN_IF_ERROR(CheckGroupShape(t.K, t.N, t.group_size, "GPTQ"));
  const int K8 = (t.K + 7) / 8, N8 = t.N / 8;
  if (t.qweight.size() != size_t(K8) * t.N)
    return InvalidArgument("GPTQ: qweight must be int32 [ceil(K/8), N] = [" + std::to_string(K8) + ", " + std::to_string(t.N) + "], got " + std::to_string(t.qweight.size()) + " elements");
  if (!t.g_idx.empty() && t.g_idx.size() != size_t(t.K))
    return InvalidArgument("GPTQ: g_idx must be int32 [K] = [" + std::to_string(t.K) + "]");
  int G = (t.K + t.group_size - 1) / t.group_size;
  if (!t.g_idx.empty()) FQ_RETURN_IF_ERROR(CheckGIdx(t.g_idx.data(), t.K, t.group_size, "GPTQ", &G));
  if (t.qzeros.size() != size_t(G) * N8)
    return InvalidArgument("GPTQ: qzeros must be int32 [G, N/8] = [" + std::to_string(G) + ", " + std::to_string(N8) + "]");
  if (t.scales_f16.size() != size_t(G) * t.N)
    return InvalidArgument("GPTQ: scales must be fp16 [G, N] = [" + std::to_string(G) + ", " + std::to_string(t.N) + "]");
  GptqView v;
  v.qweight = t.qweight.data();
  v.qzeros = t.qzeros.data();
  v.g_idx = t.g_idx.empty() ? nullptr : t.g_idx.data();
  v.scales = {t.scales_f16.data(), ScaleType::kF16};
  v.K = t.K;
  v.N = t.N;
  v.group_size = t.group_size;
  v.v1 = t.v1;
  return UnpackGptq(v, out);
}

Status UnpackGptq(const GptqView& v, Int4Weights* out) {
  FQ_RETURN_IF_ERROR(CheckGroupShape(v.K, v.N, v.group_size, "GPTQ"));
  const int K = v.K, N = v.N, K8 = (K + 7) / 8, N8 = N / 8;
  int G = (K + v.group_size - 1) / v.group_size;
  Int4Weights w;
  w.K = K;
  w.N = N;
  w.group_size = v.group_size;
  if (v.g_idx) FQ_RETURN_IF_ERROR(TakeGIdx(v.g_idx, K, v.group_size, "GPTQ", &G, &w));
  if (K % 8 != 0) {  // padding nibbles of the last row must be zero
    for (int n = 0; n < N; ++n)
      if (Word(v.qweight, size_t(K8 - 1) * N + n) >> (4 * (K % 8)))
        return InvalidArgument("GPTQ: qweight padding nibbles beyond K must be zero");
  }
  // qweight is [K/8][N] and q is [N][K]: a transpose, done in tiles that stay in cache.
  w.q.resize(size_t(N) * K);
  constexpr int kTileN = 64, kTileR = 64;
  for (int n0 = 0; n0 < N; n0 += kTileN)
    for (int r0 = 0; r0 < K8; r0 += kTileR)
      for (int r = r0; r < std::min(K8, r0 + kTileR); ++r)
        for (int n = n0; n < std::min(N, n0 + kTileN); ++n) {
          const uint32_t word = Word(v.qweight, size_t(r) * N + n);
          uint8_t* dst = w.q.data() + size_t(n) * K + 8 * r;
          const int count = std::min(8, K - 8 * r);
          for (int i = 0; i < count; ++i) dst[i] = uint8_t((word >> (4 * i)) & 0xFu);
        }
  w.scales.resize(size_t(N) * G);
  w.zeros.resize(size_t(N) * G);
  for (int g = 0; g < G; ++g)
    for (int n = 0; n < N; ++n) {
      const uint32_t z = (Word(v.qzeros, size_t(g) * N8 + n / 8) >> (4 * (n % 8))) & 0xFu;
      w.zeros[size_t(n) * G + g] = float(v.v1 ? z + 1 : z);
      const float s = v.scales.at(size_t(g) * N + n);
      if (!std::isfinite(s)) return InvalidArgument("GPTQ: scales must be finite (group " + std::to_string(g) + ", column " + std::to_string(n) + ")");
      w.scales[size_t(n) * G + g] = s;
    }
  *out = std::move(w);
  return Status::Ok();
}

// ---------------- AWQ ----------------

AwqTensors PackAwq(const Int4Weights& w) {
  AwqTensors t;
  t.K = w.K;
  t.N = w.N;
  t.group_size = w.group_size;
  const int G = w.num_groups(), N8 = (w.N + 7) / 8;
  t.qweight.assign(size_t(w.K) * N8, 0);
  for (int k = 0; k < w.K; ++k)
    for (int n = 0; n < w.N; ++n) {
      uint32_t& word = reinterpret_cast<uint32_t&>(t.qweight[size_t(k) * N8 + n / 8]);
      word |= uint32_t(w.q[size_t(n) * w.K + k] & 0xFu) << (4 * kAwqSlot[n % 8]);
    }
  t.qzeros.assign(size_t(G) * N8, 0);
  t.scales_f16.assign(size_t(G) * w.N, 0);
  for (int g = 0; g < G; ++g)
    for (int n = 0; n < w.N; ++n) {
      uint32_t z = uint32_t(int(std::nearbyint(w.zeros[size_t(n) * G + g]))) & 0xFu;
      uint32_t& word = reinterpret_cast<uint32_t&>(t.qzeros[size_t(g) * N8 + n / 8]);
      word |= z << (4 * kAwqSlot[n % 8]);
      t.scales_f16[size_t(g) * w.N + n] = FloatToF16(w.scales[size_t(n) * G + g]);
    }
  return t;
}

Status UnpackAwq(const AwqTensors& t, Int4Weights* out) {
  FQ_RETURN_IF_ERROR(CheckGroupShape(t.K, t.N, t.group_size, "AWQ"));
  const int N8 = t.N / 8, G = (t.K + t.group_size - 1) / t.group_size;
  if (t.qweight.size() != size_t(t.K) * N8)
    return InvalidArgument("AWQ: qweight must be int32 [K, N/8] = [" + std::to_string(t.K) + ", " + std::to_string(N8) + "]");
  if (t.qzeros.size() != size_t(G) * N8)
    return InvalidArgument("AWQ: qzeros must be int32 [ceil(K/group_size), N/8] = [" + std::to_string(G) + ", " + std::to_string(N8) + "]");
  if (t.scales_f16.size() != size_t(G) * t.N)
    return InvalidArgument("AWQ: scales must be fp16 [ceil(K/group_size), N] = [" + std::to_string(G) + ", " + std::to_string(t.N) + "]");
  AwqView v;
  v.qweight = t.qweight.data();
  v.qzeros = t.qzeros.data();
  v.scales = {t.scales_f16.data(), ScaleType::kF16};
  v.K = t.K;
  v.N = t.N;
  v.group_size = t.group_size;
  return UnpackAwq(v, out);
}

Status UnpackAwq(const AwqView& v, Int4Weights* out) {
  FQ_RETURN_IF_ERROR(CheckGroupShape(v.K, v.N, v.group_size, "AWQ"));
  const int K = v.K, N = v.N, N8 = N / 8, G = (K + v.group_size - 1) / v.group_size;
  Int4Weights w;
  w.K = K;
  w.N = N;
  w.group_size = v.group_size;
  w.q.resize(size_t(N) * K);
  constexpr int kTileK = 256, kTileC = 8;
  for (int c0 = 0; c0 < N8; c0 += kTileC)
    for (int k0 = 0; k0 < K; k0 += kTileK)
      for (int c = c0; c < std::min(N8, c0 + kTileC); ++c)
        for (int k = k0; k < std::min(K, k0 + kTileK); ++k) {
          const uint32_t word = Word(v.qweight, size_t(k) * N8 + c);
          for (int i = 0; i < 8; ++i) w.q[size_t(8 * c + kAwqOrder[i]) * K + k] = uint8_t((word >> (4 * i)) & 0xFu);
        }
  w.scales.resize(size_t(N) * G);
  w.zeros.resize(size_t(N) * G);
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < N8; ++c) {
      const uint32_t word = Word(v.qzeros, size_t(g) * N8 + c);
      for (int i = 0; i < 8; ++i) {
        const int n = 8 * c + kAwqOrder[i];
        w.zeros[size_t(n) * G + g] = float((word >> (4 * i)) & 0xFu);
        const float s = v.scales.at(size_t(g) * N + n);
        if (!std::isfinite(s)) return InvalidArgument("AWQ: scales must be finite (group " + std::to_string(g) + ", column " + std::to_string(n) + ")");
        w.scales[size_t(n) * G + g] = s;
      }
    }
  *out = std::move(w);
  return Status::Ok();
}

// ---------------- compressed-tensors pack-quantized ----------------

Status UnpackPackQuantized(const PackQuantizedView& v, Int4Weights* out) {
  const int K = v.K, N = v.N;
  if (K <= 0 || N <= 0 || v.group_size <= 0)
    return InvalidArgument("pack-quantized: K, N and group_size must be positive (" + Shape(K, N, v.group_size) + ")");
  const int K8 = (K + 7) / 8;
  int G = (K + v.group_size - 1) / v.group_size;
  Int4Weights w;
  w.K = K;
  w.N = N;
  w.group_size = v.group_size;
  if (v.g_idx) FQ_RETURN_IF_ERROR(TakeGIdx(v.g_idx, K, v.group_size, "pack-quantized", &G, &w));
  w.q.resize(size_t(N) * K);
  for (int n = 0; n < N; ++n) {
    uint8_t* dst = w.q.data() + size_t(n) * K;
    for (int c = 0; c < K8; ++c) {
      const uint32_t word = Word(v.weight_packed, size_t(n) * K8 + c);
      const int count = std::min(8, K - 8 * c);
      if (count < 8 && (word >> (4 * count)) != 0)
        return InvalidArgument("pack-quantized: weight_packed padding nibbles beyond K must be zero (row " + std::to_string(n) + ")");
      for (int i = 0; i < count; ++i) dst[8 * c + i] = uint8_t((word >> (4 * i)) & 0xFu);
    }
  }
  w.scales.resize(size_t(N) * G);
  w.zeros.resize(size_t(N) * G);
  for (int n = 0; n < N; ++n)
    for (int g = 0; g < G; ++g) {
      float z = 8.0f;  // symmetric: zero point 0, stored with the +8 offset
      if (v.zero_point) z = float((Word(v.zero_point, size_t(n / 8) * G + g) >> (4 * (n % 8))) & 0xFu);
      w.zeros[size_t(n) * G + g] = z;
      const float s = v.scales.at(size_t(n) * G + g);
      if (!std::isfinite(s)) return InvalidArgument("pack-quantized: weight_scale must be finite (row " + std::to_string(n) + ", group " + std::to_string(g) + ")");
      w.scales[size_t(n) * G + g] = s;
    }
  *out = std::move(w);
  return Status::Ok();
}

}  // namespace flashq::gemm
