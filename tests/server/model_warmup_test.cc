// Triton's model_warmup: each sample reaches the model's request path `count` times with
// the inputs it describes; a kv_attention sample is a one-request sequence; a missing
// data file or a refused sample is an error naming the sample.
#include "server/models/model_warmup.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

class RecordingModel : public Model {
 public:
  explicit RecordingModel(inference::ModelConfig c) : Model(std::move(c)) {}
  using Model::Prepare;
  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& r,
                                                const RequestBytes&) override {
    requests.push_back(r);
    if (refuse) return absl::InvalidArgumentError("head_dim 48 is not served");
    return std::make_unique<Work>();
  }
  absl::Status Admit(Work&) override {
    ++admitted;
    return absl::OkStatus();
  }
  void Execute(const std::vector<Work*>& batch) override { executed += int(batch.size()); }

  std::vector<inference::ModelInferRequest> requests;
  int admitted = 0, executed = 0;
  bool refuse = false;
};

inference::ModelConfig Config(const std::string& text) {
  inference::ModelConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c));
  return c;
}

TEST(ModelWarmup, RunsEachSampleCountTimesWithItsInputs) {
  RecordingModel m(Config(R"(
    name: "m"
    parameters { key: "kind" value: { string_value: "attention" } }
    model_warmup [
      { name: "a" count: 3
        inputs { key: "Q" value: { data_type: TYPE_FP16 dims: [ 2, 4, 64 ] random_data: true } }
        inputs { key: "CU_SEQLENS_Q" value: { data_type: TYPE_INT32 dims: [ 2 ] random_data: true } } },
      { name: "b" inputs { key: "Q" value: { data_type: TYPE_BF16 dims: [ 1, 1, 64 ] zero_data: true } } }
    ])"));
  ASSERT_TRUE(RunModelWarmup(m, "/nonexistent").ok());
  ASSERT_EQ(m.requests.size(), 4u);
  EXPECT_EQ(m.executed, 4);
  EXPECT_EQ(m.admitted, 4);
  const auto& r = m.requests[0];
  ASSERT_EQ(r.inputs_size(), 2);
  EXPECT_EQ(r.inputs(0).name(), "CU_SEQLENS_Q");  // name order
  EXPECT_EQ(r.inputs(0).datatype(), "INT32");
  EXPECT_EQ(r.raw_input_contents(0), std::string(8, '\0')) << "integer inputs are zeros";
  EXPECT_EQ(r.inputs(1).datatype(), "FP16");
  EXPECT_EQ(r.raw_input_contents(1).size(), 2u * 4 * 64 * 2);
  EXPECT_NE(r.raw_input_contents(1), std::string(2 * 4 * 64 * 2, '\0'));
  EXPECT_EQ(m.requests[3].raw_input_contents(0), std::string(64 * 2, '\0'));
  EXPECT_TRUE(r.parameters().empty());
}

TEST(ModelWarmup, KvSampleIsAOneRequestSequence) {
  RecordingModel m(Config(R"(
    name: "kv"
    parameters { key: "kind" value: { string_value: "kv_attention" } }
    model_warmup [ { name: "s" count: 2
      inputs { key: "Q" value: { data_type: TYPE_FP16 dims: [ 1, 32, 128 ] zero_data: true } } } ])"));
  ASSERT_TRUE(RunModelWarmup(m, "/nonexistent").ok());
  ASSERT_EQ(m.requests.size(), 2u);
  for (const auto& r : m.requests) {
    EXPECT_TRUE(r.parameters().at("sequence_start").bool_param());
    EXPECT_TRUE(r.parameters().at("sequence_end").bool_param());
  }
  EXPECT_NE(m.requests[0].parameters().at("sequence_id").string_param(),
            m.requests[1].parameters().at("sequence_id").string_param());
}

TEST(ModelWarmup, DataFilesAndErrors) {
  const fs::path dir = fs::temp_directory_path() / ("flashq-warmup-" + std::to_string(::getpid()));
  fs::create_directories(dir / "warmup");
  std::ofstream(dir / "warmup" / "q.bin", std::ios::binary) << std::string(2 * 2 * 64 * 2, '\x01');
  const std::string sample = R"(
    name: "m"
    parameters { key: "kind" value: { string_value: "attention" } }
    model_warmup [ { name: "file" inputs { key: "Q" value: { data_type: TYPE_FP16 dims: [ 2, 2, 64 ] input_data_file: "FILE" } } } ])";
  auto with = [&](const std::string& file) {
    std::string t = sample;
    t.replace(t.find("FILE"), 4, file);
    return Config(t);
  };
  RecordingModel good(with("q.bin"));
  ASSERT_TRUE(RunModelWarmup(good, dir.string()).ok());
  EXPECT_EQ(good.requests[0].raw_input_contents(0), std::string(2 * 2 * 64 * 2, '\x01'));

  RecordingModel missing(with("absent.bin"));
  absl::Status s = RunModelWarmup(missing, dir.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model_warmup 'file': input 'Q': cannot read"), std::string::npos) << s;

  RecordingModel refused(with("q.bin"));
  refused.refuse = true;
  s = RunModelWarmup(refused, dir.string());
  EXPECT_NE(s.message().find("model_warmup 'file': head_dim 48 is not served"), std::string::npos) << s;
  EXPECT_EQ(refused.executed, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashq::server
