// InferenceServer model control on the CPU backend: an unload destroys the model (and
// so frees what it holds) once no request holds it, a held model outlives the unload
// until released, and reload and failed loads behave as documented.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "server/backends/cpu/cpu_backend.h"
#include "server/inference_server.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kAttention = R"(
max_batch_size: 0
input [ { name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },
        { name: "K" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },
        { name: "V" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]
output [ { name: "O" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] } ]
parameters { key: "kind" value: { string_value: "attention" } }
)";

class ModelControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fq_control_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_);
    bo_.cpu_threads = 1;
    backend_ = std::make_unique<CpuBackend>(bo_);
    metrics_ = std::make_unique<ServerMetrics>(std::make_shared<prometheus::Registry>());
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(root_);
  }
  void AddModel(const std::string& name, const std::string& config = kAttention) {
    fs::create_directories(root_ / name);
    std::ofstream(root_ / name / "config.pbtxt") << config;
  }
  void Start() {
    InferenceServerOptions o;
    o.workers_per_model = 1;
    o.repository = root_.string();
    o.control = ModelControlMode::kExplicit;
    auto s = InferenceServer::Create({}, *backend_, *metrics_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  fs::path root_;
  BackendOptions bo_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<InferenceServer> server_;
};

TEST_F(ModelControlTest, UnloadDestroysTheModelOnceNothingHoldsIt) {
  AddModel("a");
  Start();
  ASSERT_TRUE(server_->LoadModel("a").ok());
  std::weak_ptr<const Model> weak = server_->FindModel("a", "");
  ASSERT_FALSE(weak.expired());
  ASSERT_TRUE(server_->UnloadModel("a").ok());
  EXPECT_TRUE(weak.expired()) << "the model (and its memory) is gone when the unload returns";
  absl::Status why;
  EXPECT_EQ(server_->FindModel("a", "", &why), nullptr);
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
}

// The unload waits a little for holders to let go, then returns anyway.
TEST_F(ModelControlTest, AHeldModelOutlivesItsUnloadUntilReleased) {
  AddModel("a");
  Start();
  ASSERT_TRUE(server_->LoadModel("a").ok());
  std::shared_ptr<const Model> held = server_->FindModel("a", "");
  std::weak_ptr<const Model> weak = held;
  ASSERT_TRUE(server_->UnloadModel("a").ok());
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(held->name(), "a");
  held.reset();
  EXPECT_TRUE(weak.expired());
}

TEST_F(ModelControlTest, ReloadReplacesTheModelAndAFailedReloadKeepsIt) {
  AddModel("a");
  Start();
  ASSERT_TRUE(server_->LoadModel("a").ok());
  std::weak_ptr<const Model> first = server_->FindModel("a", "");
  ASSERT_TRUE(server_->LoadModel("a").ok());
  EXPECT_TRUE(first.expired()) << "the replaced model is destroyed";
  std::weak_ptr<const Model> second = server_->FindModel("a", "");
  std::ofstream(root_ / "a" / "config.pbtxt") << "garbage {";
  EXPECT_FALSE(server_->LoadModel("a").ok());
  EXPECT_FALSE(second.expired()) << "a failed reload leaves the served model";
  EXPECT_NE(server_->FindModel("a", ""), nullptr);
}

TEST_F(ModelControlTest, IndexAndErrors) {
  AddModel("a");
  AddModel("b", "name: \"b\"\nmax_batch_size: 0\nparameters { key: \"kind\" value: { string_value: \"linear\" } }\n");
  Start();
  ASSERT_TRUE(server_->LoadModel("a").ok());
  absl::Status bad = server_->LoadModel("b");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(server_->LoadModel("zz").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server_->UnloadModel("zz").code(), absl::StatusCode::kNotFound);
  auto index = server_->RepositoryIndex(false);
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0].name, "a");
  EXPECT_EQ(index[0].state, "READY");
  EXPECT_EQ(index[0].version, "1");
  EXPECT_EQ(index[1].name, "b");
  EXPECT_EQ(index[1].state, "UNAVAILABLE");
  EXPECT_EQ(index[1].reason, std::string(bad.message()));
  EXPECT_EQ(server_->RepositoryIndex(true).size(), 1u);
}

}  // namespace
}  // namespace flashq::server
