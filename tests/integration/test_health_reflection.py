"""grpc.health.v1.Health (what Kubernetes' gRPC probes call) and server reflection
(what grpcurl and similar tools read)."""
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

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
