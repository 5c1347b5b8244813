// Tensors as the server sees them: a KServe v2 datatype, a shape and bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace flashq::server {

// KServe v2 datatype string -> DType ("FP16", "BF16", "FP32", "INT32", ...).
std::optional<DType> ParseDType(std::string_view name);

int64_t NumElements(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

// Where bytes live: ordinary host memory, host memory page-locked for DMA (a system
// shared-memory region the backend registered with its GPUs), or memory of GPU `device`
// (a CUDA shared-memory region). The CUDA backend moves pinned and device bytes by DMA
// with no host copy, and host bytes through its pinned staging with one.
enum class MemoryKind : uint8_t { kHost, kPinned, kDevice };

struct ConstBytes {
  const char* data = nullptr;
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // kDevice only
};

inline ConstBytes HostBytes(std::string_view s) { return {s.data(), s.size()}; }

struct MutableBytes {
  char* data = nullptr;  // null: nobody asked for these bytes; they are dropped
  size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // kDevice only
};

// A decoded input: it points into the request's raw_input_contents, the transport's
// receive buffers or a shared-memory region (no copy).
struct InputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The bytes: one contiguous piece, or, for a tensor left in the transport's receive
  // buffers, host-memory `fragments` laid end to end (`data` is then empty). Only tensors
  // that a backend gathers (FP16, BF16, FP32) stay in fragments; the decoder joins others.
  std::string_view data;
  std::vector<std::string_view> fragments;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  // Appends the bytes to a batch's gather, as one piece or its fragments.
  void AppendTo(std::vector<ConstBytes>* pieces) const {
    if (fragments.empty()) {
      pieces->push_back({data.data(), data.size(), kind, device});
      return;
    }
    for (std::string_view f : fragments) pieces->push_back(HostBytes(f));
  }
};

struct OutputTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string data;
};

// Element i of a FP16/BF16/FP32 buffer as float.
float LoadAsFloat(DType t, const void* data, int64_t i);
// Converts a whole FP16/BF16/FP32 buffer to float (appends to out).
void AppendAsFloat(DType t, std::string_view bytes, std::vector<float>* out);
// Stores floats in FP16/BF16/FP32 (round to nearest even), appending to out.
void AppendFromFloat(DType t, const float* src, int64_t n, std::string* out);

}  // namespace flashq::server
