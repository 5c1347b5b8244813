// A small JSON reader for the files a checkpoint folder holds: safetensors headers,
// model.safetensors.index.json, config.json and quantize_config.json. Objects keep the
// file's order; numbers keep their integer value when they have one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace flashq::server {

struct JsonValue;
using JsonObject = std::vector<std::pair<std::string, JsonValue>>;
using JsonArray = std::vector<JsonValue>;

struct JsonNull {};
struct JsonValue {
  // The special members are defined in json.cc, where JsonValue is complete: a variant
  // over containers of JsonValue must not instantiate them inside this definition (clang
  // with libstdc++ refuses to).
  JsonValue();
  JsonValue(const JsonValue&);
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(const JsonValue&);
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();

  // int64_t: an integer literal that fits; double: any other number.
  std::variant<JsonNull, bool, int64_t, double, std::string, JsonArray, JsonObject> v;

  bool is_null() const { return v.index() == 0; }
  bool is_bool() const { return v.index() == 1; }
  bool is_int() const { return v.index() == 2; }
  bool is_number() const { return v.index() == 2 || v.index() == 3; }
  bool is_string() const { return v.index() == 4; }
  bool is_array() const { return v.index() == 5; }
  bool is_object() const { return v.index() == 6; }
  bool as_bool() const { return std::get<bool>(v); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_number() const { return is_int() ? double(std::get<int64_t>(v)) : std::get<double>(v); }
  const std::string& as_string() const { return std::get<std::string>(v); }
  const JsonArray& as_array() const { return std::get<JsonArray>(v); }
  const JsonObject& as_object() const { return std::get<JsonObject>(v); }
  // Member `key` of an object (the first, if repeated), or null when absent or not an object.
  const JsonValue* Find(std::string_view key) const;
};

enum class JsonDialect {
  kFull,               // RFC 8259
  kSafetensorsHeader,  // objects, arrays, strings and non-negative integers only
};

// Errors read "invalid JSON at byte <offset>: <what>".
absl::StatusOr<JsonValue> ParseJson(std::string_view text, JsonDialect dialect = JsonDialect::kFull);

// `s` as a JSON string literal, quotes included.
void AppendJsonString(std::string_view s, std::string* out);

}  // namespace flashq::server
