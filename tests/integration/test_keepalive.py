"""gRPC keepalive and connection age, with Triton's flag names: the values given on the command
line are the channel arguments gRPC core receives (the server logs them as recorded from the
builder), and a maximum connection age makes real clients reconnect (GOAWAY) while every call
still succeeds, which is what lets replicas added behind a load balancer receive traffic."""
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from helpers import triton_inputs, wait_for

ARGS_LINE = "gRPC channel arguments: "


def channel_args(server):
    """{name: value} from the server's log line of recorded channel arguments."""
    line = wait_for(lambda: next((l for l in server.log(400).splitlines() if ARGS_LINE in l), None),
                    what="the channel-arguments log line")
    return dict(kv.split("=", 1) for kv in line.split(ARGS_LINE, 1)[1].split())


def test_defaults_are_tritons(server):
    args = channel_args(server)
    want = {"grpc.keepalive_time_ms": "7200000", "grpc.keepalive_timeout_ms": "20000",
            "grpc.keepalive_permit_without_calls": "0", "grpc.http2.max_pings_without_data": "2",
            "grpc.http2.min_ping_interval_without_data_ms": "300000", "grpc.http2.max_ping_strikes": "2"}
    assert {k: args.get(k) for k in want} == want, args
    assert "grpc.max_connection_age_ms" not in args, args


def test_flags_reach_the_channel_arguments(start_server):
    s = start_server("--grpc-keepalive-time=15000", "--grpc-keepalive-timeout-ms=5000",
                     "--grpc-keepalive-permit-without-calls=1", "--grpc-http2-max-pings-without-data=0",
                     "--grpc-max-connection-age-ms=600000", "--grpc-max-connection-age-grace=30000",
                     name="keepalive-flags")
    args = channel_args(s)
    want = {"grpc.keepalive_time_ms": "15000", "grpc.keepalive_timeout_ms": "5000",
            "grpc.keepalive_permit_without_calls": "1", "grpc.http2.max_pings_without_data": "0",
            "grpc.max_connection_age_ms": "600000", "grpc.max_connection_age_grace_ms": "30000"}
    assert {k: args.get(k) for k in want} == want, args


def readiness_count(url, seconds, calls):
    """Opens a channel, runs `calls(channel)` in a loop for `seconds`, and returns how many times
    the channel became READY (1: one connection throughout) and how many calls failed."""
    ch = grpc.insecure_channel(url)
    states = []
    ch.subscribe(states.append, try_to_connect=True)
    grpc.channel_ready_future(ch).result(timeout=30)
    failures = 0
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        try:
            calls(ch)
        except grpc.RpcError as e:
            failures += 1
            print("call failed:", e.code(), e.details())
        n += 1
        time.sleep(0.05)
    ch.close()
    ready = sum(1 for a, b in zip(states, states[1:]) if b == grpc.ChannelConnectivity.READY and a != b)
    ready += states[:1] == [grpc.ChannelConnectivity.READY]
    return ready, failures, n


def live(ch):
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    assert service_pb2_grpc.GRPCInferenceServiceStub(ch).ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live


def test_max_connection_age_makes_clients_reconnect_without_failures(start_server, server):
    aged = start_server("--grpc-max-connection-age=700", "--grpc-max-connection-age-grace=5000", name="keepalive-age")
    ready, failures, n = readiness_count(aged.url, 3.5, live)
    print(f"max age 700 ms: {ready} connections over 3.5 s, {n} calls, {failures} failed")
    assert failures == 0
    assert ready >= 3, f"the channel connected {ready} times in 3.5 s with a 700 ms maximum age (expected >= 3)"
    # The control: without an age the same client keeps one connection.
    ready, failures, n = readiness_count(server.url, 3.5, live)
    assert failures == 0 and ready == 1, (ready, failures)


def test_tritonclient_inference_survives_goaway(start_server):
    """tritonclient sends requests while the server closes its connection every ~0.5 s: none fails."""
    aged = start_server("--grpc-max-connection-age=500", name="keepalive-tritonclient")
    c = grpcclient.InferenceServerClient(aged.url)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 32, 128)).astype(np.float16)
    kv = rng.standard_normal((4, 8, 128)).astype(np.float16)
    ins = triton_inputs(grpcclient, (("Q", q), ("K", kv), ("V", kv)))
    first = c.infer("attention", ins).as_numpy("O")
    deadline = time.monotonic() + 3
    n = 0
    while time.monotonic() < deadline:
        o = c.infer("attention", ins).as_numpy("O")
        assert np.array_equal(o, first)   # batch invariance: the same bits every time
        n += 1
    c.close()
    assert n >= 5, n
