// JSON reader: a recursive-descent parser with a depth limit. The safetensors dialect
// refuses what a header never holds (numbers other than non-negative integers, true,
// false, null), so a header that is not what the format defines is named as such.
#include "server/repository/json.h"

#include <charconv>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"

namespace flashq::server {

JsonValue::JsonValue() = default;
JsonValue::JsonValue(const JsonValue&) = default;
JsonValue::JsonValue(JsonValue&&) noexcept = default;
JsonValue& JsonValue::operator=(const JsonValue&) = default;
JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
JsonValue::~JsonValue() = default;

namespace {

constexpr int kMaxDepth = 64;

class JsonParser {
 public:
  JsonParser(std::string_view s, JsonDialect dialect) : s_(s), strict_(dialect == JsonDialect::kSafetensorsHeader) {}

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
    return absl::InvalidArgumentError(
        absl::StrCat(strict_ ? "invalid JSON header at byte " : "invalid JSON at byte ", pos_, ": ", err_));
  }
  void SkipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Fail(std::string msg) {
    if (err_.empty()) err_ = std::move(msg);
    return false;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return Fail(absl::StrCat("unexpected character '", std::string(s_.substr(pos_, 1)), "'"));
    pos_ += word.size();
    return true;
  }

  bool ParseValue(JsonValue* out, int depth) {
    if (depth > (strict_ ? 16 : kMaxDepth)) return Fail("nested too deeply");
    SkipWs();
    if (pos_ >= s_.size()) return Fail(strict_ ? "unexpected end of header" : "unexpected end of text");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      std::string str;
      if (!ParseString(&str)) return false;
      out->v = std::move(str);
      return true;
    }
    if ((c >= '0' && c <= '9') || c == '-') return ParseNumber(out);
    if (!strict_ && c == 't') {
      out->v = true;
      return Literal("true");
    }
    if (!strict_ && c == 'f') {
      out->v = false;
      return Literal("false");
    }
    if (!strict_ && c == 'n') {
      out->v = JsonNull{};
      return Literal("null");
    }
    return Fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  bool ParseObject(JsonValue* out, int depth) {
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
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        break;
      }
      return Fail("expected ',' or '}'");
    }
    out->v = std::move(obj);
    return true;
  }

  bool ParseArray(JsonValue* out, int depth) {
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
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        break;
      }
      return Fail("expected ',' or ']'");
    }
    out->v = std::move(arr);
    return true;
  }

  // RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    if (s_[pos_] == '-') {
      if (strict_) return Fail("negative numbers are not valid here");
      ++pos_;
    }
    const size_t int_start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == int_start) return Fail("a number needs digits");
    if (s_[int_start] == '0' && pos_ - int_start > 1) return Fail("leading zero in an integer");
    bool is_integer = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      if (strict_) return Fail("only integers are supported");
      is_integer = false;
      const size_t f = ++pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == f) return Fail("a fraction needs digits");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      if (strict_) return Fail("only integers are supported");
      is_integer = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      const size_t e = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == e) return Fail("an exponent needs digits");
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (is_integer) {
      int64_t n = 0;
      auto r = std::from_chars(first, last, n);
      if (r.ec == std::errc() && r.ptr == last) {
        out->v = n;
        return true;
      }
      if (strict_) return Fail("integer too large");
    }
    double d = 0;
    auto r = std::from_chars(first, last, d);
    if (r.ec != std::errc() || r.ptr != last) return Fail("number out of range");
    out->v = d;
    return true;
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
  const bool strict_;
  size_t pos_ = 0;
  std::string err_;
};

}  // namespace

const JsonValue* JsonValue::Find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, val] : as_object())
    if (k == key) return &val;
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(std::string_view text, JsonDialect dialect) {
  return JsonParser(text, dialect).ParseDocument();
}

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

}  // namespace flashq::server
