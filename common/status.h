// Errors are values. Kernels and their launchers return a Status; the server maps
// it onto a gRPC status. Kept free of Abseil so the kernels build alone (for
// instance a kernels-only build on a host without Abseil).
#pragma once

#include <string>
#include <utility>

namespace flashq {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kResourceExhausted,
  kUnimplemented,
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }

}  // namespace flashq

#define FQ_RETURN_IF_ERROR(expr)               \
  do {                                         \
    ::flashq::Status fq_status_ = (expr);      \
    if (!fq_status_.ok()) return fq_status_;   \
  } while (0)
