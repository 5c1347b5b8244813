// gRPC keepalive and connection age, with tritonserver's flag names, meanings and defaults
// (--grpc-keepalive-time, --grpc-max-connection-age, ...), and the channel arguments of the
// server they become. A pure function of the options, so that a test can read exactly what
// gRPC core is given.
//
// Why a maximum connection age matters behind a Kubernetes Service: gRPC keeps one HTTP/2
// connection per client and sends every call over it, so replicas added by the HPA get no
// traffic from clients that connected before them. With an age set, the server sends GOAWAY
// after about that long (gRPC adds +-10% jitter), lets calls in flight finish (within the
// grace period, if one is set), and the client reconnects through the Service, landing on any
// replica.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/server_builder.h>

#include "common/flags.h"

namespace flashq::server {

struct GrpcKeepaliveOptions {
  int64_t keepalive_time_ms = 7'200'000;   // server pings an idle transport after this long
  int64_t keepalive_timeout_ms = 20'000;   // and closes it if the ping is not acknowledged within this
  bool keepalive_permit_without_calls = false;
  int64_t http2_max_pings_without_data = 2;                       // 0: no limit
  int64_t http2_min_recv_ping_interval_without_data_ms = 300'000;  // closer client pings are strikes
  int64_t http2_max_ping_strikes = 2;                             // then GOAWAY; 0: any number
  int64_t max_connection_age_ms = 0;        // 0: unset, connections live until a side closes them
  int64_t max_connection_age_grace_ms = 0;  // 0: unset, calls in flight may take as long as they need
};

// Adds the flags in Triton's names; the millisecond ones also answer to a "-ms" spelling
// (--grpc-keepalive-time-ms, --grpc-keepalive-timeout-ms, --grpc-max-connection-age-ms, ...).
void AddGrpcKeepaliveFlags(FlagSet& flags, GrpcKeepaliveOptions& options);

// The channel arguments (GRPC_ARG_* names) and their values, in a fixed order. The age
// arguments appear only when set.
std::vector<std::pair<std::string, int>> GrpcKeepaliveChannelArgs(const GrpcKeepaliveOptions& options);

// Adds GrpcKeepaliveChannelArgs to a builder.
void ApplyGrpcKeepalive(const GrpcKeepaliveOptions& options, grpc::ServerBuilder& builder);

// Call last, after every other channel argument: when the builder starts the server, `*out`
// receives the channel arguments gRPC core is given, as name and value text, in order. It must
// outlive BuildAndStart.
void RecordChannelArgs(grpc::ServerBuilder& builder, std::vector<std::pair<std::string, std::string>>* out);

// "name=value name=value ..." of the recorded arguments whose names are in `names` (all if empty).
std::string DescribeChannelArgs(const std::vector<std::pair<std::string, std::string>>& args,
                                const std::vector<std::string>& names = {});

}  // namespace flashq::server
