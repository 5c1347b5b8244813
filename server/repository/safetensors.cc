// safetensors reader (one read-only mmap) and writer. The JSON header is parsed by
// a small parser that accepts exactly what safetensors headers hold: objects,
// arrays, strings and non-negative integers (plus the free-form "__metadata__"
// object of strings, which we skip).
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
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

// ---- minimal JSON ---------------------------------------------------------------

struct JsonValue;
using JsonObject = std::vector<std::pair<std::string, JsonValue>>;  // keeps the file's order
using JsonArray = std::vector<JsonValue>;
struct JsonValue {
  std::variant<std::string, int64_t, JsonArray, JsonObject> v;
  bool is_string() const { return v.index() == 0; }
  bool is_int() const { return v.index() == 1; }
  bool is_array() const { return v.index() == 2; }
  bool is_object() const { return v.index() == 3; }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    if (!ParseValue(&v, 0)) return Error();
    SkipWs();
    if (pos_ != s_.size()) {
      err_ = "trailing characters after the JSON value";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON header at byte ", pos_, ": ", err_));
  }
  void SkipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Fail(std::string msg) {
    if (err_.empty()) err_ = std::move(msg);
    return false;
  }

  bool ParseValue(JsonValue* out, int depth) {
    if (depth > 16) return Fail("nested too deeply");
    SkipWs();
    if (pos_ >= s_.size()) return Fail("unexpected end of header");
    char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      JsonObject obj;
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        out->v = std::move(obj);
        return true;
      }
      for (;;) {
        SkipWs();
        std::string key;
        if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a string key");
        if (!ParseString(&key)) return false;
        SkipWs();
        if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
        ++pos_;
        JsonValue v;
        if (!ParseValue(&v, depth + 1)) return false;
        obj.emplace_back(std::move(key), std::move(v));
        SkipWs();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; break; }
        return Fail("expected ',' or '}'");
      }
      out->v = std::move(obj);
      return true;
    }
    if (c == '[') {
      ++pos_;
      JsonArray arr;
      SkipWs();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        out->v = std::move(arr);
        return true;
      }
      for (;;) {
        JsonValue v;
        if (!ParseValue(&v, depth + 1)) return false;
        arr.push_back(std::move(v));
        SkipWs();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; break; }
        return Fail("expected ',' or ']'");
      }
      out->v = std::move(arr);
      return true;
    }
    if (c == '"') {
      std::string str;
      if (!ParseString(&str)) return false;
      out->v = std::move(str);
      return true;
    }
    if (c >= '0' && c <= '9') {
      uint64_t n = 0;
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        uint64_t d = uint64_t(s_[pos_] - '0');
        if (n > (uint64_t(std::numeric_limits<int64_t>::max()) - d) / 10) return Fail("integer too large");
        n = n * 10 + d;
        ++pos_;
      }
      if (s_[start] == '0' && pos_ - start > 1) return Fail("leading zero in an integer");
      if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
        return Fail("only integers are supported");
      out->v = int64_t(n);
      return true;
    }
    if (c == '-') return Fail("negative numbers are not valid here");
    return Fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(char(cp));
    } else if (cp < 0x800) {
      out->push_back(char(0xc0 | (cp >> 6)));
      out->push_back(char(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(char(0xe0 | (cp >> 12)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(char(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(char(0xf0 | (cp >> 18)));
      out->push_back(char(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(char(0x80 | (cp & 0x3f)));
    }
  }

  bool ParseHex4(uint32_t* cp) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else return Fail("bad \\u escape");
    }
    *cp = v;
    return true;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // opening quote
    for (;;) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Fail("unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // surrogate pair
            uint32_t lo;
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') return Fail("lone surrogate");
            pos_ += 2;
            if (!ParseHex4(&lo)) return false;
            if (lo < 0xdc00 || lo >= 0xe000) return Fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return Fail("bad escape in a string");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string err_;
};

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
      out->append(buf);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
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
  for (const auto& [k, val] : std::get<JsonObject>(v.v)) {
    if (k == "dtype") dtype = &val;
    else if (k == "shape") shape = &val;
    else if (k == "data_offsets") offsets = &val;
    else return bad(absl::StrCat("unknown key '", k, "'"));
  }
  if (!dtype || !shape || !offsets) return bad("needs dtype, shape and data_offsets");
  if (!dtype->is_string()) return bad("dtype is not a string");
  t->dtype = std::get<std::string>(dtype->v);
  int64_t elem = DtypeBytes(t->dtype);
  if (elem == 0) return bad(absl::StrCat("unknown dtype '", t->dtype, "'"));
  if (!shape->is_array()) return bad("shape is not an array");
  t->shape.clear();
  uint64_t numel = 1;
  for (const JsonValue& d : std::get<JsonArray>(shape->v)) {
    if (!d.is_int()) return bad("shape holds a non-integer");
    int64_t n = std::get<int64_t>(d.v);
    t->shape.push_back(n);
    if (n != 0 && numel > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(n)) return bad("shape overflows");
    numel *= uint64_t(n);
  }
  if (!offsets->is_array() || std::get<JsonArray>(offsets->v).size() != 2 ||
      !std::get<JsonArray>(offsets->v)[0].is_int() || !std::get<JsonArray>(offsets->v)[1].is_int())
    return bad("data_offsets must be [begin, end]");
  *begin = uint64_t(std::get<int64_t>(std::get<JsonArray>(offsets->v)[0].v));
  *end = uint64_t(std::get<int64_t>(std::get<JsonArray>(offsets->v)[1].v));
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
  auto doc = JsonParser(std::string_view(bytes + 8, header_len)).ParseDocument();
  if (!doc.ok()) return corrupt(doc.status().message());
  if (!doc->is_object()) return corrupt("the header is not a JSON object");

  const uint64_t data_size = size - 8 - header_len;
  const char* data = bytes + 8 + header_len;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
  for (const auto& [name, v] : std::get<JsonObject>(doc->v)) {
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
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (std::get<0>(ranges[i]) < std::get<1>(ranges[i - 1]))
      return corrupt(absl::StrCat("tensors '", std::get<2>(ranges[i - 1]), "' and '", std::get<2>(ranges[i]),
                                  "' overlap"));
  }
  return file;
}

absl::StatusOr<SafeTensor> SafetensorsFile::Get(const std::string& name, std::string_view dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : tensors_) names.push_back(n);
    return absl::NotFoundError(
        absl::StrCat("no tensor '", name, "' in the safetensors file (it holds: ", absl::StrJoin(names, ", "), ")"));
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
