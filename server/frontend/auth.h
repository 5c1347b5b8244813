// Transport security and caller authentication for the gRPC frontend.
//
// TLS: the server's certificate chain and key (PEM); with a CA bundle as well, the
// server requires a client certificate signed by it (mutual TLS) and the handshake
// fails without one. Token: an optional shared bearer token; callers send the gRPC
// metadata `authorization: Bearer <token>`. Which RPCs need it is decided by the
// service (docs/security.md): inference and administrative RPCs, not the probes.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace flashq::server {

struct TlsOptions {
  std::string cert_file, key_file;  // both or neither
  std::string ca_file;              // set: mutual TLS (client certificates required and verified)
};

// Insecure credentials when no file is named; INVALID_ARGUMENT for a half-given pair,
// NOT_FOUND / FAILED_PRECONDITION for a file that cannot be read, is not PEM, holds no
// certificate (--tls-cert, --tls-ca) or no private key (--tls-key), or a key that is not
// the certificate's. Each error names the flag and the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& options);

class TokenAuth {
 public:
  // `token` or the first line of `token_file` (surrounding whitespace trimmed); both
  // empty: authentication is off and Check() always passes. Both set, or an empty
  // file, is an error (a misconfigured guard must not fail open).
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Create(const std::string& token, const std::string& token_file);

  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED naming what was missing or wrong (never the expected token).
  grpc::Status Check(const grpc::ServerContextBase& ctx) const;
  // The same check on a raw `authorization` metadata value (nullptr: absent).
  grpc::Status CheckHeader(const std::string* authorization) const;

 private:
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}
  const std::string token_;
};

}  // namespace flashq::server
