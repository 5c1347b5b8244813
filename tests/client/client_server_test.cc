// The client library against a real flashq-server (CPU backend, demo models):
// sync, async and streaming calls, FP16/BF16 tensors, kv_attention sessions over
// a stream, round-robin and sequence routing over two endpoint names of one
// server, ModelStatistics. Label: integration (starts a server, ~10 s).
#include <cmath>
#include <condition_variable>
#include <mutex>

#include <gtest/gtest.h>

#include "client/bench/spawn.h"
#include "client/lib/client.h"
#include "client/lib/tensor.h"

namespace flashq::client {
namespace {

class ClientServerTest : public ::testing::Test {
 protected:
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

  static inference::ModelInferRequest KvStep(uint64_t id, int tokens, bool start, bool end) {
    inference::ModelInferRequest req;
    req.set_model_name("kv_attention");
    const int64_t qs[] = {tokens, 32, 128}, ks[] = {tokens, 8, 128};
    EXPECT_TRUE(AddFloatInput(req, "Q", DType::kF16, qs, std::vector<float>(size_t(tokens) * 32 * 128, 0.5f)).ok());
    EXPECT_TRUE(AddFloatInput(req, "K", DType::kF16, ks, std::vector<float>(size_t(tokens) * 8 * 128, 0.25f)).ok());
    EXPECT_TRUE(AddFloatInput(req, "V", DType::kF16, ks, std::vector<float>(size_t(tokens) * 8 * 128, 1.0f)).ok());
    SetSequence(req, id, start, end);
    return req;
  }

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

TEST_F(ClientServerTest, KvSessionOverAStream) {
  const uint64_t id = 0x5eed0001;
  auto stream = client_->OpenStream(client_->EndpointForSequence(id));
  ASSERT_TRUE(stream->Send(KvStep(id, 12, true, false)));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(stream->Send(KvStep(id, 1, false, i == 2)));
  stream->CloseSend();
  inference::ModelStreamInferResponse r;
  int n = 0;
  while (stream->Recv(&r)) {
    EXPECT_TRUE(r.error_message().empty()) << r.error_message();
    auto o = FindOutput(r.infer_response(), "O");
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->shape[0], n == 0 ? 12 : 1);
    ++n;
  }
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ClientServerTest, KvSessionUnaryFollowsItsEndpoint) {
  const uint64_t id = 0x5eed0002;
  inference::ModelInferResponse resp;
  const int e = client_->EndpointForSequence(id);
  ASSERT_TRUE(client_->Infer(KvStep(id, 8, true, false), &resp).ok());
  for (int i = 0; i < 4; ++i) {
    inference::ModelInferRequest req = KvStep(id, 1, false, i == 3);
    EXPECT_EQ(client_->PickEndpoint(req), e);
    grpc::Status s = client_->Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
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
  bool ready = false;
  EXPECT_TRUE(client_->ModelReady(1, "kv_attention", &ready).ok());
  EXPECT_TRUE(ready);
}

}  // namespace
}  // namespace flashq::client
