// Model versions: numbered folders filtered by version_policy (Triton's rules), a folder
// without version folders as version 1, and the errors that name what is missing.
#include "server/repository/model_versions.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

class ModelVersionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fq_versions_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_ / "m");
    entry_.dir = (root_ / "m").string();
    entry_.config.set_name("m");
  }
  void TearDown() override { fs::remove_all(root_); }

  void Folders(std::initializer_list<const char*> names) {
    for (const char* n : names) fs::create_directories(root_ / "m" / n);
  }
  void Policy(const std::string& text) {
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, entry_.config.mutable_version_policy())) << text;
  }
  std::vector<int64_t> Served() {
    auto v = ServedVersions(entry_);
    EXPECT_TRUE(v.ok()) << v.status();
    std::vector<int64_t> out;
    if (v.ok())
      for (const ModelVersion& mv : *v) out.push_back(mv.version);
    return out;
  }

  fs::path root_;
  ModelEntry entry_;
};

TEST_F(ModelVersionsTest, NoVersionFoldersIsVersionOneInTheModelFolder) {
  Folders({"tokenizer", "0", "v2"});  // not positive numbers: not versions
  auto v = ServedVersions(entry_);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].version, 1);
  EXPECT_EQ((*v)[0].entry.dir, entry_.dir);
}

TEST_F(ModelVersionsTest, DefaultServesTheLatestOneFromItsFolder) {
  Folders({"1", "2", "10"});
  auto v = ServedVersions(entry_);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].version, 10) << "numeric order, not name order";
  EXPECT_EQ((*v)[0].entry.dir, (root_ / "m" / "10").string());
}

TEST_F(ModelVersionsTest, LatestAllAndSpecific) {
  Folders({"1", "2", "3"});
  Policy("latest { num_versions: 2 }");
  EXPECT_EQ(Served(), (std::vector<int64_t>{2, 3}));
  Policy("latest { num_versions: 5 }");
  EXPECT_EQ(Served(), (std::vector<int64_t>{1, 2, 3}));
  Policy("all {}");
  EXPECT_EQ(Served(), (std::vector<int64_t>{1, 2, 3}));
  Policy("specific { versions: [3, 1, 3] }");
  EXPECT_EQ(Served(), (std::vector<int64_t>{1, 3}));
}

TEST_F(ModelVersionsTest, ErrorsNameWhatIsMissing) {
  Folders({"1", "2"});
  Policy("specific { versions: [4] }");
  auto v = ServedVersions(entry_);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("version 4"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find("versions present: 1, 2"), std::string::npos) << v.status();
  Policy("latest { num_versions: 0 }");
  EXPECT_FALSE(ServedVersions(entry_).ok());
}

TEST_F(ModelVersionsTest, ListsModelFoldersAndFingerprintsChange) {
  std::ofstream(root_ / "m" / "config.pbtxt") << "name: \"m\"";
  fs::create_directories(root_ / "no_config");
  fs::create_directories(root_ / ".hidden");
  std::ofstream(root_ / ".hidden" / "config.pbtxt") << "";
  auto names = ListModelFolders(root_.string());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"m"}));
  const std::string before = ModelFolderFingerprint((root_ / "m").string());
  Folders({"2"});
  const std::string with_folder = ModelFolderFingerprint((root_ / "m").string());
  EXPECT_NE(with_folder, before) << "an empty version folder counts";
  std::ofstream(root_ / "m" / "2" / "model.safetensors") << "x";
  EXPECT_NE(ModelFolderFingerprint((root_ / "m").string()), with_folder);
  EXPECT_FALSE(ReadModelEntry(root_.string(), "../m").ok()) << "names stay inside the repository";
  EXPECT_EQ(ReadModelEntry(root_.string(), "absent").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace flashq::server
