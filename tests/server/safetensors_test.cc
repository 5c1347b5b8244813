#include "server/repository/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fq_st_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file with the given JSON header and `data_bytes` bytes of data.
  std::string WriteRaw(const std::string& header, size_t data_bytes, int64_t header_len_override = -1) {
    std::string path = Path("raw.safetensors");
    std::ofstream f(path, std::ios::binary);
    uint64_t len = header_len_override >= 0 ? uint64_t(header_len_override) : header.size();
    for (int i = 0; i < 8; ++i) f.put(char(len >> (8 * i)));
    f << header << std::string(data_bytes, '\0');
    return path;
  }

  absl::Status OpenRaw(const std::string& header, size_t data_bytes, int64_t header_len_override = -1) {
    return SafetensorsFile::Open(WriteRaw(header, data_bytes, header_len_override)).status();
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTrip) {
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::vector<int32_t> b = {7, 8, 9};
  std::vector<uint16_t> c(4 * 5);
  for (size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i * 977);
  std::vector<SafeTensorToWrite> ts = {
      {"a", "F32", {2, 3}, {reinterpret_cast<const char*>(a.data()), a.size() * 4}},
      {"b.weird \"name\"", "I32", {3}, {reinterpret_cast<const char*>(b.data()), b.size() * 4}},
      {"c", "BF16", {4, 5}, {reinterpret_cast<const char*>(c.data()), c.size() * 2}},
      {"scalar", "U8", {}, {"\x2a", 1}},
      {"empty", "F16", {0, 7}, {}},
  };
  std::string path = Path("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, ts).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 5u);

  auto ta = (*file)->Get("a", "F32");
  ASSERT_TRUE(ta.ok()) << ta.status();
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->numel(), 6);
  ASSERT_EQ(ta->data.size(), 24u);
  EXPECT_EQ(std::memcmp(ta->data.data(), a.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data.data()) % 8, 0u) << "data section is 8-byte aligned";

  auto tb = (*file)->Get("b.weird \"name\"", "I32");
  ASSERT_TRUE(tb.ok()) << tb.status();
  EXPECT_EQ(std::memcmp(tb->data.data(), b.data(), 12), 0);
  auto tc = (*file)->Get("c", "");  // any dtype
  ASSERT_TRUE(tc.ok());
  EXPECT_EQ(tc->dtype, "BF16");
  EXPECT_EQ(std::memcmp(tc->data.data(), c.data(), c.size() * 2), 0);
  auto ts_ = (*file)->Get("scalar", "U8");
  ASSERT_TRUE(ts_.ok());
  EXPECT_TRUE(ts_->shape.empty());
  EXPECT_EQ(ts_->numel(), 1);
  EXPECT_EQ(ts_->data, "\x2a");
  auto te = (*file)->Get("empty", "F16");
  ASSERT_TRUE(te.ok());
  EXPECT_EQ(te->numel(), 0);

  auto missing = (*file)->Get("nope", "F32");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  auto wrong = (*file)->Get("a", "F16");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("F32"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find("expected dtype F16"), std::string::npos) << wrong.status();
}

TEST_F(SafetensorsTest, WriterRejectsSizeMismatch) {
  std::vector<float> a(5);
  auto s = WriteSafetensors(Path("bad.safetensors"),
                            {{"a", "F32", {2, 3}, {reinterpret_cast<const char*>(a.data()), a.size() * 4}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos);
  s = WriteSafetensors(Path("bad.safetensors"), {{"a", "F33", {1}, {"abcd", 4}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, MetadataIsIgnoredAndEscapesParse) {
  std::string header =
      R"({"__metadata__":{"format":"pt","note":"a\"b\\c\u00e9\ud83d\ude00"},)"
      R"( "w\u0041" : { "dtype" : "F16", "shape" : [ 2 ], "data_offsets" : [ 0, 4 ] } }  )";
  auto file = SafetensorsFile::Open(WriteRaw(header, 4));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 1u);
  EXPECT_TRUE((*file)->Get("wA", "F16").ok());
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(Path("absent.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("absent.safetensors"), std::string::npos);
}

struct CorruptCase {
  const char* what;
  std::string header;
  size_t data_bytes;
  int64_t header_len_override;
  const char* expect;  // substring of the message
};

TEST_F(SafetensorsTest, CorruptHeadersAreRejectedWithClearMessages) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<CorruptCase> cases = {
      {"header length past the end", "{" + ok_entry + "}", 8, 1 << 20, "exceeds the file size"},
      {"huge header length", "{}", 0, int64_t(1) << 40, "exceeds the limit"},
      {"not json", "hello", 0, -1, "does not start with '{'"},
      {"truncated json", "{\"t\":{\"dtype\":\"F32\"", 0, -1, "invalid JSON header"},
      {"trailing garbage", "{}x", 0, -1, "trailing characters"},
      {"float in shape", R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, -1,
       "only integers"},
      {"negative dim", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, -1, "negative"},
      {"unknown dtype", R"({"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8, -1, "unknown dtype 'F31'"},
      {"size mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12, -1,
       "needs 12 bytes but data_offsets span 8"},
      {"range past the end", "{" + ok_entry + "}", 4, -1, "run past the data section"},
      {"reversed range", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, -1, "reversed"},
      {"missing key", R"({"t":{"dtype":"F32","shape":[2]}})", 8, -1, "needs dtype, shape and data_offsets"},
      {"unknown key", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, -1, "unknown key 'x'"},
      {"duplicate", "{" + ok_entry + "," + ok_entry + "}", 8, -1, "appears twice"},
      {"overlap", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, -1, "overlap"},
      {"metadata not object", R"({"__metadata__":"x"})", 0, -1, "__metadata__ is not an object"},
      {"bad escape", R"({"t\q":{}})", 0, -1, "bad escape"},
      {"array header", "[]", 0, -1, "does not start with '{'"},
  };
  for (const CorruptCase& c : cases) {
    absl::Status s = OpenRaw(c.header, c.data_bytes, c.header_len_override);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.what << ": " << s;
    EXPECT_NE(s.message().find("raw.safetensors"), std::string::npos) << c.what << ": " << s;
  }
  // Shorter than the length prefix.
  std::string path = Path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  auto s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shorter than the 8-byte header length"), std::string::npos) << s;
}

}  // namespace
}  // namespace flashq::server
