#include "server/frontend/auth.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flashq::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto pem = ReadFile(path, what);
  if (!pem.ok()) return pem.status();
  if (!absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::FailedPreconditionError(absl::StrCat(what, " '", path, "' is not PEM (no '-----BEGIN' line)"));
  }
  return pem;
}

// gRPC reads the PEM files only when the server starts listening, and then reports any
// fault as a port it cannot bind. These checks run first, so that a key that is not a
// key, a CSR given as a certificate or a key of another certificate is named by its flag.
struct BioFree { void operator()(BIO* b) const { BIO_free(b); } };
struct X509Free { void operator()(X509* x) const { X509_free(x); } };
struct KeyFree { void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); } };

std::string PemLabel(const std::string& pem) {
  const size_t b = pem.find("-----BEGIN ");
  const size_t e = b == std::string::npos ? b : pem.find("-----", b + 11);
  return e == std::string::npos ? "nothing" : absl::StrCat("'", pem.substr(b + 11, e - b - 11), "'");
}

std::unique_ptr<BIO, BioFree> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), int(pem.size())));
}

absl::StatusOr<std::unique_ptr<X509, X509Free>> ParseCertificate(const std::string& pem, const char* flag,
                                                                  const std::string& path) {
  auto bio = MemBio(pem);
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!cert) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " '", path, "' holds no PEM certificate (its first block is ",
                                                      PemLabel(pem), ")"));
  }
  return cert;
}

absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& cert_path, const std::string& key_pem,
                          const std::string& key_path) {
  auto cert = ParseCertificate(cert_pem, "--tls-cert", cert_path);
  if (!cert.ok()) return cert.status();
  auto bio = MemBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!key) {
    return absl::FailedPreconditionError(absl::StrCat("--tls-key '", key_path,
                                                      "' holds no unencrypted PEM private key (its first block is ",
                                                      PemLabel(key_pem), ")"));
  }
  const bool match = X509_check_private_key(cert->get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::FailedPreconditionError(absl::StrCat("--tls-key '", key_path,
                                                      "' is not the private key of the certificate in --tls-cert '",
                                                      cert_path, "'"));
  }
  return absl::OkStatus();
}

// Compares without an early exit, so response timing does not reveal a matching prefix.
bool ConstantTimeEquals(std::string_view given, std::string_view want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i % want.size()]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& o) {
  if (o.cert_file.empty() && o.key_file.empty()) {
    if (!o.ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key (mutual TLS runs over TLS)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.cert_file.empty() || o.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  auto cert = ReadPem(o.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(o.key_file, "--tls-key");
  if (!key.ok()) return key.status();
  if (auto s = CheckKeyPair(*cert, o.cert_file, *key, o.key_file); !s.ok()) return s;
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.ca_file.empty()) {
    auto ca = ReadPem(o.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    if (auto c = ParseCertificate(*ca, "--tls-ca", o.ca_file); !c.ok()) return c.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(const std::string& token, const std::string& token_file) {
  if (!token.empty() && !token_file.empty()) {
    return absl::InvalidArgumentError("give --auth-token or --auth-token-file, not both");
  }
  std::string t = token;
  if (!token_file.empty()) {
    auto content = ReadFile(token_file, "--auth-token-file");
    if (!content.ok()) return content.status();
    t = content->substr(0, content->find('\n'));
    if (absl::StripAsciiWhitespace(t).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth-token-file '", token_file, "' holds no token"));
    }
  }
  t = std::string(absl::StripAsciiWhitespace(t));
  for (char c : t) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("the auth token must be printable ASCII without spaces (it travels in a header)");
    }
  }
  return std::unique_ptr<TokenAuth>(new TokenAuth(std::move(t)));
}

grpc::Status TokenAuth::CheckHeader(const std::string* authorization) const {
  if (!enabled()) return grpc::Status::OK;
  if (!authorization) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server requires a token: send the metadata 'authorization: Bearer <token>'");
  }
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization->size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(*authorization).substr(0, kBearer.size()), absl::string_view(kBearer.data(), kBearer.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the 'authorization' metadata must read 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(std::string_view(*authorization).substr(kBearer.size()), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid for this server");
  }
  return grpc::Status::OK;
}

grpc::Status TokenAuth::Check(const grpc::ServerContextBase& ctx) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return CheckHeader(nullptr);
  const std::string value(it->second.data(), it->second.size());
  return CheckHeader(&value);
}

}  // namespace flashq::server
