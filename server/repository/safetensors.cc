// safetensors reader (one read-only mmap) and writer. The JSON header is parsed in the
// dialect that accepts exactly what safetensors headers hold: objects, arrays, strings
// and non-negative integers (plus the free-form "__metadata__" object of strings, which
// we skip). Like the reference implementation, the tensors must tile the data section:
// no overlap, no hole, nothing after the last one.
#include "server/repository/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/repository/json.h"

namespace flashq::server {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

int64_t DtypeBytes(std::string_view dtype) {
  static const std::pair<std::string_view, int> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8}, {"U64", 8},
      {"F64", 8}};
  for (const auto& [name, size] : kSizes)
    if (name == dtype) return size;
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

// Checks one header entry and fills `t` (data still relative to the data section).
absl::Status ParseTensorEntry(const std::string& name, const JsonValue& v, uint64_t data_size, SafeTensor* t,
                              uint64_t* begin, uint64_t* end) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", what));
  };
  if (!v.is_object()) return bad("header entry is not an object");
  const JsonValue* dtype = nullptr;
  const JsonValue* shape = nullptr;
  const JsonValue* offsets = nullptr;
  for (const auto& [k, val] : v.as_object()) {
    if (k == "dtype") dtype = &val;
    else if (k == "shape") shape = &val;
    else if (k == "data_offsets") offsets = &val;
    else return bad(absl::StrCat("unknown key '", k, "'"));
  }
  if (!dtype || !shape || !offsets) return bad("needs dtype, shape and data_offsets");
  if (!dtype->is_string()) return bad("dtype is not a string");
  t->dtype = dtype->as_string();
  int64_t elem = DtypeBytes(t->dtype);
  if (elem == 0) return bad(absl::StrCat("unknown dtype '", t->dtype, "'"));
  if (!shape->is_array()) return bad("shape is not an array");
  t->shape.clear();
  uint64_t numel = 1;
  for (const JsonValue& d : shape->as_array()) {
    if (!d.is_int()) return bad("shape holds a non-integer");
    int64_t n = d.as_int();
    t->shape.push_back(n);
    if (n != 0 && numel > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(n)) return bad("shape overflows");
    numel *= uint64_t(n);
  }
  if (!offsets->is_array() || offsets->as_array().size() != 2 || !offsets->as_array()[0].is_int() ||
      !offsets->as_array()[1].is_int())
    return bad("data_offsets must be [begin, end]");
  *begin = uint64_t(offsets->as_array()[0].as_int());
  *end = uint64_t(offsets->as_array()[1].as_int());
  if (*begin > *end) return bad(absl::StrCat("data_offsets [", *begin, ", ", *end, "] are reversed"));
  if (*end > data_size)
    return bad(absl::StrCat("data_offsets [", *begin, ", ", *end, "] run past the data section (", data_size,
                            " bytes)"));
  if (numel > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(elem)) return bad("shape overflows");
  if (numel * uint64_t(elem) != *end - *begin)
    return bad(absl::StrCat("shape ", ShapeString(t->shape), " of ", t->dtype, " needs ", numel * uint64_t(elem),
                            " bytes but data_offsets span ", *end - *begin));
  return absl::OkStatus();
}

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    std::string msg = absl::StrCat("cannot stat ", path, ": ", std::strerror(errno));
    ::close(fd);
    return absl::InternalError(msg);
  }
  const uint64_t size = uint64_t(st.st_size);
  auto corrupt = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", what));
  };
  if (size < 8) {
    ::close(fd);
    return corrupt(absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(errno)));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->map_ = map;
  file->map_size_ = size;
  const char* bytes = static_cast<const char*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_len > kMaxHeaderBytes)
    return corrupt(absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes));
  if (header_len > size - 8)
    return corrupt(absl::StrCat("header length ", header_len, " exceeds the file size ", size, " minus 8"));
  if (header_len < 2 || bytes[8] != '{') return corrupt("the header does not start with '{'");
  auto doc = ParseJson(std::string_view(bytes + 8, header_len), JsonDialect::kSafetensorsHeader);
  if (!doc.ok()) return corrupt(doc.status().message());
  if (!doc->is_object()) return corrupt("the header is not a JSON object");

  const uint64_t data_size = size - 8 - header_len;
  const char* data = bytes + 8 + header_len;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
  for (const auto& [name, v] : doc->as_object()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return corrupt("__metadata__ is not an object");
      continue;
    }
    SafeTensor t;
    uint64_t begin = 0, end = 0;
    absl::Status s = ParseTensorEntry(name, v, data_size, &t, &begin, &end);
    if (!s.ok()) return corrupt(s.message());
    t.data = std::string_view(data + begin, end - begin);
    if (!file->tensors_.emplace(name, std::move(t)).second)
      return corrupt(absl::StrCat("tensor '", name, "' appears twice"));
    ranges.emplace_back(begin, end, name);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto& [begin, end, name] = ranges[i];
    if (i > 0 && begin < std::get<1>(ranges[i - 1]))
      return corrupt(absl::StrCat("tensors '", std::get<2>(ranges[i - 1]), "' and '", name, "' overlap"));
    if (begin != covered)
      return corrupt(absl::StrCat("tensor '", name, "' starts at data offset ", begin, ", but the tensors before it end at ",
                                  covered, " (the data section has a hole)"));
    covered = end;
  }
  if (covered != data_size)
    return corrupt(absl::StrCat("the tensors end at data offset ", covered, " but the data section holds ", data_size,
                                " bytes"));
  file->path_ = path;
  return file;
}

absl::StatusOr<SafeTensor> SafetensorsFile::Get(const std::string& name, std::string_view dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : tensors_) {
      if (names.size() == 20) {
        names.push_back(absl::StrCat("... ", tensors_.size() - 20, " more"));
        break;
      }
      names.push_back(n);
    }
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in ", path_, " (it holds: ", absl::StrJoin(names, ", "),
                                            ")"));
  }
  if (!dtype.empty() && it->second.dtype != dtype)
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ", it->second.dtype, " shape ",
                                                   ShapeString(it->second.shape), ", expected dtype ", std::string(dtype)));
  return it->second;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafeTensorToWrite>& tensors) {
  std::string header = "{";
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafeTensorToWrite& t = tensors[i];
    int64_t elem = DtypeBytes(t.dtype);
    if (elem == 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': unknown dtype '", t.dtype, "'"));
    if (t.name == "__metadata__") return absl::InvalidArgumentError("'__metadata__' is reserved");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': negative dimension"));
      numel *= d;
    }
    if (uint64_t(numel * elem) != t.data.size())
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': shape ", ShapeString(t.shape), " of ",
                                                     t.dtype, " needs ", numel * elem, " bytes, got ", t.data.size()));
    if (i > 0) header += ",";
    AppendJsonString(t.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", t.dtype, "\",\"shape\":", ShapeString(t.shape),
                    ",\"data_offsets\":[", offset, ",", offset + t.data.size(), "]}");
    offset += t.data.size();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';  // keeps the data section 8-byte aligned

  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (size_t i = 0; ok && i < tensors.size(); ++i)
    if (!tensors[i].data.empty())  // fwrite's pointer must not be null, even for 0 bytes
      ok = std::fwrite(tensors[i].data.data(), 1, tensors[i].data.size(), f) == tensors[i].data.size();
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  return absl::OkStatus();
}

}  // namespace flashq::server
