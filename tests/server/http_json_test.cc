// The HTTP/REST translation (server/frontend/http_json.h): JSON and binary tensors become the
// raw bytes gRPC would carry, framing errors are INVALID_ARGUMENT, and responses and protos
// come back as Triton's tools read them.
#include "server/frontend/http_json.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/dtype.h"

namespace flashq::server {
namespace {

absl::Status Parse(const std::string& body, std::optional<size_t> header, inference::ModelInferRequest* r,
                   HttpOutputForm* form) {
  return ParseHttpInferRequest(body, header, "m", "", r, form);
}

TEST(HttpJson, JsonDataBecomesRawLittleEndianBytes) {
  inference::ModelInferRequest r;
  HttpOutputForm form;
  ASSERT_TRUE(Parse(R"({"id": "a", "parameters": {"causal": true, "softmax_scale": 0.5, "sequence_id": 7},
                        "inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP16", "data": [[1.0, -2.0], [0.5, 3]]},
                                   {"name": "C", "shape": [3], "datatype": "INT32", "data": [0, 5, -9]},
                                   {"name": "B", "shape": [2], "datatype": "BF16", "data": [1.0, 2.0]}]})",
                    std::nullopt, &r, &form)
                  .ok());
  EXPECT_EQ(r.id(), "a");
  EXPECT_TRUE(r.parameters().at("causal").bool_param());
  EXPECT_EQ(r.parameters().at("softmax_scale").double_param(), 0.5);
  EXPECT_EQ(r.parameters().at("sequence_id").int64_param(), 7);
  ASSERT_EQ(r.raw_input_contents_size(), 3);
  const std::string& x = r.raw_input_contents(0);
  ASSERT_EQ(x.size(), 8u);
  uint16_t h[4];
  std::memcpy(h, x.data(), 8);
  EXPECT_EQ(h[0], FloatToF16(1.0f));
  EXPECT_EQ(h[1], FloatToF16(-2.0f));
  EXPECT_EQ(h[3], FloatToF16(3.0f));
  int32_t c[3];
  std::memcpy(c, r.raw_input_contents(1).data(), 12);
  EXPECT_EQ(c[2], -9);
  uint16_t b[2];
  std::memcpy(b, r.raw_input_contents(2).data(), 4);
  EXPECT_EQ(b[1], FloatToBf16(2.0f));
  EXPECT_FALSE(form.Binary("O"));
}

TEST(HttpJson, BinaryTensorsFollowTheHeaderInInputOrder) {
  const std::string header =
      R"({"inputs": [{"name": "A", "shape": [2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}},
                     {"name": "B", "shape": [3], "datatype": "UINT8", "parameters": {"binary_data_size": 3}}],
          "outputs": [{"name": "O", "parameters": {"binary_data": true}}, {"name": "P"}]})";
  inference::ModelInferRequest r;
  HttpOutputForm form;
  ASSERT_TRUE(Parse(header + "abCDE", header.size(), &r, &form).ok());
  ASSERT_EQ(r.raw_input_contents_size(), 2);
  EXPECT_EQ(r.raw_input_contents(0), "ab");
  EXPECT_EQ(r.raw_input_contents(1), "CDE");
  EXPECT_EQ(r.inputs(0).parameters().count("binary_data_size"), 0u) << "HTTP framing is not passed on";
  EXPECT_TRUE(form.Binary("O"));
  EXPECT_FALSE(form.Binary("P"));
}

TEST(HttpJson, FramingErrorsAreInvalidArgument) {
  const std::string header =
      R"({"inputs": [{"name": "A", "shape": [2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}}]})";
  struct Case {
    std::string body;
    std::optional<size_t> header;
    const char* words;
  } cases[] = {
      {header + "ab", header.size() + 3, "Inference-Header-Content-Length"},
      {header + "a", header.size(), "runs past the end"},
      {header + "abc", header.size(), "1 bytes after"},
      {header + "ab", std::nullopt, "malformed JSON"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "UINT8", "parameters": {"binary_data_size": 1}}]})",
       std::nullopt, "no Inference-Header-Content-Length"},
      {"{", std::nullopt, "malformed JSON"},
      {"[]", std::nullopt, "JSON object"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "UINT8", "data": [256]}]})", std::nullopt, "UINT8"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "data": ["x"]}]})", std::nullopt,
       "not a number"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "BYTES", "data": [1]}]})", std::nullopt, "BYTES"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32"}]})", std::nullopt, "no 'data'"},
      {R"({"inputs": [{"name": "A", "shape": ["1"], "datatype": "FP32", "data": [1]}]})", std::nullopt, "shape"},
      {R"({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "data": )" + std::string(40, '[') + "1" +
           std::string(40, ']') + "}]}",
       std::nullopt, "nested"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest r;
    HttpOutputForm form;
    absl::Status s = Parse(c.body, c.header, &r, &form);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(std::string(s.message()).find(c.words), std::string::npos) << s.message();
  }
}

TEST(HttpJson, ResponseIsJsonDataOrBinaryAfterTheHeader) {
  inference::ModelInferRequest req;
  req.set_id("r");
  inference::ModelInferResponse resp;
  resp.set_model_name("m");
  resp.set_model_version("1");
  resp.set_id("r");
  for (const char* name : {"O", "P"}) {
    auto* o = resp.add_outputs();
    o->set_name(name);
    o->set_datatype("FP16");
    o->add_shape(2);
    uint16_t v[2] = {FloatToF16(1.5f), FloatToF16(-4.0f)};
    resp.add_raw_output_contents(std::string(reinterpret_cast<const char*>(v), 4));
  }
  HttpOutputForm form;
  form.binary["P"] = true;
  HttpInferResponse out = MakeHttpInferResponse(req, resp, form);
  ASSERT_TRUE(out.header_length.has_value());
  const std::string json = out.body.substr(0, *out.header_length);
  EXPECT_NE(json.find(R"("data":[1.5,-4.0])"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("binary_data_size":4)"), std::string::npos) << json;
  EXPECT_EQ(out.body.size(), *out.header_length + 4);

  form.binary["P"] = false;
  resp.mutable_raw_output_contents(1)->assign(4, '\0');
  EXPECT_FALSE(MakeHttpInferResponse(req, resp, form).header_length.has_value());
}

TEST(HttpJson, ProtoIntegersAreNumbersAndEnumsNames) {
  inference::ModelConfig c;
  c.set_name("m");
  auto* in = c.add_input();
  in->set_name("X");
  in->set_data_type(inference::TYPE_BF16);
  in->add_dims(-1);
  in->add_dims(4096);
  (*c.mutable_parameters())["kind"].set_string_value("linear");
  const std::string j = ProtoToJson(c);
  EXPECT_NE(j.find(R"("max_batch_size":0)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("dims":[-1,4096])"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("data_type":"TYPE_BF16")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("parameters":{"kind":{"string_value":"linear"}})"), std::string::npos) << j;
  inference::ModelStatisticsResponse st;
  st.add_model_stats()->set_inference_count(uint64_t(1) << 40);
  EXPECT_NE(ProtoToJson(st).find(R"("inference_count":1099511627776)"), std::string::npos) << ProtoToJson(st);
}

}  // namespace
}  // namespace flashq::server
