#include "client/lib/connection.h"

#include <gtest/gtest.h>

#include <fstream>

#include "client/lib/client.h"

namespace flashq::client {
namespace {

TEST(Connection, ParseHeader) {
  auto h = ParseHeader("Authorization:  Bearer abc.def ");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->first, "authorization");  // gRPC metadata keys are lower case
  EXPECT_EQ(h->second, "Bearer abc.def");
  EXPECT_TRUE(ParseHeader("x-a:1").ok());
  EXPECT_TRUE(ParseHeader("x-empty:").ok());
  EXPECT_NE(ParseHeader("no colon").status().message().find("is not 'name: value'"), std::string::npos);
  EXPECT_NE(ParseHeader(": v").status().message().find("empty name"), std::string::npos);
  EXPECT_NE(ParseHeader("grpc-timeout: 1S").status().message().find("reserved"), std::string::npos);
  EXPECT_NE(ParseHeader("a b: 1").status().message().find("may hold only"), std::string::npos);
  EXPECT_NE(ParseHeader("x-bin: 1").status().message().find("binary"), std::string::npos);
  EXPECT_NE(ParseHeader("x: a\tb").status().message().find("printable"), std::string::npos);
}

TEST(Connection, ParseCompression) {
  EXPECT_EQ(*ParseCompression("gzip"), Compression::kGzip);
  EXPECT_EQ(*ParseCompression("deflate"), Compression::kDeflate);
  EXPECT_EQ(*ParseCompression("none"), Compression::kNone);
  EXPECT_FALSE(ParseCompression("zstd").ok());
  EXPECT_STREQ(CompressionName(Compression::kGzip), "gzip");
}

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Connection, ReadPemFileChecksTheKindOfBlock) {
  const std::string cert = Write("c.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  const std::string key = Write("k.pem", "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n");
  const std::string csr = Write("r.pem", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n");
  const std::string enc = Write("e.pem", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n");
  const std::string text = Write("t.pem", "not pem\n");
  EXPECT_TRUE(ReadPemFile(cert, "--ca", PemKind::kCertificates).ok());
  EXPECT_TRUE(ReadPemFile(key, "--key", PemKind::kPrivateKey).ok());
  auto s = ReadPemFile(csr, "--ca", PemKind::kCertificates).status();
  EXPECT_NE(s.message().find("--ca: '" + csr + "' begins with a 'CERTIFICATE REQUEST' block"), std::string::npos) << s;
  EXPECT_FALSE(ReadPemFile(cert, "--key", PemKind::kPrivateKey).ok());
  EXPECT_FALSE(ReadPemFile(enc, "--key", PemKind::kPrivateKey).ok());
  EXPECT_NE(ReadPemFile(text, "--ca", PemKind::kCertificates).status().message().find("is not PEM"), std::string::npos);
  EXPECT_EQ(ReadPemFile("/nonexistent/x.pem", "--ca", PemKind::kCertificates).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Connection, ClientRefusesInconsistentTls) {
  ClientOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.tls.root_certs_pem = "x";
  EXPECT_FALSE(Client::Create(o).ok());  // certificates without TLS
  o.tls.enabled = true;
  o.tls.private_key_pem = "k";
  EXPECT_FALSE(Client::Create(o).ok());  // a key without its chain
  o.tls = {};
  o.headers = {{"Bad Name", "v"}};
  EXPECT_FALSE(Client::Create(o).ok());
  o.headers = {{"authorization", "Bearer t"}};
  o.compression = Compression::kGzip;
  EXPECT_TRUE(Client::Create(o).ok());
}

}  // namespace
}  // namespace flashq::client
