#!/usr/bin/env python3
"""flashq-health against a reference grpc.health.v1 server (grpcio-health-checking).

    health_tool_test.py PATH/TO/flashq-health

Checks the exit codes: 0 SERVING, 1 NOT_SERVING, 2 no server / unknown service, 64 bad
usage; --wait-s waits for a server that turns SERVING later; FLASHQ_GRPC_PORT picks the
port (what the Docker HEALTHCHECK relies on). This is the same wire protocol the
server's own health service and the Kubernetes gRPC probes speak.
"""
import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

tool = sys.argv[1]
server = grpc.server(futures.ThreadPoolExecutor(2))
servicer = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
addr = f"127.0.0.1:{port}"
S = health_pb2.HealthCheckResponse
fails = 0


def case(what, args, want_rc, env=None):
    global fails
    t = time.monotonic()
    rc = subprocess.run([tool] + args, capture_output=True, env=env).returncode
    good = rc == want_rc
    fails += not good
    print(f"  {'ok  ' if good else 'FAIL'} {what}: exit {rc} (want {want_rc}) in {time.monotonic() - t:.2f} s")


servicer.set("", S.SERVING)
servicer.set("inference.GRPCInferenceService", S.NOT_SERVING)
case("SERVING", ["--addr", addr], 0)
case("--addr= form, --quiet", [f"--addr={addr}", "--quiet"], 0)
case("NOT_SERVING service", ["--addr", addr, "--service", "inference.GRPCInferenceService"], 1)
case("unknown service (NOT_FOUND)", ["--addr", addr, "--service", "nope"], 2)
case("port from FLASHQ_GRPC_PORT", [], 0, env={**os.environ, "FLASHQ_GRPC_PORT": str(port), "FLASHQ_HEALTH_ADDR": ""})
case("bad usage", ["--bogus"], 64)
server.stop(None)
case("no server", ["--addr", addr, "--timeout-ms", "300"], 2)

# A server that starts NOT_SERVING and turns SERVING after 1 s.
server = grpc.server(futures.ThreadPoolExecutor(2))
servicer = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
servicer.set("", S.NOT_SERVING)
threading.Timer(1.0, lambda: servicer.set("", S.SERVING)).start()
case("--wait-s until SERVING", ["--addr", f"127.0.0.1:{port}", "--wait-s", "10"], 0)
server.stop(None)
print(f"health_tool_test: {8 - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
