// The gRPC frontend's ModelInfer codec (server/frontend/infer_codec.h) against protobuf:
// the same message from the same bytes however they are cut into slices, raw tensors as
// views with no copy, and response bytes identical to protobuf's serialization.
#include "server/frontend/infer_codec.h"

#include <random>

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

namespace flashq::server {
namespace {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

inference::ModelInferRequest Request() {
  inference::ModelInferRequest r;
  r.set_model_name("attention");
  r.set_model_version("2");
  r.set_id("req-7");
  (*r.mutable_parameters())["sequence_id"].set_int64_param(42);
  (*r.mutable_parameters())["causal"].set_bool_param(true);
  for (auto [name, bytes] : {std::pair{"Q", 100003}, {"K", 5}, {"V", 0}}) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype("BF16");
    in->add_shape(bytes / 2);
    *r.add_raw_input_contents() = RandomBytes(size_t(bytes), uint32_t(bytes));
  }
  r.add_outputs()->set_name("O");
  return r;
}

// `bytes` cut into slices of `len` bytes (the last one shorter), each a copy.
std::vector<grpc::Slice> Cut(const std::string& bytes, size_t len) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += len) slices.emplace_back(bytes.data() + at, std::min(len, bytes.size() - at));
  return slices;
}

std::string Joined(const std::vector<std::string_view>& pieces) {
  std::string s;
  for (std::string_view p : pieces) s.append(p);
  return s;
}

TEST(InferCodec, ParsesAsProtobufDoesWhateverTheSlices) {
  const inference::ModelInferRequest want = Request();
  const std::string wire = want.SerializeAsString();
  inference::ModelInferRequest rest = want;
  rest.clear_raw_input_contents();
  for (size_t len : {size_t(1), size_t(3), size_t(7), size_t(4096), wire.size()}) {
    SCOPED_TRACE(len);
    RawInferRequest got;
    const std::vector<grpc::Slice> slices = Cut(wire, len);
    ASSERT_TRUE(ParseRawInferRequest(slices, &got).ok());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got.message, rest));
    EXPECT_EQ(got.message.raw_input_contents_size(), 0);
    ASSERT_EQ(got.raw.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(Joined(got.raw[size_t(i)]), want.raw_input_contents(i)) << i;
    // Views into the slices it keeps: nothing was copied.
    auto in_a_slice = [&](std::string_view p) {
      for (const grpc::Slice& s : got.slices) {
        const auto* b = reinterpret_cast<const char*>(s.begin());
        if (p.data() >= b && p.data() + p.size() <= b + s.size()) return true;
      }
      return false;
    };
    for (const auto& pieces : got.raw) {
      for (std::string_view p : pieces) EXPECT_TRUE(in_a_slice(p));
    }
    if (len == 1) EXPECT_EQ(got.raw[0].size(), 100003u);  // one piece per slice
  }
}

TEST(InferCodec, KeepsFieldsItDoesNotKnowAndGroups) {
  // Unknown fields (varint, fixed32, fixed64, a group with a nested field) after the
  // known ones: protobuf keeps them, and so must the rest of the message.
  std::string wire = Request().SerializeAsString();
  wire += std::string("\xc8\x3e\x96\x01", 4);                  // field 1001, varint 150
  wire += std::string("\xcd\x3e\x01\x02\x03\x04", 6);          // field 1001, fixed32
  wire += std::string("\xc9\x3e\x01\x02\x03\x04\x05\x06\x07\x08", 10);  // fixed64
  wire += std::string("\xcb\x3e\x08\x05\xcc\x3e", 6);          // group 1001 { 1: 5 }
  // A five-byte tag whose value passes 32 bits: protobuf keeps its low 32 (here a fixed32).
  wire += std::string("\xbd\xc7\xbe\xcc\x3e\x6f\xbe\xa1\x3f", 9);
  inference::ModelInferRequest want;
  ASSERT_TRUE(want.ParseFromString(wire));
  RawInferRequest got;
  ASSERT_TRUE(ParseRawInferRequest(Cut(wire, 5), &got).ok());
  want.clear_raw_input_contents();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got.message, want));
}

TEST(InferCodec, RefusesWhatProtobufRefusesAndSaysWhere) {
  const std::string wire = Request().SerializeAsString();
  // Every truncation that protobuf refuses, the codec refuses too (and accepts the others).
  for (size_t n = 0; n < 200; ++n) {
    inference::ModelInferRequest p;
    RawInferRequest got;
    const std::string cut = wire.substr(0, n);
    EXPECT_EQ(ParseRawInferRequest(Cut(cut, 3), &got).ok(), p.ParseFromString(cut)) << n;
  }
  struct Case {
    std::string bytes, says;
  };
  for (const Case& c : {Case{std::string("\x3a\xff\xff\xff\xff\x0f", 6), "a bad length"},
                        Case{std::string("\x3a\x80\x80\x80\x80\x80\x00", 7), "a bad length"},  // six bytes
                        Case{std::string("\x3a\x05ab", 4), "raw_input_contents past the end"},
                        Case{std::string("\x0a\x05ab", 4), "past the end of the message"},
                        Case{std::string("\x08\xff\xff", 3), "truncated varint"},
                        Case{std::string("\x0b\x08\x01", 3), "unterminated group"},
                        Case{std::string("\x0b\x14", 2), "mismatched end of group"},
                        Case{std::string("\x0c", 1), "unsupported wire type"},
                        Case{std::string("\x00\x01", 2), "invalid field number"},
                        Case{std::string("\x0a\x02\xff\xfe", 4), "does not parse"}}) {  // model_name: bad UTF-8
    inference::ModelInferRequest p;
    EXPECT_FALSE(p.ParseFromString(c.bytes)) << c.says;  // protobuf refuses it too
    RawInferRequest got;
    const absl::Status s = ParseRawInferRequest(Cut(c.bytes, 1), &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("ModelInferRequest"), std::string::npos) << s.message();
  }
}

std::string Serialized(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& p : slices) s.append(reinterpret_cast<const char*>(p.begin()), p.size());
  return s;
}

TEST(InferCodec, ResponseBytesAreProtobufs) {
  const inference::ModelInferRequest request = Request();
  auto work = [](bool bound) {
    Work w;
    w.model_version = 2;
    w.outputs.push_back({"O", DType::kBF16, {3, 2}, RandomBytes(12, 1)});
    w.outputs.push_back({"LSE", DType::kF32, {0}, std::string()});
    w.outputs.push_back({"BIG", DType::kF16, {70000}, RandomBytes(140000, 2)});
    if (bound) w.shm_outputs.push_back({"O", SharedMemoryBuffer{}});
    return w;
  };
  for (bool bound : {false, true}) {
    SCOPED_TRACE(bound);
    Work a = work(bound), b = work(bound);
    inference::ModelInferResponse want;
    FillInferResponse(request, a, &want);
    const grpc::ByteBuffer got = SerializeInferResponse(request, b);
    EXPECT_EQ(Serialized(got), want.SerializeAsString());
    inference::ModelInferResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(Serialized(got)));
    EXPECT_EQ(parsed.raw_output_contents_size(), 3);
    EXPECT_EQ(parsed.raw_output_contents(0).empty(), bound);
  }
}

TEST(InferCodec, StreamResponseBytesAreProtobufs) {
  const inference::ModelInferRequest request = Request();
  Work a, b;
  a.outputs.push_back({"O", DType::kBF16, {3, 2}, RandomBytes(12, 3)});
  b.outputs = a.outputs;
  inference::ModelStreamInferResponse ok;
  FillInferResponse(request, a, ok.mutable_infer_response());
  EXPECT_EQ(Serialized(SerializeStreamResponse(absl::OkStatus(), request, &b)), ok.SerializeAsString());

  inference::ModelStreamInferResponse failed;
  failed.set_error_message("INVALID_ARGUMENT: input 'Q' is wrong");
  failed.mutable_infer_response()->set_id("req-7");
  failed.mutable_infer_response()->set_model_name("attention");
  EXPECT_EQ(Serialized(SerializeStreamResponse(absl::InvalidArgumentError("input 'Q' is wrong"), request, nullptr)),
            failed.SerializeAsString());
}

}  // namespace
}  // namespace flashq::server
