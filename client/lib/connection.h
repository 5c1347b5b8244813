// How the client reaches a secured server: TLS (optionally with a client certificate,
// for servers that require mutual TLS), metadata sent with every call (a bearer token
// travels as `authorization: Bearer <token>`) and request compression.
//
// The library takes PEM contents, as gRPC does; ReadPemFile and ParseHeader turn
// command-line values (file paths, "name: value") into them with errors that name
// what was wrong.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashq::client {

struct TlsOptions {
  bool enabled = false;
  // Empty: gRPC's default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else its bundled set).
  std::string root_certs_pem;
  // Both or neither: the certificate the client presents to a server that asks for one.
  std::string private_key_pem, cert_chain_pem;
};

enum class Compression { kNone, kGzip, kDeflate };

using Header = std::pair<std::string, std::string>;

// "none", "gzip" or "deflate" (perf_analyzer's --grpc-compression-algorithm values).
absl::StatusOr<Compression> ParseCompression(absl::string_view s);
const char* CompressionName(Compression c);

// "name: value" or "name:value" (curl's and perf_analyzer's -H form). The name is
// lower-cased, since gRPC metadata keys are lower case and HTTP header names are
// case-insensitive; reserved (grpc-*, :pseudo) and binary (-bin) keys are refused.
absl::StatusOr<Header> ParseHeader(absl::string_view text);
// The checks ParseHeader makes, on a header built in code.
absl::Status CheckHeader(const Header& h);

enum class PemKind { kCertificates, kPrivateKey };
// The contents of a PEM file whose first block is a certificate (a CA bundle or a
// chain) or a private key; `what` names it in errors (e.g. the flag that gave it).
// gRPC itself reports a wrong file only as a failed connection on the first call.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what, PemKind kind);

}  // namespace flashq::client
