// The real Transport (async ModelInfer through the client library) and the
// server-side statistics source (ModelStatistics summed over endpoints).
#pragma once

#include <string>

#include "client/bench/runner.h"
#include "client/lib/client.h"

namespace flashq::bench {

class GrpcTransport : public Transport {
 public:
  GrpcTransport(client::Client& client, double timeout_s) : client_(client), timeout_s_(timeout_s) {}
  void Send(const Work& work, std::function<void(int code)> done) override;

 private:
  client::Client& client_;
  double timeout_s_;
};

class GrpcServerStats : public ServerStatsSource {
 public:
  GrpcServerStats(client::Client& client, std::string model) : client_(client), model_(std::move(model)) {}
  ServerCounters Snapshot() override;

 private:
  client::Client& client_;
  std::string model_;
};

}  // namespace flashq::bench
