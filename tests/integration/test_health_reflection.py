"""grpc.health.v1.Health (what Kubernetes' gRPC probes call) and server reflection
(what grpcurl and similar tools read). Health is NOT_SERVING while the models load and
while the server drains after SIGTERM."""
import signal
import subprocess
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from conftest import READY_LINE, ServerProcess
from helpers import infer_request, raw_bytes

SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.url)
    yield ch
    ch.close()


@pytest.mark.parametrize("service", ["", SERVICE])
def test_health_check_serving(channel, service):
    resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_unknown_service_not_found(channel):
    with pytest.raises(grpc.RpcError) as e:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_serving(channel):
    it = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    first = next(it)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    it.cancel()


def _reflect(channel, **req):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(**req)]), timeout=10))
    assert len(responses) == 1
    return responses[0]


def test_reflection_lists_inference_service(channel):
    resp = _reflect(channel, list_services="")
    names = {s.name for s in resp.list_services_response.service}
    assert SERVICE in names, names
    assert "grpc.health.v1.Health" in names, names


def test_reflection_serves_descriptors(channel):
    from google.protobuf import descriptor_pb2
    resp = _reflect(channel, file_containing_symbol=SERVICE)
    assert not resp.HasField("error_response"), resp.error_response
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in resp.file_descriptor_response.file_descriptor_proto]
    methods = {m.name for f in files for s in f.service if f"{f.package}.{s.name}" == SERVICE for m in s.method}
    assert {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
            "ModelStreamInfer", "ModelConfig", "ModelStatistics"} <= methods, methods


# ---- NOT_SERVING: before the models are ready, and while draining after SIGTERM ---------

def _status(channel, service=""):
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                          timeout=2).status
    except grpc.RpcError as e:
        return e.code()  # UNAVAILABLE before the port opens or after it closes


def test_not_serving_while_models_load():
    """gRPC opens before the model repository is loaded (liveness answers at once); until
    every model is loaded and warmed up, health says NOT_SERVING, for the whole server and
    for the inference service, and ServerReady is false. Then SERVING."""
    s = ServerProcess(name="health-load")
    s._logf = open(s.log_path, "wb")
    s.proc = subprocess.Popen(s.cmd, stdout=s._logf, stderr=subprocess.STDOUT)
    # Reconnect within milliseconds of the port opening (gRPC's default backoff waits a
    # second after a refused connection): the models may load in well under a second.
    ch = grpc.insecure_channel(s.url, options=[("grpc.initial_reconnect_backoff_ms", 10),
                                               ("grpc.min_reconnect_backoff_ms", 10),
                                               ("grpc.max_reconnect_backoff_ms", 20)])
    seen = []   # (status of "", status of SERVICE, ServerReady) while loading
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert s.proc.poll() is None, f"server exited:\n{s.log()}"
            # The server turns ServerReady true, then health SERVING, then logs its ready line: sampled in the
            # reverse order, a NOT_SERVING answer means the samples before it were taken before those turns.
            line = READY_LINE in open(s.log_path, errors="replace").read()
            try:
                ready = service_pb2_grpc.GRPCInferenceServiceStub(ch).ServerReady(
                    service_pb2.ServerReadyRequest(), timeout=2).ready
            except grpc.RpcError:
                ready = None  # not connected yet
            svc = _status(ch, SERVICE)
            whole = _status(ch)
            if whole == health_pb2.HealthCheckResponse.SERVING:
                break
            if whole == health_pb2.HealthCheckResponse.NOT_SERVING and ready is not None:
                seen.append((whole, svc, ready, line))
            time.sleep(0.02)
        else:
            raise AssertionError(f"never SERVING:\n{s.log()}")
        assert seen, f"health never answered NOT_SERVING while the models loaded:\n{s.log()}"
        NOT = health_pb2.HealthCheckResponse.NOT_SERVING
        assert all(w == NOT and v == NOT and not r and not line for w, v, r, line in seen), seen
        assert _status(ch, SERVICE) == health_pb2.HealthCheckResponse.SERVING
        print(f"NOT_SERVING answered {len(seen)} times while the models loaded")
    finally:
        ch.close()
        s.assert_clean_stop(signal.SIGTERM)


def test_not_serving_while_draining_after_sigterm():
    """SIGTERM with slow requests in flight: health turns NOT_SERVING (Check and an open
    Watch) while the server drains, every in-flight request is still answered OK, and the
    server exits 0."""
    s = ServerProcess(["--workers-per-model=1", "--cpu-threads=1"], name="health-drain").start()
    # The probe has its own connection, as a kubelet's would: on the inference channel its
    # calls would queue behind megabytes of request data.
    ch = grpc.insecure_channel(s.url)
    infer_ch = grpc.insecure_channel(s.url, options=[("grpc.max_receive_message_length", 64 << 20)])
    NOT = health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=120)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        # INT4 up_proj with 96 rows takes most of a second on one CPU thread: six of them
        # keep the one worker busy for seconds.
        rng = np.random.default_rng(21)
        reqs = [infer_request("up_proj_int4", [("X", "FP16", [96, 4096], raw_bytes(rng.standard_normal((96, 4096)), "FP16"))])
                for _ in range(6)]
        stub = service_pb2_grpc.GRPCInferenceServiceStub(infer_ch)
        futures = [stub.ModelInfer.future(r, timeout=120) for r in reqs]
        time.sleep(0.1)  # the first is computing, the others are queued behind it (one worker)
        s.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        while _status(ch) != NOT:  # the first check after the signal may still see SERVING
            assert time.monotonic() - t0 < 10, "health never turned NOT_SERVING after SIGTERM"
            time.sleep(0.01)
        pending_when_not_serving = sum(not f.done() for f in futures)
        t_not = time.monotonic() - t0
        assert _status(ch, SERVICE) in (NOT, grpc.StatusCode.UNAVAILABLE)
        assert next(watch).status == NOT
        for f in futures:
            resp = f.result(timeout=120)
            assert resp.outputs[0].name == "Y"
        assert pending_when_not_serving >= 1, "nothing was in flight when health said NOT_SERVING"
        print(f"NOT_SERVING {t_not:.3f}s after SIGTERM with {pending_when_not_serving} of {len(futures)} requests "
              f"in flight; all answered {time.monotonic() - t0:.2f}s after SIGTERM")
    finally:
        ch.close()
        infer_ch.close()
        s.assert_clean_stop(signal.SIGTERM)
