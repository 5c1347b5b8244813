// Unit tests of server/frontend/auth: token parsing and checking, TLS option errors.
// The end-to-end checks (handshakes, UNAUTHENTICATED over the wire) are in test_security.py.
#include "server/frontend/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace flashq::server {
namespace {

std::string TempFile(const std::string& name, const std::string& content) {
  const auto p = std::filesystem::temp_directory_path() / ("flashq_auth_test_" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

grpc::StatusCode Code(const TokenAuth& a, const char* header) {
  if (!header) return a.CheckHeader(nullptr).error_code();
  const std::string h = header;
  return a.CheckHeader(&h).error_code();
}

TEST(TokenAuth, DisabledAcceptsEverything) {
  auto a = TokenAuth::Create("", "");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->enabled());
  EXPECT_EQ(Code(**a, nullptr), grpc::StatusCode::OK);
  EXPECT_EQ(Code(**a, "Bearer whatever"), grpc::StatusCode::OK);
}

TEST(TokenAuth, ChecksTheBearerToken) {
  auto a = TokenAuth::Create("tok-123", "");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE((*a)->enabled());
  EXPECT_EQ(Code(**a, "Bearer tok-123"), grpc::StatusCode::OK);
  EXPECT_EQ(Code(**a, "bearer tok-123"), grpc::StatusCode::OK);
  for (const char* bad : {"Bearer tok-12", "Bearer tok-1234", "Bearer TOK-123", "tok-123", "Bearer ", "Basic tok-123",
                          "Bearer  tok-123", ""}) {
    EXPECT_EQ(Code(**a, bad), grpc::StatusCode::UNAUTHENTICATED) << "'" << bad << "'";
  }
  const grpc::Status missing = (*a)->CheckHeader(nullptr);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(missing.error_message().find("authorization: Bearer"), std::string::npos) << missing.error_message();
  const std::string wrong = "Bearer nope";
  EXPECT_EQ((*a)->CheckHeader(&wrong).error_message().find("tok-123"), std::string::npos);  // never echoes the token
}

TEST(TokenAuth, ReadsAndTrimsTheTokenFile) {
  auto a = TokenAuth::Create("", TempFile("tok", "  file-token \nsecond line ignored\n"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Code(**a, "Bearer file-token"), grpc::StatusCode::OK);
}

TEST(TokenAuth, RefusesConfigurationsThatWouldFailOpen) {
  EXPECT_FALSE(TokenAuth::Create("", TempFile("empty", "\n")).ok());
  EXPECT_FALSE(TokenAuth::Create("a", TempFile("both", "b")).ok());
  EXPECT_FALSE(TokenAuth::Create("", "/nonexistent/flashq/token").ok());
  EXPECT_FALSE(TokenAuth::Create("has space", "").ok());
  EXPECT_FALSE(TokenAuth::Create(std::string("nul\0x", 5), "").ok());
}

TEST(Tls, InsecureWithoutFilesAndClearErrorsOtherwise) {
  auto none = MakeServerCredentials({});
  ASSERT_TRUE(none.ok());
  EXPECT_NE(none->get(), nullptr);
  const std::string pem = TempFile("fake.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  const std::string text = TempFile("text.pem", "not a certificate\n");
  auto half = MakeServerCredentials({pem, "", ""});
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  auto ca_only = MakeServerCredentials({"", "", pem});
  EXPECT_EQ(ca_only.status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = MakeServerCredentials({"/nonexistent/cert.pem", pem, ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--tls-cert"), std::string::npos);
  auto not_pem = MakeServerCredentials({pem, text, ""});
  EXPECT_EQ(not_pem.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_pem.status().message().find("--tls-key"), std::string::npos);
}

}  // namespace
}  // namespace flashq::server
