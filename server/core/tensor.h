// Tensors as the server sees them: a KServe v2 datatype, a shape and bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/common/dtype.h"

namespace flashq::server {

// KServe v2 datatype string -> DType ("FP16", "BF16", "FP32", "INT32", ...).
std::optional<DType> ParseDType(std::string_view name);

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

// A decoded input: it points into the request's raw_input_contents (no copy).
struct InputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string_view data;
};

struct OutputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string data;
};

// Bytes [off, off + n) of a batch's output for one request. When the request owns the whole
// buffer (a batch of one) it is moved out instead of copied: outputs run to tens of MB.
inline std::string TakeSlice(std::string& all, size_t off, size_t n) {
  if (n == 0) return {};
  if (off == 0 && n == all.size()) return std::move(all);
  return all.substr(off, n);
}

// Element i of a FP16/BF16/FP32 buffer as float.
float LoadAsFloat(DType t, const void* data, int64_t i);
// Converts a whole FP16/BF16/FP32 buffer to float (appends to out).
void AppendAsFloat(DType t, std::string_view bytes, std::vector<float>* out);
// Stores floats in FP16/BF16/FP32 (round to nearest even), appending to out.
void AppendFromFloat(DType t, const float* src, int64_t n, std::string* out);

}  // namespace flashq::server
