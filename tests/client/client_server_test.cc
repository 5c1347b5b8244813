// The client library against a real flashq-server (CPU backend, demo models):
// sync, async and streaming calls, FP16/BF16 tensors, kv_attention sessions over
// a stream (every output checked against a float64 reference written here), round-
// robin and sequence routing over two endpoint names of one server, ModelStatistics;
// and headers (a bearer token) on every kind of call, against a second server.
// Label: integration (starts two servers, ~10 s).
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/bench/spawn.h"
#include "client/lib/client.h"
#include "client/lib/tensor.h"

namespace flashq::client {
namespace {

class ClientServerTest : public ::testing::Test {
 public:  // Attention() is shared with ClientTokenTest
  static void SetUpTestSuite() {
    bench::SpawnOptions o;
    o.binary = FLASHQ_SERVER_BIN;
    o.backend = "cpu";
    o.log_path = ::testing::TempDir() + "/flashq_client_server_test.log";
    o.extra_args = {std::string("--demo-cache-dir=") + FLASHQ_DEMO_CACHE};
    auto s = bench::ServerProcess::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
    // Two names for one server: routing is exercised, the sessions work on either.
    auto c = Client::Create({.endpoints = {server_->endpoint(), "localhost:" + std::to_string(server_->grpc_port())}});
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = c->release();
    ASSERT_TRUE(client_->WaitUntilReady(absl::Seconds(30)).ok());
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    if (server_) EXPECT_EQ(server_->Stop(), "exited with status 0");
    delete server_;
    server_ = nullptr;
  }

  static inference::ModelInferRequest Attention(DType dt, int tokens) {
    inference::ModelInferRequest req;
    req.set_model_name("attention");
    std::vector<float> q(size_t(tokens) * 8 * 64), kv(size_t(tokens) * 2 * 64);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.01f * float(i));
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.02f * float(i));
    const int64_t qs[] = {tokens, 8, 64}, ks[] = {tokens, 2, 64}, cs[] = {2};
    const int32_t cu[] = {0, tokens};
    EXPECT_TRUE(AddFloatInput(req, "Q", dt, qs, q).ok());
    EXPECT_TRUE(AddFloatInput(req, "K", dt, ks, kv).ok());
    EXPECT_TRUE(AddFloatInput(req, "V", dt, ks, kv).ok());
    EXPECT_TRUE(AddInt32Input(req, "CU_SEQLENS_Q", cs, cu).ok());
    EXPECT_TRUE(AddInt32Input(req, "CU_SEQLENS_K", cs, cu).ok());
    SetBoolParam(req, "causal", true);
    RequestOutput(req, "O");
    return req;
  }

  // The demo kv_attention model: Hq 32, Hkv 8, D 128.
  static constexpr int kHq = 32, kHkv = 8, kD = 128;

  // One kv_attention session on the client side: the tokens sent so far (for the
  // reference) and a generator of random FP16-exact values (multiples of 2^-10 in
  // [-1, 1]), so that the server sees exactly what the reference uses.
  struct KvSession {
    uint64_t id;
    std::mt19937 rng;
    std::vector<float> k, v;                    // [tokens so far, kHkv, kD]
    std::vector<std::vector<float>> step_q;     // each step's queries [n, kHq, kD]
    std::vector<int> step_end;                  // tokens cached after each step
    KvSession(uint64_t id_, uint32_t seed) : id(id_), rng(seed) {}
    std::vector<float> Random(size_t n) {
      std::uniform_int_distribution<int> d(-1024, 1024);
      std::vector<float> x(n);
      for (auto& e : x) e = float(d(rng)) / 1024.0f;
      return x;
    }
    // The next request: `tokens` new tokens with random Q, K and V.
    inference::ModelInferRequest Step(int tokens, bool start, bool end) {
      std::vector<float> q = Random(size_t(tokens) * kHq * kD), k = Random(size_t(tokens) * kHkv * kD),
                         v = Random(size_t(tokens) * kHkv * kD);
      inference::ModelInferRequest req;
      req.set_model_name("kv_attention");
      const int64_t qs[] = {tokens, kHq, kD}, ks[] = {tokens, kHkv, kD};
      EXPECT_TRUE(AddFloatInput(req, "Q", DType::kF16, qs, q).ok());
      EXPECT_TRUE(AddFloatInput(req, "K", DType::kF16, ks, k).ok());
      EXPECT_TRUE(AddFloatInput(req, "V", DType::kF16, ks, v).ok());
      SetSequence(req, id, start, end);
      this->k.insert(this->k.end(), k.begin(), k.end());
      this->v.insert(this->v.end(), v.begin(), v.end());
      step_q.push_back(std::move(q));
      step_end.push_back(int(this->k.size() / (kHkv * kD)));
      return req;
    }
    // Step `s`'s output against float64 causal attention of its queries over every token
    // cached up to it (query i of n new ones sits at position end - n + i). FP16 output:
    // |o - ref| <= 2e-3 + 2e-3 |ref|.
    void ExpectOutput(const inference::ModelInferResponse& resp, size_t s) const {
      SCOPED_TRACE("kv step " + std::to_string(s));
      ASSERT_LT(s, step_q.size());
      const std::vector<float>& q = step_q[s];
      const int n = int(q.size() / (kHq * kD)), end = step_end[s];
      auto o = OutputAsFloats(resp, "O");
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_EQ(o->size(), q.size());
      const double scale = 1.0 / std::sqrt(double(kD));
      int bad = 0;
      double worst = 0;
      std::vector<double> p(static_cast<size_t>(end));
      for (int i = 0; i < n; ++i) {
        const int visible = end - n + i + 1;
        for (int h = 0; h < kHq; ++h) {
          const int hk = h / (kHq / kHkv);
          const float* qi = &q[(size_t(i) * kHq + h) * kD];
          double m = -INFINITY, l = 0;
          for (int j = 0; j < visible; ++j) {
            const float* kj = &k[(size_t(j) * kHkv + hk) * kD];
            double dot = 0;
            for (int d = 0; d < kD; ++d) dot += double(qi[d]) * double(kj[d]);
            p[j] = dot * scale;
            m = std::max(m, p[j]);
          }
          for (int j = 0; j < visible; ++j) l += (p[j] = std::exp(p[j] - m));
          for (int d = 0; d < kD; ++d) {
            double ref = 0;
            for (int j = 0; j < visible; ++j) ref += p[j] * double(v[(size_t(j) * kHkv + hk) * kD + d]);
            ref /= l;
            const double err = std::fabs(double((*o)[(size_t(i) * kHq + h) * kD + d]) - ref);
            worst = std::max(worst, err);
            bad += !(err <= 2e-3 + 2e-3 * std::fabs(ref));
          }
        }
      }
      EXPECT_EQ(bad, 0) << bad << " of " << o->size() << " outputs off; worst |error| " << worst;
    }
  };

  static bench::ServerProcess* server_;
  static Client* client_;
};
bench::ServerProcess* ClientServerTest::server_ = nullptr;
Client* ClientServerTest::client_ = nullptr;

TEST_F(ClientServerTest, SyncInferFp16AndBf16) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    inference::ModelInferResponse resp;
    grpc::Status s = client_->Infer(Attention(dt, 24), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    auto o = FindOutput(resp, "O");
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->dtype, dt);
    EXPECT_EQ(o->shape, (std::vector<int64_t>{24, 8, 64}));
    auto v = OutputAsFloats(resp, "O");
    ASSERT_TRUE(v.ok());
    for (float x : *v) ASSERT_TRUE(std::isfinite(x) && std::fabs(x) <= 1.0f + 1e-2f);  // a convex mix of V (|V| <= 1)
  }
}

TEST_F(ClientServerTest, BadRequestIsInvalidArgument) {
  inference::ModelInferRequest req = Attention(DType::kF16, 8);
  req.mutable_inputs(0)->set_shape(2, 48);  // head_dim no longer matches the bytes
  inference::ModelInferResponse resp;
  EXPECT_EQ(client_->Infer(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ClientServerTest, AsyncCallsComplete) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, ok = 0;
  auto req = std::make_shared<const inference::ModelInferRequest>(Attention(DType::kF16, 16));
  const int n = 16;
  for (int i = 0; i < n; ++i)
    client_->AsyncInfer(req, [&](const grpc::Status& s, inference::ModelInferResponse& r) {
      std::lock_guard<std::mutex> l(mu);
      ++done;
      ok += s.ok() && r.outputs_size() == 1;
      cv.notify_all();
    });
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done == n; }));
  EXPECT_EQ(ok, n);
}

// All steps are sent before the first answer is read (pipelined on one stream); the
// answers come back in order, each checked against the reference.
TEST_F(ClientServerTest, KvSessionOverAStream) {
  KvSession seq(0x5eed0001, 101);
  auto stream = client_->OpenStream(client_->EndpointForSequence(seq.id));
  const int tokens[] = {12, 1, 3, 1};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(stream->Send(seq.Step(tokens[i], i == 0, i == 3)));
  stream->CloseSend();
  inference::ModelStreamInferResponse r;
  size_t n = 0;
  while (stream->Recv(&r)) {
    EXPECT_TRUE(r.error_message().empty()) << r.error_message();
    auto o = FindOutput(r.infer_response(), "O");
    ASSERT_TRUE(o.ok()) << o.status();
    ASSERT_LT(n, 4u);
    EXPECT_EQ(o->shape, (std::vector<int64_t>{tokens[n], kHq, kD}));
    seq.ExpectOutput(r.infer_response(), n);
    ++n;
  }
  EXPECT_EQ(n, 4u);
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ClientServerTest, KvSessionUnaryFollowsItsEndpoint) {
  KvSession seq(0x5eed0002, 102);
  inference::ModelInferResponse resp;
  const int e = client_->EndpointForSequence(seq.id);
  ASSERT_TRUE(client_->Infer(seq.Step(8, true, false), &resp).ok());
  seq.ExpectOutput(resp, 0);
  for (int i = 0; i < 4; ++i) {
    inference::ModelInferRequest req = seq.Step(1, false, i == 3);
    EXPECT_EQ(client_->PickEndpoint(req), e);
    grpc::Status s = client_->Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    seq.ExpectOutput(resp, size_t(i) + 1);
  }
}

TEST_F(ClientServerTest, StatisticsCountRequests) {
  inference::ModelStatisticsResponse before, after;
  ASSERT_TRUE(client_->ModelStatistics(0, "attention", &before).ok());
  inference::ModelInferResponse resp;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Infer(Attention(DType::kF16, 8), &resp).ok());
  ASSERT_TRUE(client_->ModelStatistics(0, "attention", &after).ok());
  ASSERT_EQ(after.model_stats_size(), 1);
  const auto &b = before.model_stats(0).inference_stats(), &a = after.model_stats(0).inference_stats();
  EXPECT_EQ(a.success().count() - b.success().count(), 3u);
  EXPECT_GE(a.compute_infer().count() - b.compute_infer().count(), 1u);
  EXPECT_GT(a.compute_infer().ns(), b.compute_infer().ns());
  // compute_input and compute_output are the copies in and out (here the CPU backend's
  // conversions of Q, K, V to float and of O back), counted beside compute_infer.
  EXPECT_EQ(a.compute_input().count() - b.compute_input().count(), a.compute_infer().count() - b.compute_infer().count());
  EXPECT_GT(a.compute_input().ns(), b.compute_input().ns());
  EXPECT_GT(a.compute_output().ns(), b.compute_output().ns());
  bool ready = false;
  EXPECT_TRUE(client_->ModelReady(1, "kv_attention", &ready).ok());
  EXPECT_TRUE(ready);
}

// A server that requires a bearer token: the client's headers reach it on unary, async
// and streaming calls (here with deflate-compressed requests); without them every kind
// of call is refused with the server's reason, while the readiness probe stays open.
TEST(ClientTokenTest, HeadersReachEveryKindOfCall) {
  bench::SpawnOptions o;
  o.binary = FLASHQ_SERVER_BIN;
  o.backend = "cpu";
  o.log_path = ::testing::TempDir() + "/flashq_client_token_test.log";
  o.extra_args = {std::string("--demo-cache-dir=") + FLASHQ_DEMO_CACHE, "--auth-token=client-test-token"};
  auto server = bench::ServerProcess::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions with;
  with.endpoints = {(*server)->endpoint()};
  with.headers = {{"authorization", "Bearer client-test-token"}};
  with.compression = Compression::kDeflate;
  ClientOptions without = with;
  without.headers.clear();
  auto good = Client::Create(with), bad = Client::Create(without);
  ASSERT_TRUE(good.ok() && bad.ok());
  ASSERT_TRUE((*bad)->WaitUntilReady(absl::Seconds(30)).ok());  // ServerReady needs no token

  const inference::ModelInferRequest req = ClientServerTest::Attention(DType::kF16, 8);
  inference::ModelInferResponse resp;
  EXPECT_TRUE((*good)->Infer(req, &resp).ok());
  grpc::Status refused = (*bad)->Infer(req, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(refused.error_message().find("requires a token"), std::string::npos) << refused.error_message();

  for (Client* c : {good->get(), bad->get()}) {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    c->AsyncInfer(std::make_shared<const inference::ModelInferRequest>(req),
                  [&](const grpc::Status& s, inference::ModelInferResponse&) {
                    std::lock_guard<std::mutex> l(mu);
                    status = s;
                    done = true;
                    cv.notify_all();
                  });
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done; }));
    EXPECT_EQ(status.error_code(), c == good->get() ? grpc::StatusCode::OK : grpc::StatusCode::UNAUTHENTICATED);

    auto stream = c->OpenStream();
    stream->Send(req);
    stream->CloseSend();
    inference::ModelStreamInferResponse r;
    int answers = 0;
    while (stream->Recv(&r)) answers += r.error_message().empty();
    EXPECT_EQ(stream->Finish().error_code(), c == good->get() ? grpc::StatusCode::OK : grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(answers, c == good->get() ? 1 : 0);
  }
  EXPECT_EQ((*server)->Stop(), "exited with status 0");
}

}  // namespace
}  // namespace flashq::client
