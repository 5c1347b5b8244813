#include "client/lib/connection.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flashq::client {

absl::StatusOr<Compression> ParseCompression(absl::string_view s) {
  if (s == "none") return Compression::kNone;
  if (s == "gzip") return Compression::kGzip;
  if (s == "deflate") return Compression::kDeflate;
  return absl::InvalidArgumentError(absl::StrCat("compression '", s, "' is not none, gzip or deflate"));
}

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kGzip: return "gzip";
    case Compression::kDeflate: return "deflate";
  }
  return "?";
}

absl::Status CheckHeader(const Header& h) {
  const auto& [name, value] = h;
  if (name.empty()) return absl::InvalidArgumentError("header has an empty name");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("header name '", name, "' may hold only lower-case letters, digits, '-', '_' and '.'"));
    }
  }
  if (absl::StartsWith(name, "grpc-")) {
    return absl::InvalidArgumentError(absl::StrCat("header '", name, "': names starting 'grpc-' are reserved by gRPC"));
  }
  if (absl::EndsWith(name, "-bin")) {
    return absl::InvalidArgumentError(absl::StrCat("header '", name, "': binary ('-bin') headers are not supported"));
  }
  for (char c : value) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat("header '", name, "': the value must be printable ASCII"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Header> ParseHeader(absl::string_view text) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("header '", text, "' is not 'name: value'"));
  }
  Header h{absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, colon))),
           std::string(absl::StripAsciiWhitespace(text.substr(colon + 1)))};
  if (absl::Status s = CheckHeader(h); !s.ok()) return s;
  return h;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what, PemKind kind) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::ostringstream s;
  s << f.rdbuf();
  const std::string pem = s.str();
  const size_t begin = pem.find("-----BEGIN ");
  if (begin == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": '", path, "' is not PEM (no '-----BEGIN' line)"));
  }
  const size_t end = pem.find("-----", begin + 11);
  const std::string label = end == std::string::npos ? "" : pem.substr(begin + 11, end - begin - 11);
  // "CERTIFICATE"; "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY" (but not "ENCRYPTED PRIVATE KEY").
  const bool ok = kind == PemKind::kCertificates
                      ? label == "CERTIFICATE"
                      : absl::EndsWith(label, "PRIVATE KEY") && !absl::StartsWith(label, "ENCRYPTED");
  if (!ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": '", path, "' begins with a '", label, "' block; expected ",
        kind == PemKind::kCertificates ? "'CERTIFICATE'" : "an unencrypted private key"));
  }
  return pem;
}

}  // namespace flashq::client
