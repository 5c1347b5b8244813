// safetensors files: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw data. We read them with
// one read-only mmap (tensors are views into it) and write them for the demo repository.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::server {

struct SafeTensor {
  std::string dtype;             // safetensors names: "BF16", "F16", "F32", "I32", "F8_E4M3", "U8"
  std::vector<int64_t> shape;
  std::string_view data;         // points into the mapped file
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, SafeTensor>& tensors() const { return tensors_; }
  // NOT_FOUND / INVALID_ARGUMENT naming the tensor, the expected and the found dtype/shape.
  absl::StatusOr<SafeTensor> Get(const std::string& name, std::string_view dtype) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, SafeTensor> tensors_;
};

struct SafeTensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string_view data;
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafeTensorToWrite>& tensors);

}  // namespace flashq::server
