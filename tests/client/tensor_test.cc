#include "client/lib/tensor.h"

#include <cmath>

#include <gtest/gtest.h>

namespace flashq::client {
namespace {

TEST(Tensor, Fp16AndBf16RoundTrip) {
  const std::vector<float> v = {0.0f, 1.0f, -2.5f, 0.333333f, 65504.0f, 1e-7f, -0.0f, 3.14159f};
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    const std::string raw = EncodeFloats(v, t);
    ASSERT_EQ(raw.size(), v.size() * size_t(DTypeSize(t)));
    auto back = DecodeFloats(raw, t);
    ASSERT_TRUE(back.ok());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ((*back)[i], RoundThrough(t, v[i])) << DTypeName(t) << " " << v[i];
  }
  EXPECT_FALSE(DecodeFloats("abc", DType::kF16).ok());
  EXPECT_FALSE(DecodeFloats("abcd", DType::kI32).ok());
}

TEST(Tensor, AddInputsChecksSizes) {
  inference::ModelInferRequest req;
  const int64_t shape[] = {2, 3};
  std::vector<float> six(6, 1.0f);
  ASSERT_TRUE(AddFloatInput(req, "X", DType::kBF16, shape, six).ok());
  EXPECT_FALSE(AddFloatInput(req, "Y", DType::kF16, shape, std::vector<float>(5)).ok());
  EXPECT_FALSE(AddRawInput(req, "Z", DType::kF16, shape, std::string(11, '\0')).ok());
  const int64_t cs[] = {3};
  const int32_t cu[] = {0, 4, 9};
  ASSERT_TRUE(AddInt32Input(req, "CU_SEQLENS_Q", cs, cu).ok());
  ASSERT_EQ(req.inputs_size(), 2);
  ASSERT_EQ(req.raw_input_contents_size(), 2);
  EXPECT_EQ(req.inputs(0).datatype(), "BF16");
  EXPECT_EQ(req.inputs(0).shape_size(), 2);
  EXPECT_EQ(req.raw_input_contents(0).size(), 12u);
  EXPECT_EQ(req.inputs(1).datatype(), "INT32");
  EXPECT_EQ(req.raw_input_contents(1).size(), 12u);
}

TEST(Tensor, SequenceParameters) {
  inference::ModelInferRequest req;
  EXPECT_EQ(SequenceId(req), 0u);
  SetSequence(req, 0xfeedbeef12345ull, true, false);
  EXPECT_EQ(SequenceId(req), 0xfeedbeef12345ull);
  EXPECT_TRUE(req.parameters().at("sequence_start").bool_param());
  EXPECT_FALSE(req.parameters().at("sequence_end").bool_param());
  SetSequence(req, 0xfeedbeef12345ull, false, true);
  EXPECT_FALSE(req.parameters().at("sequence_start").bool_param());
  EXPECT_TRUE(req.parameters().at("sequence_end").bool_param());
  SetDoubleParam(req, "softmax_scale", 0.125);
  SetBoolParam(req, "causal", true);
  EXPECT_EQ(req.parameters().at("softmax_scale").double_param(), 0.125);
}

TEST(Tensor, FindOutputDecodesRawContents) {
  inference::ModelInferResponse resp;
  auto* o = resp.add_outputs();
  o->set_name("O");
  o->set_datatype("FP16");
  o->add_shape(2);
  o->add_shape(2);
  *resp.add_raw_output_contents() = EncodeFloats(std::vector<float>{1, 2, 3, 4}, DType::kF16);
  auto v = OutputAsFloats(resp, "O");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(OutputAsFloats(resp, "LSE").status().code(), absl::StatusCode::kNotFound);
  resp.mutable_outputs(0)->add_shape(3);  // shape no longer matches the bytes
  EXPECT_FALSE(FindOutput(resp, "O").ok());
}

}  // namespace
}  // namespace flashq::client
