// gRPC keepalive and connection age: Triton's flag names and defaults, the "-ms" spellings,
// and the channel arguments that gRPC core actually receives when a real server is built.
#include "server/frontend/grpc_keepalive.h"
#include "server/frontend/grpc_service.h"

#include <map>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

namespace flashq::server {
namespace {

bool Parse(FlagSet& set, std::vector<std::string> args, std::string* error) {
  args.insert(args.begin(), "flashq-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  bool help = false;
  return set.Parse(int(args.size()), argv.data(), &help, error);
}

// Builds and starts a real server on a free loopback port with the options applied, and
// returns the channel arguments gRPC core was given (the last value of each name).
std::map<std::string, std::string> ServerChannelArgs(const GrpcKeepaliveOptions& o) {
  GrpcInferenceService service("test");  // gRPC starts no server without a service to poll
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyGrpcKeepalive(o, builder);
  std::vector<std::pair<std::string, std::string>> recorded;
  RecordChannelArgs(builder, &recorded);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_TRUE(server != nullptr && port > 0);
  if (server) server->Shutdown();
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : recorded) out[k] = v;
  return out;
}

TEST(GrpcKeepaliveTest, DefaultsAreTritons) {
  GrpcKeepaliveOptions o;
  FlagSet set("usage");
  AddGrpcKeepaliveFlags(set, o);
  std::string error;
  ASSERT_TRUE(Parse(set, {}, &error)) << error;
  auto args = ServerChannelArgs(o);
  EXPECT_EQ(args["grpc.keepalive_time_ms"], "7200000");
  EXPECT_EQ(args["grpc.keepalive_timeout_ms"], "20000");
  EXPECT_EQ(args["grpc.keepalive_permit_without_calls"], "0");
  EXPECT_EQ(args["grpc.http2.max_pings_without_data"], "2");
  EXPECT_EQ(args["grpc.http2.min_ping_interval_without_data_ms"], "300000");
  EXPECT_EQ(args["grpc.http2.max_ping_strikes"], "2");
  // Unset, as in Triton: connections have no maximum age.
  EXPECT_EQ(args.count("grpc.max_connection_age_ms"), 0u);
  EXPECT_EQ(args.count("grpc.max_connection_age_grace_ms"), 0u);
}

TEST(GrpcKeepaliveTest, FlagsReachTheChannelArguments) {
  GrpcKeepaliveOptions o;
  FlagSet set("usage");
  AddGrpcKeepaliveFlags(set, o);
  std::string error;
  ASSERT_TRUE(Parse(set,
                    {"--grpc-keepalive-time=10000", "--grpc-keepalive-timeout", "3000",
                     "--grpc-keepalive-permit-without-calls=1", "--grpc-http2-max-pings-without-data=0",
                     "--grpc-http2-min-recv-ping-interval-without-data=5000", "--grpc-http2-max-ping-strikes=7",
                     "--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=15000"},
                    &error))
      << error;
  auto args = ServerChannelArgs(o);
  EXPECT_EQ(args["grpc.keepalive_time_ms"], "10000");
  EXPECT_EQ(args["grpc.keepalive_timeout_ms"], "3000");
  EXPECT_EQ(args["grpc.keepalive_permit_without_calls"], "1");
  EXPECT_EQ(args["grpc.http2.max_pings_without_data"], "0");
  EXPECT_EQ(args["grpc.http2.min_ping_interval_without_data_ms"], "5000");
  EXPECT_EQ(args["grpc.http2.max_ping_strikes"], "7");
  EXPECT_EQ(args["grpc.max_connection_age_ms"], "60000");
  EXPECT_EQ(args["grpc.max_connection_age_grace_ms"], "15000");
}

TEST(GrpcKeepaliveTest, MillisecondSpellingsAreAliases) {
  GrpcKeepaliveOptions o;
  FlagSet set("usage");
  AddGrpcKeepaliveFlags(set, o);
  std::string error;
  ASSERT_TRUE(Parse(set,
                    {"--grpc-keepalive-time-ms=11000", "--grpc-keepalive-timeout-ms=4000",
                     "--grpc-max-connection-age-ms=30000"},
                    &error))
      << error;
  EXPECT_EQ(o.keepalive_time_ms, 11000);
  EXPECT_EQ(o.keepalive_timeout_ms, 4000);
  EXPECT_EQ(o.max_connection_age_ms, 30000);
  EXPECT_TRUE(set.WasSet("grpc-max-connection-age"));
  EXPECT_NE(set.Help().find("Also spelled --grpc-max-connection-age-ms"), std::string::npos) << set.Help();
}

TEST(GrpcKeepaliveTest, OutOfRangeValuesAreRefusedNamingTheFlag) {
  GrpcKeepaliveOptions o;
  FlagSet set("usage");
  AddGrpcKeepaliveFlags(set, o);
  std::string error;
  EXPECT_FALSE(Parse(set, {"--grpc-keepalive-time=0"}, &error));
  EXPECT_NE(error.find("--grpc-keepalive-time=0 is out of range"), std::string::npos) << error;
  EXPECT_FALSE(Parse(set, {"--grpc-max-connection-age-ms=-1"}, &error));
  EXPECT_NE(error.find("--grpc-max-connection-age=-1 is out of range"), std::string::npos) << error;
  EXPECT_FALSE(Parse(set, {"--grpc-keepalive-permit-without-calls=maybe"}, &error));
  EXPECT_NE(error.find("expects true or false"), std::string::npos) << error;
}

TEST(GrpcKeepaliveTest, DescribeListsTheRecordedArguments) {
  std::vector<std::pair<std::string, std::string>> args = {{"grpc.keepalive_time_ms", "7200000"},
                                                           {"grpc.max_connection_age_ms", "60000"}};
  EXPECT_EQ(DescribeChannelArgs(args), "grpc.keepalive_time_ms=7200000 grpc.max_connection_age_ms=60000");
  EXPECT_EQ(DescribeChannelArgs(args, {"grpc.max_connection_age_ms"}), "grpc.max_connection_age_ms=60000");
}

}  // namespace
}  // namespace flashq::server
