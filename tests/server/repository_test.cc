#include "server/repository/model_repository.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLinearConfig = R"(
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP16 dims: [ -1, 4096 ] } ]
output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1, 14336 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 default_queue_policy { max_queue_size: 1024 } }
parameters { key: "kind" value: { string_value: "linear" } }
parameters { key: "max_batch_tokens" value: { string_value: "4096" } }
parameters { key: "bad_int" value: { string_value: "12x" } }
)";

class RepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fq_repo_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void AddModel(const std::string& folder, const std::string& config) {
    fs::create_directories(root_ / folder);
    std::ofstream(root_ / folder / "config.pbtxt") << config;
  }

  fs::path root_;
};

TEST_F(RepositoryTest, ParsesGoodConfigs) {
  AddModel("up_proj", kLinearConfig);
  AddModel("attention", R"(
name: "attention"
max_batch_size: 0
input [ { name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },
        { name: "CU_SEQLENS_Q" data_type: TYPE_INT32 dims: [ -1 ] optional: true } ]
output [ { name: "O" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]
parameters { key: "kind" value: { string_value: "attention" } }
)");
  fs::create_directories(root_ / "not_a_model");  // no config.pbtxt: skipped
  fs::create_directories(root_ / ".hidden");
  std::ofstream(root_ / ".hidden" / "config.pbtxt") << "garbage {";
  std::ofstream(root_ / "README") << "a file at the top level";

  auto models = ScanModelRepository(root_.string());
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 2u);
  const ModelEntry& att = (*models)[0];
  const ModelEntry& up = (*models)[1];
  EXPECT_EQ(att.config.name(), "attention");
  EXPECT_TRUE(att.config.input(1).optional());
  EXPECT_EQ(up.config.name(), "up_proj") << "name defaults to the folder name";
  EXPECT_EQ(up.dir, (root_ / "up_proj").string());
  EXPECT_TRUE(fs::path(up.dir).is_absolute());
  EXPECT_EQ(up.config.input(0).dims(1), 4096);
  EXPECT_EQ(up.config.dynamic_batching().default_queue_policy().max_queue_size(), 1024u);

  EXPECT_EQ(ConfigParam(up.config, "kind", ""), "linear");
  EXPECT_EQ(ConfigParam(up.config, "absent", "dflt"), "dflt");
  auto tokens = ConfigIntParam(up.config, "max_batch_tokens", 1);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, 4096);
  EXPECT_EQ(*ConfigIntParam(up.config, "absent", 77), 77);
  auto bad = ConfigIntParam(up.config, "bad_int", 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad_int"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'12x'"), std::string::npos);
}

TEST_F(RepositoryTest, SyntaxErrorNamesFileLineAndColumn) {
  AddModel("good", kLinearConfig);
  AddModel("broken", "max_batch_size: 0\ninput [ { name: \"X\" data_typo: TYPE_FP16 } ]\n");
  auto models = ScanModelRepository(root_.string());
  ASSERT_FALSE(models.ok());
  EXPECT_EQ(models.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(models.status().message());
  EXPECT_NE(msg.find((root_ / "broken" / "config.pbtxt").string() + ":2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data_typo"), std::string::npos) << msg;
}

TEST_F(RepositoryTest, SemanticErrorsNameTheFile) {
  struct Case {
    const char* what;
    std::string config;
    const char* expect;
  };
  const std::string io = R"(input [ { name: "X" data_type: TYPE_FP16 dims: [ -1, 8 ] } ]
output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1, 8 ] } ]
)";
  const std::string kind = R"(parameters { key: "kind" value: { string_value: "linear" } })";
  const std::vector<Case> cases = {
      {"no kind", io, "no \"kind\""},
      {"bad kind", io + R"(parameters { key: "kind" value: { string_value: "conv" } })", "kind is 'conv'"},
      {"name mismatch", "name: \"other\"\n" + io + kind, "config.pbtxt:1: name 'other' differs from the folder name"},
      {"batch dim", "max_batch_size: 8\n" + io + kind, "config.pbtxt:1: max_batch_size is 8"},
      {"no inputs", R"(output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1 ] } ])" + kind, "no input"},
      {"duplicate tensor", R"(input [ { name: "X" data_type: TYPE_FP16 dims: [ -1 ] } ]
output [ { name: "X" data_type: TYPE_FP16 dims: [ -1 ] } ])" + kind, "config.pbtxt:2: tensor name 'X' is used twice"},
      {"no dtype", R"(input [ { name: "X" dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1 ] } ])" + kind, "'X' has no data_type"},
      {"bad dim", R"(input [ { name: "X" data_type: TYPE_FP16 dims: [ -2 ] } ]
output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1 ] } ])" + kind, "config.pbtxt:1: input 'X' has dimension -2"},
  };
  for (const Case& c : cases) {
    fs::remove_all(root_ / "m");
    AddModel("m", c.config);
    auto models = ScanModelRepository(root_.string());
    ASSERT_FALSE(models.ok()) << c.what;
    const std::string msg(models.status().message());
    EXPECT_NE(msg.find((root_ / "m" / "config.pbtxt").string()), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }
}

TEST_F(RepositoryTest, EmptyOrMissingRepository) {
  auto empty = ScanModelRepository(root_.string());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("no model folder"), std::string::npos);
  auto missing = ScanModelRepository((root_ / "nope").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace flashq::server
