// Request validation and results through the real models (attention, linear) on
// the CPU backend, with ModelInferRequest protos built by hand. Every rejected
// request must get INVALID_ARGUMENT and a message naming the tensor or parameter
// and what was expected. Good requests are checked against the float64 reference
// and for batch invariance (a request's output bits do not depend on its batch).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "kernels/attention/attention_ref.h"
#include "common/dtype.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/models/attention_model.h"
#include "server/models/linear_model.h"
#include "server/repository/safetensors.h"

namespace flashq::server {
namespace {

namespace fs = std::filesystem;

// ---- building requests ------------------------------------------------------

// Values drawn in float, rounded to the wire dtype; `values` holds the rounded floats
// (what the server sees), `bytes` the raw little-endian encoding.
struct HostTensor {
  std::vector<float> values;
  std::string bytes;
};

HostTensor Random(DType t, int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> raw(n);
  for (auto& x : raw) x = dist(rng);
  HostTensor h;
  AppendFromFloat(t, raw.data(), n, &h.bytes);
  AppendAsFloat(t, h.bytes, &h.values);
  return h;
}

std::string Int32Bytes(const std::vector<int32_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

void AddInput(inference::ModelInferRequest* r, const std::string& name, const std::string& datatype,
              const std::vector<int64_t>& shape, const std::string& bytes) {
  auto* in = r->add_inputs();
  in->set_name(name);
  in->set_datatype(datatype);
  for (int64_t d : shape) in->add_shape(d);
  r->add_raw_input_contents(bytes);
}

// Finds an input by name to edit it in place.
inference::ModelInferRequest::InferInputTensor* Input(inference::ModelInferRequest* r, const std::string& name,
                                                      std::string** raw) {
  for (int i = 0; i < r->inputs_size(); ++i) {
    if (r->inputs(i).name() == name) {
      *raw = r->mutable_raw_input_contents(i);
      return r->mutable_inputs(i);
    }
  }
  ADD_FAILURE() << "no input " << name;
  return nullptr;
}

void SetShape(inference::ModelInferRequest* r, const std::string& name, const std::vector<int64_t>& shape) {
  std::string* raw;
  auto* in = Input(r, name, &raw);
  in->clear_shape();
  for (int64_t d : shape) in->add_shape(d);
}

void SetParam(inference::ModelInferRequest* r, const std::string& key, const inference::InferParameter& p) {
  (*r->mutable_parameters())[key] = p;
}
inference::InferParameter BoolP(bool b) { inference::InferParameter p; p.set_bool_param(b); return p; }
inference::InferParameter DoubleP(double d) { inference::InferParameter p; p.set_double_param(d); return p; }
inference::InferParameter StringP(const std::string& s) { inference::InferParameter p; p.set_string_param(s); return p; }

inference::ModelConfig ParseConfig(const std::string& text) {
  inference::ModelConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

// Like the demo repository's attention config, with a small token limit.
inference::ModelConfig AttentionConfig() {
  return ParseConfig(
      "name: \"attention\" backend: \"flashq\" max_batch_size: 0\n"
      "input [\n"
      "  { name: \"Q\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"K\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"V\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"CU_SEQLENS_Q\" data_type: TYPE_INT32 dims: [ -1 ] optional: true },\n"
      "  { name: \"CU_SEQLENS_K\" data_type: TYPE_INT32 dims: [ -1 ] optional: true }\n"
      "]\n"
      "output [\n"
      "  { name: \"O\" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n"
      "  { name: \"LSE\" data_type: TYPE_FP32 dims: [ -1, -1 ] }\n"
      "]\n"
      "parameters { key: \"kind\" value: { string_value: \"attention\" } }\n"
      "parameters { key: \"max_batch_tokens\" value: { string_value: \"256\" } }\n");
}

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

// INVALID_ARGUMENT whose message contains every one of `parts`.
void ExpectInvalid(const absl::StatusOr<std::unique_ptr<Work>>& w, const std::vector<std::string>& parts,
                   const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_FALSE(w.ok()) << "accepted a bad request";
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  for (const auto& p : parts) EXPECT_TRUE(Has(w.status(), p)) << "message lacks '" << p << "': " << w.status();
}

const OutputTensor* FindOutput(const Work& w, const std::string& name) {
  for (const auto& o : w.outputs) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

// ---- attention --------------------------------------------------------------

struct AttnCase {
  DType dtype = DType::kF16;
  int hq = 4, hkv = 2, d = 64;
  std::vector<int> lq = {5}, lk = {7};
  bool causal = false;
  bool send_cu = false;        // CU_SEQLENS_Q/K even with one sequence
  bool only_cu_q = false;      // CU_SEQLENS_Q alone (lq == lk)
  std::optional<double> scale;
  bool want_lse = false;
  uint32_t seed = 1;
};

struct AttnRequest {
  inference::ModelInferRequest request;
  HostTensor q, k, v;
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
};

AttnRequest MakeAttention(const AttnCase& c) {
  std::mt19937 rng(c.seed);
  AttnRequest a;
  for (size_t i = 0; i < c.lq.size(); ++i) {
    a.cu_q.push_back(a.cu_q.back() + c.lq[i]);
    a.cu_k.push_back(a.cu_k.back() + c.lk[i]);
  }
  const int64_t tq = a.cu_q.back(), tk = a.cu_k.back();
  a.q = Random(c.dtype, tq * c.hq * c.d, rng);
  a.k = Random(c.dtype, tk * c.hkv * c.d, rng);
  a.v = Random(c.dtype, tk * c.hkv * c.d, rng);
  const std::string dt = DTypeName(c.dtype);
  a.request.set_model_name("attention");
  AddInput(&a.request, "Q", dt, {tq, c.hq, c.d}, a.q.bytes);
  AddInput(&a.request, "K", dt, {tk, c.hkv, c.d}, a.k.bytes);
  AddInput(&a.request, "V", dt, {tk, c.hkv, c.d}, a.v.bytes);
  if (c.send_cu || c.lq.size() > 1 || c.only_cu_q) {
    AddInput(&a.request, "CU_SEQLENS_Q", "INT32", {int64_t(a.cu_q.size())}, Int32Bytes(a.cu_q));
    if (!c.only_cu_q) AddInput(&a.request, "CU_SEQLENS_K", "INT32", {int64_t(a.cu_k.size())}, Int32Bytes(a.cu_k));
  }
  if (c.causal) SetParam(&a.request, "causal", BoolP(true));
  if (c.scale) SetParam(&a.request, "softmax_scale", DoubleP(*c.scale));
  if (c.want_lse) {
    a.request.add_outputs()->set_name("O");
    a.request.add_outputs()->set_name("LSE");
  }
  return a;
}

class AttentionValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.cpu_threads = 2;
    backend_ = std::make_unique<CpuBackend>(o);
    auto m = AttentionModel::Create(AttentionConfig(), *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  absl::StatusOr<std::unique_ptr<Work>> Prepare(const inference::ModelInferRequest& r) { return model_->Prepare(r); }

  // A good request to break: Q [5, 4, 64], K/V [7, 2, 64] FP16.
  inference::ModelInferRequest Good() { return MakeAttention(AttnCase{}).request; }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(AttentionValidationTest, GoodRequestIsAccepted) {
  auto w = Prepare(Good());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->tokens, 7);
}

TEST_F(AttentionValidationTest, WrongRank) {
  auto r = Good();
  SetShape(&r, "Q", {5, 256});  // same bytes, rank 2
  ExpectInvalid(Prepare(r), {"'Q'", "rank 3", "[5, 256]"}, "Q rank 2");
  r = Good();
  SetShape(&r, "K", {7, 2, 8, 8});
  ExpectInvalid(Prepare(r), {"'K'", "rank 3"}, "K rank 4");
}

TEST_F(AttentionValidationTest, WrongShape) {
  auto r = Good();
  std::string* raw;
  Input(&r, "V", &raw);
  raw->resize(6 * 2 * 64 * 2);
  SetShape(&r, "V", {6, 2, 64});
  ExpectInvalid(Prepare(r), {"'V'", "[6, 2, 64]", "[7, 2, 64]"}, "V rows differ from K");

  r = Good();
  Input(&r, "K", &raw);
  raw->resize(7 * 4 * 32 * 2);
  SetShape(&r, "K", {7, 4, 32});
  Input(&r, "V", &raw);
  raw->resize(7 * 4 * 32 * 2);
  SetShape(&r, "V", {7, 4, 32});
  ExpectInvalid(Prepare(r), {"'K'", "head_dim 32", "expected 64"}, "K head_dim differs from Q");

  r = Good();
  SetShape(&r, "Q", {5, -4, -64});
  ExpectInvalid(Prepare(r), {"'Q'", "negative"}, "negative dims");
}

// Empty tensors pass every byte-count check whatever their other dimensions, so each
// dimension must be checked against its own limit before it narrows to int. Q [0, 2^31, 64]
// with K/V [0, 2^32 - 1, 64] once gave int(Hq) % int(Hkv) = INT_MIN % -1: SIGFPE.
TEST_F(AttentionValidationTest, ExtremeDimensionsOfEmptyTensorsAreRefused) {
  const int64_t kTwo31 = int64_t(1) << 31;
  auto empty = [&](std::vector<int64_t> q, std::vector<int64_t> kv) {
    inference::ModelInferRequest r;
    r.set_model_name("attention");
    AddInput(&r, "Q", "FP16", q, "");
    AddInput(&r, "K", "FP16", kv, "");
    AddInput(&r, "V", "FP16", kv, "");
    return r;
  };
  ExpectInvalid(Prepare(empty({0, kTwo31, 64}, {0, 2 * kTwo31 - 1, 64})), {"'Q'", "2147483648", "0..2147483647"},
                "the SIGFPE request");
  ExpectInvalid(Prepare(empty({0, kTwo31 - 1, 64}, {0, 1, 64})), {"num_heads_q (2147483647", "1..1024"},
                "Hq INT32_MAX");
  ExpectInvalid(Prepare(empty({0, 4, 64}, {0, 2, 64})), {"0 query", "at least one"}, "no tokens");
  // Every combination of edge values in every dimension: refused, never a crash.
  const int64_t edges[] = {0, 1, 2, kTwo31 - 1, kTwo31, 2 * kTwo31 - 1, INT64_MAX};
  int refused = 0;
  for (int64_t a : edges)
    for (int64_t b : edges)
      for (int64_t c : edges) {
        auto w = Prepare(empty({a, b, c}, {a, b, c}));
        refused += !w.ok();
      }
  EXPECT_EQ(refused, 7 * 7 * 7);
}

TEST_F(AttentionValidationTest, TypedContentsBesideRawBytesAreRefused) {
  auto r = Good();
  std::string* raw;
  Input(&r, "Q", &raw)->mutable_contents()->add_fp32_contents(1.0f);
  ExpectInvalid(Prepare(r), {"'Q'", "both typed contents and raw_input_contents"}, "typed and raw");
}

TEST_F(AttentionValidationTest, OutputRequestedTwiceIsRefused) {
  auto r = Good();
  r.add_outputs()->set_name("O");
  r.add_outputs()->set_name("O");
  ExpectInvalid(Prepare(r), {"'O'", "requested twice"}, "O twice");
}

TEST_F(AttentionValidationTest, ClientNamesAreQuotedShort) {
  auto r = Good();
  std::string* raw;
  const std::string long_name(1 << 20, 'z');
  Input(&r, "V", &raw)->set_name(long_name);
  auto w = Prepare(r);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status().code();
  EXPECT_LT(w.status().message().size(), 512u) << "a 1 MiB input name is quoted whole";
  EXPECT_TRUE(Has(w.status(), "1048576 bytes")) << w.status().message().substr(0, 300);
}

TEST_F(AttentionValidationTest, OutputBytesAreKnownBeforeCompute) {
  auto r = MakeAttention({.want_lse = true}).request;
  auto w = Prepare(r);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->MessageBytes(), 5 * 4 * 64 * 2 + 5 * 4 * 4) << "O [5, 4, 64] FP16 and LSE [4, 5] FP32";
}

TEST_F(AttentionValidationTest, ShapeWhoseSizeOverflowsIsRejected) {
  // 1 x (2^57 + 4) x 64 FP16 elements is 2^64 + 512 bytes: if the element count wraps
  // around, 512 bytes "match" and int(2^57 + 4) = 4 heads pass every later check.
  auto r = Good();
  std::string* raw;
  Input(&r, "Q", &raw);
  raw->assign(512, '\0');
  SetShape(&r, "Q", {1, (int64_t(1) << 57) + 4, 64});
  ExpectInvalid(Prepare(r), {"'Q'"}, "Q with an overflowing element count");
}

TEST_F(AttentionValidationTest, WrongDatatype) {
  auto r = Good();
  std::string* raw;
  auto* q = Input(&r, "Q", &raw);
  q->set_datatype("INT32");
  raw->resize(5 * 4 * 64 * 4);
  ExpectInvalid(Prepare(r), {"'Q'", "INT32", "FP16, BF16 or FP32"}, "Q INT32");

  r = Good();
  Input(&r, "Q", &raw)->set_datatype("FP64");
  ExpectInvalid(Prepare(r), {"'Q'", "FP64"}, "unknown datatype");
}

TEST_F(AttentionValidationTest, QkDatatypeMismatch) {
  auto r = Good();
  std::string* raw;
  Input(&r, "K", &raw)->set_datatype("BF16");  // same size, other type
  ExpectInvalid(Prepare(r), {"Q FP16", "K BF16", "one datatype"}, "K BF16 with Q FP16");
}

TEST_F(AttentionValidationTest, RawByteSizeMismatch) {
  auto r = Good();
  std::string* raw;
  Input(&r, "Q", &raw);
  raw->resize(raw->size() - 2);
  ExpectInvalid(Prepare(r), {"'Q'", "[5, 4, 64]", "2560 bytes", "2558"}, "Q 2 bytes short");
  r = Good();
  Input(&r, "V", &raw);
  raw->append("xx");
  ExpectInvalid(Prepare(r), {"'V'", "1792 bytes", "1794"}, "V 2 bytes long");
}

TEST_F(AttentionValidationTest, RawContentsCountMismatch) {
  auto r = Good();
  r.mutable_raw_input_contents()->RemoveLast();
  ExpectInvalid(Prepare(r), {"3 inputs", "2 raw_input_contents"}, "one raw_input_contents missing");
}

TEST_F(AttentionValidationTest, UnknownInputAndOutput) {
  auto r = Good();
  AddInput(&r, "Z", "FP16", {1}, std::string(2, '\0'));
  ExpectInvalid(Prepare(r), {"'Z'", "Q, K, V, CU_SEQLENS_Q, CU_SEQLENS_K"}, "unknown input");

  r = Good();
  r.add_outputs()->set_name("P");
  ExpectInvalid(Prepare(r), {"'P'", "O, LSE"}, "unknown output");

  r = Good();
  r.mutable_inputs()->RemoveLast();
  r.mutable_raw_input_contents()->RemoveLast();
  ExpectInvalid(Prepare(r), {"'V'", "requires"}, "missing V");

  r = Good();
  AddInput(&r, "Q", "FP16", {5, 4, 64}, std::string(5 * 4 * 64 * 2, '\0'));
  ExpectInvalid(Prepare(r), {"'Q'", "twice"}, "Q twice");
}

TEST_F(AttentionValidationTest, CuSeqlens) {
  // Q 5 rows, K/V 7 rows.
  auto with_cu = [&](const std::vector<int32_t>& cq, const std::vector<int32_t>& ck, const std::string& cq_type = "INT32") {
    auto r = Good();
    AddInput(&r, "CU_SEQLENS_Q", cq_type, {int64_t(cq.size())}, Int32Bytes(cq));
    if (!ck.empty()) AddInput(&r, "CU_SEQLENS_K", "INT32", {int64_t(ck.size())}, Int32Bytes(ck));
    return r;
  };
  ASSERT_TRUE(Prepare(with_cu({0, 2, 5}, {0, 4, 7})).ok());
  ExpectInvalid(Prepare(with_cu({0, 3, 2, 5}, {0, 2, 4, 7})), {"CU_SEQLENS_Q", "non-decreasing"}, "Q not monotonic");
  ExpectInvalid(Prepare(with_cu({0, 2, 5}, {0, 5, 4, 7})), {"CU_SEQLENS_K"}, "K not monotonic / count");
  ExpectInvalid(Prepare(with_cu({0, 2, 5}, {0, 5, 3})), {"CU_SEQLENS_K", "non-decreasing"}, "K not monotonic");
  ExpectInvalid(Prepare(with_cu({1, 5}, {0, 7})), {"CU_SEQLENS_Q", "[0] must be 0"}, "Q does not start at 0");
  ExpectInvalid(Prepare(with_cu({0, 4}, {0, 7})), {"CU_SEQLENS_Q", "= 4", "5 rows"}, "Q does not end at total_q");
  ExpectInvalid(Prepare(with_cu({0, 5}, {0, 8})), {"CU_SEQLENS_K", "= 8", "7 rows"}, "K does not end at total_k");
  ExpectInvalid(Prepare(with_cu({0, 2, 5}, {0, 7})), {"CU_SEQLENS_Q", "2 sequences", "CU_SEQLENS_K", "1"},
                "different sequence counts");
  {
    auto r = Good();
    std::vector<int64_t> cq64 = {0, 5};
    AddInput(&r, "CU_SEQLENS_Q", "INT64", {2}, std::string(reinterpret_cast<const char*>(cq64.data()), 16));
    AddInput(&r, "CU_SEQLENS_K", "INT32", {2}, Int32Bytes({0, 7}));
    ExpectInvalid(Prepare(r), {"CU_SEQLENS_Q", "INT32", "INT64"}, "cu_seqlens INT64");
  }
  {
    auto r = Good();
    AddInput(&r, "CU_SEQLENS_Q", "INT32", {1}, Int32Bytes({0}));
    AddInput(&r, "CU_SEQLENS_K", "INT32", {1}, Int32Bytes({0}));
    ExpectInvalid(Prepare(r), {"CU_SEQLENS_Q", "[n + 1]"}, "cu_seqlens with no sequence");
  }
  // CU_SEQLENS_Q alone is only allowed when Q and K have equal lengths.
  ExpectInvalid(Prepare(with_cu({0, 2, 5}, {})), {"CU_SEQLENS_K"}, "CU_SEQLENS_Q alone, lq != lk");
}

TEST_F(AttentionValidationTest, HeadCounts) {
  auto r = MakeAttention({.hq = 6, .hkv = 4}).request;
  ExpectInvalid(Prepare(r), {"num_heads_q (6", "num_heads_kv (4", "multiple"}, "Hq 6, Hkv 4");
  r = MakeAttention({.hq = 2, .hkv = 4}).request;
  ExpectInvalid(Prepare(r), {"num_heads_q (2", "num_heads_kv (4"}, "Hq < Hkv");
}

TEST_F(AttentionValidationTest, UnsupportedHeadDim) {
  auto r = MakeAttention({.d = 48}).request;
  ExpectInvalid(Prepare(r), {"'Q'", "head_dim 48", "64, 128, 256"}, "D 48");
}

TEST_F(AttentionValidationTest, BadSoftmaxScale) {
  const std::vector<std::pair<inference::InferParameter, std::string>> bad = {
      {DoubleP(0.0), "zero"},
      {DoubleP(-0.125), "negative"},
      {DoubleP(std::numeric_limits<double>::quiet_NaN()), "NaN"},
      {DoubleP(std::numeric_limits<double>::infinity()), "inf"},
      {DoubleP(1e300), "overflows float"},
      {StringP("abc"), "not a number"},
      {BoolP(true), "bool"},
  };
  for (const auto& [p, what] : bad) {
    auto r = Good();
    SetParam(&r, "softmax_scale", p);
    ExpectInvalid(Prepare(r), {"'softmax_scale'"}, what);
    auto w = Prepare(r);
    if (!w.ok() && what != "not a number" && what != "bool") {
      EXPECT_TRUE(Has(w.status(), "> 0")) << "expected value missing: " << w.status();
    }
  }
  auto r = Good();
  SetParam(&r, "softmax_scale", StringP("0.125"));
  EXPECT_TRUE(Prepare(r).ok()) << "a number as a string is accepted";
}

TEST_F(AttentionValidationTest, CausalMustBeABool) {
  for (const auto& p : {StringP("yes"), DoubleP(1.0), StringP("")}) {
    auto r = Good();
    SetParam(&r, "causal", p);
    ExpectInvalid(Prepare(r), {"'causal'", "bool"}, p.DebugString());
  }
  for (const auto& p : {BoolP(true), StringP("false"), StringP("1")}) {
    auto r = Good();
    SetParam(&r, "causal", p);
    EXPECT_TRUE(Prepare(r).ok()) << p.DebugString();
  }
}

TEST_F(AttentionValidationTest, TooManyTokens) {
  auto r = MakeAttention({.lq = {257}, .lk = {3}}).request;  // max_batch_tokens=256 in the config
  ExpectInvalid(Prepare(r), {"257 tokens", "max_batch_tokens=256"}, "over the per-request token limit");
}

// ---- attention results against float64 ------------------------------------

// |out - ref| <= atol + rtol * |ref|, with ref rounded through the output dtype.
void ExpectClose(DType t, const std::string& bytes, const std::vector<float>& ref, double atol, double rtol,
                 const std::string& what) {
  std::vector<float> out;
  AppendAsFloat(t, bytes, &out);
  ASSERT_EQ(out.size(), ref.size()) << what;
  std::string ref_bytes;
  AppendFromFloat(t, ref.data(), int64_t(ref.size()), &ref_bytes);
  std::vector<float> ref_rounded;
  AppendAsFloat(t, ref_bytes, &ref_rounded);
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(double(out[i]) - ref_rounded[i]);
    worst = std::max(worst, err);
    if (!(err <= atol + rtol * std::fabs(ref_rounded[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << out.size() << " elements off; worst error " << worst;
}

void Tolerance(DType t, double* atol, double* rtol) {
  if (t == DType::kBF16) {
    *atol = 1e-2;
    *rtol = 1.0 / 128;
  } else {
    *atol = 1e-3;
    *rtol = 1.0 / 1024;
  }
}

class AttentionResultTest : public AttentionValidationTest {
 protected:
  // Runs the request alone and compares O (and LSE) with VarlenAttentionRef<double>.
  void CheckAgainstReference(const AttnCase& c, const std::string& what) {
    SCOPED_TRACE(what);
    AttnRequest a = MakeAttention(c);
    auto w = Prepare(a.request);
    ASSERT_TRUE(w.ok()) << w.status();
    model_->Execute({w->get()});
    ASSERT_TRUE((*w)->status.ok()) << (*w)->status;

    const int64_t tq = a.cu_q.back();
    const float scale = c.scale ? float(*c.scale) : float(1.0 / std::sqrt(double(c.d)));
    attention::AttentionShape shape{int(c.lq.size()), c.hq, c.hkv, c.d, scale, c.causal};
    std::vector<float> o(tq * c.hq * c.d), lse(size_t(c.hq) * tq);
    attention::VarlenAttentionRef<double>(a.q.values.data(), a.k.values.data(), a.v.values.data(), a.cu_q.data(),
                                          a.cu_k.data(), shape, o.data(), lse.data());

    const OutputTensor* out = FindOutput(**w, "O");
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->dtype, c.dtype);
    EXPECT_EQ(out->shape, (std::vector<int64_t>{tq, c.hq, c.d}));
    double atol, rtol;
    Tolerance(c.dtype, &atol, &rtol);
    ExpectClose(c.dtype, out->data, o, atol, rtol, "O");

    const OutputTensor* l = FindOutput(**w, "LSE");
    if (!c.want_lse) {
      EXPECT_EQ(l, nullptr) << "LSE was not asked for";
      return;
    }
    ASSERT_NE(l, nullptr);
    EXPECT_EQ(l->shape, (std::vector<int64_t>{c.hq, tq}));
    std::vector<float> got;
    AppendAsFloat(DType::kF32, l->data, &got);
    ASSERT_EQ(got.size(), lse.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(lse[i])) {
        EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << "LSE " << i;
      } else {
        EXPECT_NEAR(got[i], lse[i], 1e-4 + 1e-5 * std::fabs(lse[i])) << "LSE " << i;
      }
    }
  }
};

TEST_F(AttentionResultTest, SingleSequence) {
  CheckAgainstReference({.hq = 2, .hkv = 2, .lq = {17}, .lk = {17}}, "FP16 MHA, one sequence");
  CheckAgainstReference({.lq = {5}, .lk = {33}, .send_cu = true, .want_lse = true}, "lq != lk, explicit cu_seqlens, LSE");
}

TEST_F(AttentionResultTest, ThreeRaggedSequences) {
  CheckAgainstReference({.lq = {5, 1, 12}, .lk = {9, 1, 30}, .seed = 2}, "3 ragged sequences");
  CheckAgainstReference({.lq = {7, 3, 11}, .lk = {7, 3, 11}, .only_cu_q = true, .seed = 3}, "CU_SEQLENS_Q alone");
}

TEST_F(AttentionResultTest, CausalWithLqDifferentFromLk) {
  // Bottom-right aligned: the 3 queries of the first sequence are the last 3 of 10.
  CheckAgainstReference({.lq = {3, 7, 1}, .lk = {10, 7, 16}, .causal = true, .want_lse = true, .seed = 4},
                        "causal, lq != lk");
  // lq > lk: the first queries see no key (O = 0, LSE = -inf).
  CheckAgainstReference({.lq = {6}, .lk = {2}, .causal = true, .want_lse = true, .seed = 5}, "causal, lq > lk");
}

TEST_F(AttentionResultTest, GroupedQueryAttention) {
  CheckAgainstReference({.hq = 8, .hkv = 2, .d = 128, .lq = {4, 9}, .lk = {20, 9}, .causal = true, .seed = 6},
                        "GQA 4, D 128, causal");
  CheckAgainstReference({.hq = 4, .hkv = 1, .d = 64, .lq = {8}, .lk = {8}, .seed = 7}, "MQA");
}

TEST_F(AttentionResultTest, Bf16AndScale) {
  CheckAgainstReference({.dtype = DType::kBF16, .lq = {6, 2}, .lk = {6, 13}, .scale = 0.05, .seed = 8},
                        "BF16, softmax_scale 0.05");
  CheckAgainstReference({.dtype = DType::kF32, .lq = {4}, .lk = {9}, .causal = true, .seed = 9}, "FP32 I/O");
}

// ---- batch invariance through the model -------------------------------------

std::string OutputBytes(const Work& w, const std::string& name) {
  const OutputTensor* o = FindOutput(w, name);
  EXPECT_NE(o, nullptr) << name;
  return o ? o->data : std::string();
}

TEST_F(AttentionResultTest, BatchInvariance) {
  const AttnCase c0{.lq = {9}, .lk = {9}, .causal = true, .seed = 10};
  const AttnCase c1{.lq = {3, 12}, .lk = {17, 12}, .causal = true, .want_lse = true, .seed = 11};
  const AttnCase c2{.lq = {1, 1, 30}, .lk = {40, 2, 31}, .causal = true, .seed = 12};
  AttnRequest r0 = MakeAttention(c0), r1 = MakeAttention(c1), r2 = MakeAttention(c2);
  // c1 asks for LSE, which is part of the batch key; ask everyone for it so the three may share a batch.
  for (AttnRequest* r : {&r0, &r2}) {
    r->request.add_outputs()->set_name("O");
    r->request.add_outputs()->set_name("LSE");
  }
  auto alone = Prepare(r1.request);
  ASSERT_TRUE(alone.ok()) << alone.status();
  model_->Execute({alone->get()});
  ASSERT_TRUE((*alone)->status.ok());

  auto w0 = Prepare(r0.request), w1 = Prepare(r1.request), w2 = Prepare(r2.request);
  ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
  ASSERT_EQ((*w0)->batch_key, (*w1)->batch_key);
  ASSERT_EQ((*w2)->batch_key, (*w1)->batch_key);
  model_->Execute({w0->get(), w1->get(), w2->get()});
  for (auto* w : {&w0, &w1, &w2}) ASSERT_TRUE((**w)->status.ok()) << (**w)->status;

  EXPECT_EQ(OutputBytes(**w1, "O"), OutputBytes(**alone, "O")) << "O of w1 differs between alone and batched";
  EXPECT_EQ(OutputBytes(**w1, "LSE"), OutputBytes(**alone, "LSE")) << "LSE of w1 differs";
  // The neighbours got their own rows back, not w1's.
  auto w0_alone = Prepare(r0.request);
  ASSERT_TRUE(w0_alone.ok());
  model_->Execute({w0_alone->get()});
  EXPECT_EQ(OutputBytes(**w0, "O"), OutputBytes(**w0_alone, "O"));
  EXPECT_EQ(FindOutput(**w2, "O")->shape, (std::vector<int64_t>{32, 4, 64}));
}

TEST_F(AttentionResultTest, KeysSeparateIncompatibleRequests) {
  // Requests that cannot share a launch must not share a batch key.
  auto key = [&](const AttnCase& c, const std::function<void(inference::ModelInferRequest*)>& edit = nullptr) {
    auto r = MakeAttention(c).request;
    if (edit) edit(&r);
    auto w = Prepare(r);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? (*w)->batch_key : std::string();
  };
  const std::string base = key({});
  EXPECT_EQ(key({.lq = {3}, .lk = {30}, .seed = 5}), base) << "lengths do not matter";
  EXPECT_NE(key({.dtype = DType::kBF16}), base);
  EXPECT_NE(key({.hq = 8}), base);
  EXPECT_NE(key({.hkv = 4}), base);
  EXPECT_NE(key({.d = 128}), base);
  EXPECT_NE(key({.causal = true}), base);
  EXPECT_NE(key({.scale = 0.3}), base);
  EXPECT_NE(key({.want_lse = true}), base);
}

// ---- linear -----------------------------------------------------------------

constexpr int kK = 64, kN = 48;

class LinearValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fq_lin_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::mt19937 rng(77);
    w_ = Random(DType::kBF16, int64_t(kN) * kK, rng);
    ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                                 {{"weight", "BF16", {kN, kK}, w_.bytes}}).ok());
    auto config = ParseConfig(
        "name: \"lin\" backend: \"flashq\" max_batch_size: 0\n"
        "input [ { name: \"X\" data_type: TYPE_BF16 dims: [ -1, 64 ] } ]\n"
        "output [ { name: \"Y\" data_type: TYPE_BF16 dims: [ -1, 48 ] } ]\n"
        "parameters { key: \"kind\" value: { string_value: \"linear\" } }\n"
        "parameters { key: \"weight_format\" value: { string_value: \"bf16\" } }\n"
        "parameters { key: \"in_features\" value: { string_value: \"64\" } }\n"
        "parameters { key: \"out_features\" value: { string_value: \"48\" } }\n"
        "parameters { key: \"max_batch_tokens\" value: { string_value: \"128\" } }\n");
    BackendOptions o;
    o.cpu_threads = 2;
    backend_ = std::make_unique<CpuBackend>(o);
    CheckpointCache checkpoints;
    auto m = LinearModel::Create(config, dir_.string(), *backend_, checkpoints, nullptr);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  void TearDown() override { fs::remove_all(dir_); }

  struct XRequest {
    inference::ModelInferRequest request;
    HostTensor x;
  };
  XRequest MakeX(int m, uint32_t seed, DType t = DType::kBF16) {
    std::mt19937 rng(seed);
    XRequest r;
    r.x = Random(t, int64_t(m) * kK, rng, -2.0f, 2.0f);
    r.request.set_model_name("lin");
    AddInput(&r.request, "X", DTypeName(t), {m, kK}, r.x.bytes);
    return r;
  }

  fs::path dir_;
  HostTensor w_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(LinearValidationTest, WrongK) {
  auto r = MakeX(2, 1).request;
  std::string* raw;
  Input(&r, "X", &raw);
  raw->resize(2 * 32 * 2);
  SetShape(&r, "X", {2, 32});
  ExpectInvalid(model_->Prepare(r), {"'X'", "[2, 32]", "[M, 64]"}, "X with K 32");
  SetShape(&r, "X", {2, 4, 8});
  ExpectInvalid(model_->Prepare(r), {"'X'", "[M, 64]"}, "X rank 3");
  r = MakeX(2, 1).request;
  Input(&r, "X", &raw)->set_datatype("INT32");
  raw->resize(2 * 64 * 4);
  ExpectInvalid(model_->Prepare(r), {"'X'", "INT32", "FP16, BF16 or FP32"}, "X INT32");
  ExpectInvalid(model_->Prepare(MakeX(129, 1).request), {"'X'", "129 rows", "max_batch_tokens=128"}, "too many rows");
  r = MakeX(0, 1).request;
  ExpectInvalid(model_->Prepare(r), {"'X'", "M >= 1"}, "no rows");
}

TEST_F(LinearValidationTest, MatchesFloat64Reference) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(t));
    XRequest r = MakeX(5, 3, t);
    auto w = model_->Prepare(r.request);
    ASSERT_TRUE(w.ok()) << w.status();
    model_->Execute({w->get()});
    ASSERT_TRUE((*w)->status.ok());
    std::vector<float> ref(5 * kN);
    for (int m = 0; m < 5; ++m) {
      for (int n = 0; n < kN; ++n) {
        double acc = 0;
        for (int k = 0; k < kK; ++k) acc += double(r.x.values[m * kK + k]) * w_.values[n * kK + k];
        ref[m * kN + n] = float(acc);
      }
    }
    const OutputTensor* y = FindOutput(**w, "Y");
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(y->shape, (std::vector<int64_t>{5, kN}));
    double atol, rtol;
    Tolerance(t, &atol, &rtol);
    ExpectClose(t, y->data, ref, atol * 4, rtol, "Y");  // |Y| up to ~10: fp32 accumulation error scales with it
  }
}

TEST_F(LinearValidationTest, BatchInvariance) {
  XRequest r0 = MakeX(3, 10), r1 = MakeX(7, 11), r2 = MakeX(1, 12);
  auto alone = model_->Prepare(r1.request);
  ASSERT_TRUE(alone.ok());
  model_->Execute({alone->get()});
  auto w0 = model_->Prepare(r0.request), w1 = model_->Prepare(r1.request), w2 = model_->Prepare(r2.request);
  ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
  ASSERT_EQ((*w0)->batch_key, (*w1)->batch_key);
  model_->Execute({w0->get(), w1->get(), w2->get()});
  for (auto* w : {&w0, &w1, &w2}) ASSERT_TRUE((**w)->status.ok());
  EXPECT_EQ(OutputBytes(**w1, "Y"), OutputBytes(**alone, "Y")) << "Y of w1 differs between alone and batched";
  EXPECT_EQ(FindOutput(**w0, "Y")->shape, (std::vector<int64_t>{3, kN}));
  EXPECT_EQ(FindOutput(**w2, "Y")->shape, (std::vector<int64_t>{1, kN}));
  auto w2_alone = model_->Prepare(r2.request);
  ASSERT_TRUE(w2_alone.ok());
  model_->Execute({w2_alone->get()});
  EXPECT_EQ(OutputBytes(**w2, "Y"), OutputBytes(**w2_alone, "Y"));
}

}  // namespace
}  // namespace flashq::server
