// Client routing without a server (channels connect lazily): sequence ids follow
// the hash ring, stateless requests go round-robin.
#include <map>

#include <gtest/gtest.h>

#include "client/lib/client.h"
#include "client/lib/tensor.h"

namespace flashq::client {
namespace {

TEST(ClientRouting, SequencesStickStatelessRotates) {
  auto c = Client::Create({.endpoints = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}});
  ASSERT_TRUE(c.ok()) << c.status();
  Client& client = **c;
  inference::ModelInferRequest stateless;
  std::map<int, int> rr;
  for (int i = 0; i < 300; ++i) rr[client.PickEndpoint(stateless)]++;
  ASSERT_EQ(rr.size(), 3u);
  for (auto& [e, n] : rr) EXPECT_EQ(n, 100);

  HashRing ring;
  for (const char* e : {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}) ring.Add(e);
  for (uint64_t id = 1; id < 2000; id += 3) {
    inference::ModelInferRequest req;
    SetSequence(req, id, id % 2 == 0, false);
    const int e = client.PickEndpoint(req);
    EXPECT_EQ(e, client.PickEndpoint(req));
    EXPECT_EQ(e, client.EndpointForSequence(id));
    EXPECT_EQ(client.endpoint(e), ring.LookupName(id));
  }
}

TEST(ClientRouting, BadOptions) {
  EXPECT_FALSE(Client::Create({}).ok());
  EXPECT_FALSE(Client::Create({.endpoints = {""}}).ok());
  EXPECT_FALSE(Client::Create({.endpoints = {"a:1"}, .channels_per_endpoint = 0}).ok());
}

TEST(ClientRouting, UnreachableServerFailsFast) {
  auto c = Client::Create({.endpoints = {"127.0.0.1:1"}});
  ASSERT_TRUE(c.ok());
  inference::ModelInferRequest req;
  req.set_model_name("attention");
  inference::ModelInferResponse resp;
  CallOptions o;
  o.timeout = absl::Seconds(5);
  grpc::Status s = (*c)->Infer(req, &resp, o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE((*c)->WaitUntilReady(absl::Milliseconds(300)).ok());
}

}  // namespace
}  // namespace flashq::client
