// flashq-health: asks a gRPC server grpc.health.v1.Health/Check and exits 0 when
// the answer is SERVING. Used by the Docker HEALTHCHECK, the bundle test and
// scripts; Kubernetes uses its native grpc probes against the same service.
//
//   flashq-health [--addr HOST:PORT] [--service NAME] [--timeout-ms N] [--wait-s N] [--quiet]
//
// --addr defaults to $FLASHQ_HEALTH_ADDR, else 127.0.0.1:$FLASHQ_GRPC_PORT, else
// 127.0.0.1:8001. --wait-s retries every 200 ms until SERVING or the time is up
// (for scripts that start a server and wait for it).
// Exit codes: 0 SERVING, 1 answered but not SERVING, 2 no answer (RPC error,
// deadline), 64 bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "health.grpc.pb.h"

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

struct Options {
  std::string addr;
  std::string service;
  int timeout_ms = 2000;
  double wait_s = 0;
  bool quiet = false;
};

void Usage() {
  std::fprintf(stderr,
               "usage: flashq-health [--addr HOST:PORT] [--service NAME] [--timeout-ms N] [--wait-s N] [--quiet]\n"
               "exit 0: SERVING; 1: answered, not SERVING; 2: no answer\n");
}

std::string DefaultAddr() {
  if (const char* a = std::getenv("FLASHQ_HEALTH_ADDR"); a && *a) return a;
  if (const char* p = std::getenv("FLASHQ_GRPC_PORT"); p && *p) return std::string("127.0.0.1:") + p;
  return "127.0.0.1:8001";
}

// Accepts --flag value and --flag=value.
bool Parse(int argc, char** argv, Options* o) {
  o->addr = DefaultAddr();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string val;
    bool has_val = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_val = true;
    }
    auto next = [&](std::string* out) {
      if (has_val) { *out = val; return true; }
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--addr") {
      if (!next(&o->addr)) return false;
    } else if (arg == "--service") {
      if (!next(&o->service)) return false;
    } else if (arg == "--timeout-ms") {
      if (!next(&v)) return false;
      o->timeout_ms = std::atoi(v.c_str());
      if (o->timeout_ms <= 0) return false;
    } else if (arg == "--wait-s") {
      if (!next(&v)) return false;
      o->wait_s = std::atof(v.c_str());
    } else if (arg == "--quiet" || arg == "-q") {
      o->quiet = true;
    } else if (arg == "--help" || arg == "-h") {
      return false;
    } else {
      std::fprintf(stderr, "flashq-health: unknown argument %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

const char* StatusName(HealthCheckResponse::ServingStatus s) {
  switch (s) {
    case HealthCheckResponse::UNKNOWN: return "UNKNOWN";
    case HealthCheckResponse::SERVING: return "SERVING";
    case HealthCheckResponse::NOT_SERVING: return "NOT_SERVING";
    case HealthCheckResponse::SERVICE_UNKNOWN: return "SERVICE_UNKNOWN";
    default: return "?";
  }
}

// One Check call. Returns the exit code and fills `msg`.
int CheckOnce(Health::Stub& stub, const Options& o, std::string* msg) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms));
  HealthCheckRequest req;
  req.set_service(o.service);
  HealthCheckResponse resp;
  grpc::Status st = stub.Check(&ctx, req, &resp);
  if (!st.ok()) {
    *msg = "no answer from " + o.addr + ": " + std::to_string(static_cast<int>(st.error_code())) + " " +
           st.error_message();
    return 2;
  }
  *msg = o.addr + (o.service.empty() ? "" : " service " + o.service) + ": " + StatusName(resp.status());
  return resp.status() == HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    Usage();
    return 64;
  }
  auto channel = grpc::CreateChannel(o.addr, grpc::InsecureChannelCredentials());
  auto stub = Health::NewStub(channel);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.wait_s * 1000));
  std::string msg;
  int rc;
  for (;;) {
    rc = CheckOnce(*stub, o, &msg);
    if (rc == 0 || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!o.quiet || rc != 0) std::fprintf(rc == 0 ? stdout : stderr, "flashq-health: %s\n", msg.c_str());
  return rc;
}
