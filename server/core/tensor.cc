#include "server/core/tensor.h"

#include <cstring>

namespace flashq::server {

std::optional<DType> ParseDType(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI64, DType::kU8}) {
    if (DTypeName(t) == name) return t;
  }
  return std::nullopt;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

float LoadAsFloat(DType t, const void* data, int64_t i) {
  switch (t) {
    case DType::kF16: { uint16_t h; std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2); return F16ToFloat(h); }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2); return Bf16ToFloat(h); }
    case DType::kF32: { float f; std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4); return f; }
    default: return 0.0f;
  }
}

void AppendAsFloat(DType t, std::string_view bytes, std::vector<float>* out) {
  const int64_t n = int64_t(bytes.size()) / DTypeSize(t);
  if (n == 0) return;  // an empty vector's data() may be null, and memcpy from null is undefined
  const size_t base = out->size();
  out->resize(base + n);
  float* dst = out->data() + base;
  if (t == DType::kF32) { std::memcpy(dst, bytes.data(), n * 4); return; }
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsFloat(t, bytes.data(), i);
}

void AppendFromFloat(DType t, const float* src, int64_t n, std::string* out) {
  const size_t base = out->size();
  out->resize(base + n * DTypeSize(t));
  char* dst = out->data() + base;
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * 4); break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = FloatToF16(src[i]); std::memcpy(dst + 2 * i, &h, 2); }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = FloatToBf16(src[i]); std::memcpy(dst + 2 * i, &h, 2); }
      break;
    default: break;
  }
}

}  // namespace flashq::server
