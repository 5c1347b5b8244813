#include "client/bench/input_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "client/lib/tensor.h"

namespace flashq::bench {
namespace {

// A file of this process's own: ctest runs each test as a process of its own, several at once.
std::string Write(const std::string& text) {
  static int n = 0;
  const std::string path =
      testing::TempDir() + "/input_data_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".json";
  std::ofstream(path) << text;
  return path;
}

// The message of loading `text`, or "" when it loads.
std::string LoadError(const std::string& text) {
  auto d = LoadInputData(Write(text));
  return d.ok() ? "" : std::string(d.status().message());
}

inference::ModelMetadataResponse AttentionMetadata() {
  inference::ModelMetadataResponse md;
  md.set_name("attention");
  for (const char* name : {"Q", "K", "V"}) {
    auto* in = md.add_inputs();
    in->set_name(name);
    in->set_datatype("FP16");
    for (int64_t d : {-1, -1, 64}) in->add_shape(d);
  }
  for (const char* name : {"CU_SEQLENS_Q", "CU_SEQLENS_K"}) {
    auto* in = md.add_inputs();
    in->set_name(name);
    in->set_datatype("INT32");
    in->add_shape(-1);
  }
  return md;
}

absl::StatusOr<std::unique_ptr<Workload>> Make(const std::string& text, const inference::ModelMetadataResponse& md) {
  auto d = LoadInputData(Write(text));
  if (!d.ok()) return d.status();
  InputDataWorkloadOptions o;
  o.model = md.name();
  o.unit_input = "Q";
  o.unit_name = "tokens";
  o.causal = true;
  return MakeInputDataWorkload(*d, md, o);
}

TEST(InputData, StructureErrorsNameTheFileAndPlace) {
  EXPECT_NE(LoadError("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(LoadError("[]").find("must hold an object {\"data\": [...]}, not a list"), std::string::npos);
  EXPECT_NE(LoadError("{}").find("no \"data\" list"), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": []})").find("data: is empty"), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [], "extra": 1})").find("unknown key \"extra\""), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": [1]}], "validation_data": []})").find("\"validation_data\" is not supported"),
            std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [[{"X": [1]}]]})").find("data[0]: sequences"), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": [1]}, 3]})").find("data[1]: must be an object"), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": {"shape": [1]}}]})").find("data[0].X: no \"content\""), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": {"content": [1], "shape": [1], "dims": 1}}]})").find("unknown key \"dims\""),
            std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": {"content": [1], "shape": [-1]}}]})").find("data[0].X.shape: dimensions"),
            std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": {"content": {"b64": "@@@"}, "shape": [1]}}]})").find("not valid base64"),
            std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": ["a"]}]})").find("BYTES inputs are not supported"), std::string::npos);
  EXPECT_NE(LoadError(R"({"data": [{"X": 5}]})").find("data[0].X: expected a list of values"), std::string::npos);
  const std::string path = Write("{");
  EXPECT_EQ(LoadInputData(path).status().message().find(path), 0u);  // the file is named first
  EXPECT_EQ(LoadInputData("/nonexistent.json").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(LoadInputData(testing::TempDir()).status().message().find("is a directory"), std::string::npos);
  EXPECT_NE(LoadInputData("random").status().message().find("--input-data=random is not supported"), std::string::npos);
}

TEST(InputData, BuildsRequestsInTheModelsOrderAndCyclesThem) {
  // Entry 0: values (and nested lists) with cu_seqlens; entry 1: raw FP16 bytes (base64 of 8 x 0x3c00 = 1.0).
  const std::string q16 = R"({"content": [)" + [] {
    std::string s;
    for (int i = 0; i < 2 * 1 * 64; ++i) s += (i ? "," : "") + std::string("0.5");
    return s;
  }() + R"(], "shape": [2, 1, 64]})";
  const std::string text = R"({"data": [
      {"CU_SEQLENS_Q": {"content": [[0], [2]], "shape": [2]}, "V": )" + q16 + R"(, "K": )" + q16 + R"(, "Q": )" + q16 + R"(},
      {"Q": {"content": {"b64": "ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADwAPAA8ADw="}, "shape": [1, 1, 64]}}]})";
  auto w = Make(text, AttentionMetadata());
  ASSERT_TRUE(w.ok()) << w.status();
  Work a = (*w)->Next(), b = (*w)->Next(), c = (*w)->Next();
  EXPECT_EQ(a.units, 2);  // Q's first dimension: tokens
  EXPECT_EQ(b.units, 1);
  EXPECT_EQ(c.request, a.request);  // cycled
  const auto& r = *a.request;
  ASSERT_EQ(r.inputs_size(), 4);
  EXPECT_EQ(r.inputs(0).name(), "Q");
  EXPECT_EQ(r.inputs(3).name(), "CU_SEQLENS_Q");
  EXPECT_EQ(r.inputs(0).datatype(), "FP16");
  EXPECT_EQ(r.raw_input_contents(0).size(), 2u * 64 * 2);
  uint16_t h;
  std::memcpy(&h, r.raw_input_contents(0).data(), 2);
  EXPECT_EQ(h, 0x3800);  // 0.5 in FP16
  int32_t cu[2];
  std::memcpy(cu, r.raw_input_contents(3).data(), 8);
  EXPECT_EQ(cu[1], 2);
  EXPECT_TRUE(r.parameters().at("causal").bool_param());
  EXPECT_EQ(b.request->raw_input_contents(0).size(), 128u);
  EXPECT_EQ((*w)->unit_name(), "tokens");
}

TEST(InputData, ChecksTensorsAgainstTheModel) {
  const auto md = AttentionMetadata();
  auto error = [&](const std::string& text) {
    auto w = Make(text, md);
    return w.ok() ? std::string() : std::string(w.status().message());
  };
  EXPECT_NE(error(R"({"data": [{"X": {"content": [1], "shape": [1]}}]})")
                .find("\"X\" is not an input of attention (its inputs: Q, K, V, CU_SEQLENS_Q, CU_SEQLENS_K)"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"Q": {"content": [1], "shape": [1]}}]})").find("has rank 1; the model's Q is [-1,-1,64]"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"Q": {"content": [1], "shape": [1, 1, 32]}}]})").find("does not fit the model's"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"Q": {"content": [1, 2], "shape": [1, 1, 64]}}]})").find("2 values; shape [1,1,64] needs 64"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"Q": {"content": {"b64": "AAAA"}, "shape": [1, 1, 64]}}]})")
                .find("b64 holds 3 bytes; shape [1,1,64] of FP16 needs 128"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"Q": [1]}]})").find("no \"shape\", and the model's shape [-1,-1,64] is not fixed"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"CU_SEQLENS_Q": {"content": [0, 1.5], "shape": [2]}}]})").find("value 1.5 at index 1"),
            std::string::npos);
  EXPECT_NE(error(R"({"data": [{"CU_SEQLENS_Q": {"content": [0, 3e9], "shape": [2]}}]})").find("at index 1"),
            std::string::npos);
  // The second entry is the one named.
  EXPECT_NE(error(R"({"data": [{"CU_SEQLENS_Q": {"content": [0], "shape": [1]}}, {"CU_SEQLENS_Q": {"content": [0], "shape": [2]}}]})")
                .find("data[1].CU_SEQLENS_Q"),
            std::string::npos);
}

TEST(InputData, FixedShapesNeedNoShape) {
  inference::ModelMetadataResponse md;
  md.set_name("lin");
  auto* in = md.add_inputs();
  in->set_name("X");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(2);
  auto d = LoadInputData(Write(R"({"data": [{"X": [1, 2]}, {"X": {"b64": "AACAPwAAAEA="}}]})"));
  ASSERT_TRUE(d.ok()) << d.status();
  auto w = MakeInputDataWorkload(*d, md, {.model = "lin"});
  ASSERT_TRUE(w.ok()) << w.status();
  Work a = (*w)->Next(), b = (*w)->Next();
  EXPECT_EQ(a.request->raw_input_contents(0), b.request->raw_input_contents(0));  // 1.0f, 2.0f both ways
  EXPECT_EQ(a.units, 1);
  EXPECT_EQ((*w)->unit_name(), "requests");
  EXPECT_EQ(a.request->parameters().count("causal"), 0u);
}

}  // namespace
}  // namespace flashq::bench
