#include "server/frontend/grpc_keepalive.h"

#include <algorithm>
#include <climits>
#include <memory>

#include <grpc/grpc.h>

namespace flashq::server {

void AddGrpcKeepaliveFlags(FlagSet& f, GrpcKeepaliveOptions& o) {
  f.Add("grpc-keepalive-time", &o.keepalive_time_ms,
        "Milliseconds after which the server sends a keepalive ping on an idle transport (as in Triton).", 1,
        INT_MAX);
  f.Alias("grpc-keepalive-time-ms", "grpc-keepalive-time");
  f.Add("grpc-keepalive-timeout", &o.keepalive_timeout_ms,
        "Milliseconds the server waits for a keepalive ping's acknowledgement before it closes the connection.", 1,
        INT_MAX);
  f.Alias("grpc-keepalive-timeout-ms", "grpc-keepalive-timeout");
  f.Add("grpc-keepalive-permit-without-calls", &o.keepalive_permit_without_calls,
        "Send keepalive pings even when no call is in flight (true/1 or false/0).");
  f.Add("grpc-http2-max-pings-without-data", &o.http2_max_pings_without_data,
        "Most pings the server sends while it has no data or header frame to send; 0: no limit.", 0, INT_MAX);
  f.Add("grpc-http2-min-recv-ping-interval-without-data", &o.http2_min_recv_ping_interval_without_data_ms,
        "While no data is sent: client pings closer together than this many milliseconds are bad pings (strikes).",
        0, INT_MAX);
  f.Add("grpc-http2-max-ping-strikes", &o.http2_max_ping_strikes,
        "Bad pings tolerated before the server sends GOAWAY and closes the transport; 0: any number.", 0, INT_MAX);
  f.Add("grpc-max-connection-age", &o.max_connection_age_ms,
        "Milliseconds a connection may live before the server sends GOAWAY (+-10% jitter) and the client "
        "reconnects, e.g. to another replica behind a load balancer. 0: unset (no limit).",
        0, INT_MAX);
  f.Alias("grpc-max-connection-age-ms", "grpc-max-connection-age");
  f.Add("grpc-max-connection-age-grace", &o.max_connection_age_grace_ms,
        "Milliseconds calls in flight may still run after GOAWAY for age; then the connection is closed. "
        "0: unset (no limit).",
        0, INT_MAX);
  f.Alias("grpc-max-connection-age-grace-ms", "grpc-max-connection-age-grace");
}

std::vector<std::pair<std::string, int>> GrpcKeepaliveChannelArgs(const GrpcKeepaliveOptions& o) {
  // The flags' ranges keep every value within int.
  std::vector<std::pair<std::string, int>> args = {
      {GRPC_ARG_KEEPALIVE_TIME_MS, int(o.keepalive_time_ms)},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, int(o.keepalive_timeout_ms)},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, o.keepalive_permit_without_calls ? 1 : 0},
      {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, int(o.http2_max_pings_without_data)},
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, int(o.http2_min_recv_ping_interval_without_data_ms)},
      {GRPC_ARG_HTTP2_MAX_PING_STRIKES, int(o.http2_max_ping_strikes)},
  };
  if (o.max_connection_age_ms > 0) args.emplace_back(GRPC_ARG_MAX_CONNECTION_AGE_MS, int(o.max_connection_age_ms));
  if (o.max_connection_age_grace_ms > 0) {
    args.emplace_back(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, int(o.max_connection_age_grace_ms));
  }
  return args;
}

void ApplyGrpcKeepalive(const GrpcKeepaliveOptions& options, grpc::ServerBuilder& builder) {
  for (const auto& [name, value] : GrpcKeepaliveChannelArgs(options)) builder.AddChannelArgument(name, value);
}

namespace {

class ChannelArgsRecorder final : public grpc::ServerBuilderOption {
 public:
  explicit ChannelArgsRecorder(std::vector<std::pair<std::string, std::string>>* out) : out_(out) {}
  void UpdateArguments(grpc::ChannelArguments* args) override {
    out_->clear();
    const grpc_channel_args c = args->c_channel_args();
    for (size_t i = 0; i < c.num_args; ++i) {
      const grpc_arg& a = c.args[i];
      std::string value = a.type == GRPC_ARG_INTEGER  ? std::to_string(a.value.integer)
                          : a.type == GRPC_ARG_STRING ? std::string(a.value.string)
                                                      : std::string("(pointer)");
      out_->emplace_back(a.key, std::move(value));
    }
  }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*) override {}

 private:
  std::vector<std::pair<std::string, std::string>>* out_;
};

}  // namespace

void RecordChannelArgs(grpc::ServerBuilder& builder, std::vector<std::pair<std::string, std::string>>* out) {
  builder.SetOption(std::make_unique<ChannelArgsRecorder>(out));
}

std::string DescribeChannelArgs(const std::vector<std::pair<std::string, std::string>>& args,
                                const std::vector<std::string>& names) {
  std::string out;
  for (const auto& [name, value] : args) {
    if (!names.empty() && std::find(names.begin(), names.end(), name) == names.end()) continue;
    out += (out.empty() ? "" : " ") + name + "=" + value;
  }
  return out;
}

}  // namespace flashq::server
