"""Triton's system shared-memory extension (docs/shared-memory.md) through the real
client helper, tritonclient.utils.shared_memory: inputs read from regions and outputs
written into them give the same bytes as the same request over plain gRPC, for
attention, kv_attention and a linear layer; perf_analyzer --shared-memory=system runs;
each bad input gets its status and the server keeps serving; a region unregistered
while a request uses it stays mapped until that request is done."""
import itertools
import json
import os
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from helpers import attention_inputs, infer_request, raw_bytes, stub
from test_bad_input import assert_still_serving, call
from test_perf_analyzer import b64, run_pa

C = grpc.StatusCode
_ids = itertools.count()


def key(tag):
    """A shared-memory object name of this test process."""
    return f"/flashq_it_{os.getpid()}_{tag}_{next(_ids)}"


class Region:
    """A client's POSIX shared-memory object (tritonclient's helper), registered on the
    server as `name` unless register=False; destroyed (unregistered and unlinked) at exit."""

    def __init__(self, client, name, byte_size, register=True, offset=0, register_size=None):
        self.client, self.name, self.byte_size, self.key = client, name, byte_size, key(name)
        self.handle = shm.create_shared_memory_region(name, self.key, byte_size)
        self.registered = register
        if register:
            client.register_system_shared_memory(name, self.key, register_size or byte_size - offset, offset=offset)

    def write(self, raw, offset=0):
        shm.set_shared_memory_region(self.handle, [np.frombuffer(raw, np.uint8)], offset=offset)

    def read(self, nbytes, offset=0):
        return shm.get_contents_as_numpy(self.handle, np.uint8, [nbytes], offset=offset).tobytes()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.registered:
                self.client.unregister_system_shared_memory(self.name)
        finally:
            shm.destroy_shared_memory_region(self.handle)


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.unregister_system_shared_memory()
    c.close()


def plain(url, model, inputs, params=None, outputs=None):
    """The same request over plain gRPC (raw_input_contents): {output: (datatype, shape, raw bytes)}."""
    resp = call(url, infer_request(model, inputs, params, outputs))
    return {o.name: (o.datatype, list(o.shape), resp.raw_output_contents[i]) for i, o in enumerate(resp.outputs)}


def via_shm(client, model, inputs, outputs, params=None, pad=100, **infer_kw):
    """Sends `inputs` [(name, datatype, shape, raw)] packed into one region (each at an
    offset that is not a multiple of the page) and asks for `outputs` {name: byte_size}
    in another region; returns {output: (datatype, shape, bytes read from the region)}
    and the result object."""
    in_size = sum(len(r) + pad for *_, r in inputs) + pad
    out_size = sum(n + pad for n in outputs.values()) + pad
    with Region(client, f"in_{next(_ids)}", in_size) as rin, Region(client, f"out_{next(_ids)}", out_size) as rout:
        tensors, off = [], pad
        for name, dt, shape, raw in inputs:
            rin.write(raw, off)
            t = grpcclient.InferInput(name, shape, dt)
            t.set_shared_memory(rin.name, len(raw), offset=off)
            tensors.append(t)
            off += len(raw) + pad
        requested, places, off = [], {}, pad
        for name, n in outputs.items():
            o = grpcclient.InferRequestedOutput(name)
            o.set_shared_memory(rout.name, n, offset=off)
            requested.append(o)
            places[name] = (off, n)
            off += n + pad
        res = client.infer(model, tensors, outputs=requested, parameters=params, **infer_kw)
        got = {}
        for name, (off, n) in places.items():
            o = res.get_output(name)
            assert o is not None, f"{name} not listed in the response"
            got[name] = (o.datatype, list(o.shape), rout.read(n, off))
        # Outputs in shared memory are not sent in the message.
        assert all(len(r) == 0 for r in res.get_response().raw_output_contents), "raw output beside shared memory"
        return got, res


def out_bytes(dtype, shape):
    return int(np.prod(shape)) * {"FP16": 2, "BF16": 2, "FP32": 4}[dtype]


# ---- bitwise equal to plain gRPC --------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
def test_attention_inputs_and_outputs_in_shared_memory(server, client, dtype):
    rng = np.random.default_rng(11)
    _, inputs = attention_inputs(rng, [7, 33, 2], [9, 40, 5], hq=8, hkv=2, d=64, dtype=dtype)
    params = {"causal": True}
    want = plain(server.url, "attention", inputs, params, outputs=["O", "LSE"])
    total_q = 42
    got, _ = via_shm(client, "attention", inputs, {"O": out_bytes(dtype, [total_q, 8, 64]),
                                                   "LSE": out_bytes("FP32", [8, total_q])}, params)
    assert got == want


def test_kv_attention_sequence_in_shared_memory(server, client):
    """The same prefill and decode steps in two sequences, one over plain gRPC and one
    through shared memory: each step's O is the same bytes."""
    rng = np.random.default_rng(12)
    steps = [19, 1, 1, 1]
    plain_id, shm_id = 7100 + os.getpid() % 1000, 8100 + os.getpid() % 1000
    for i, n in enumerate(steps):
        inputs = [(name, "FP16", [n, h, 128], raw_bytes(rng.standard_normal((n, h, 128)), "FP16"))
                  for name, h in (("Q", 32), ("K", 8), ("V", 8))]
        flags = {"sequence_start": i == 0, "sequence_end": i == len(steps) - 1}
        want = plain(server.url, "kv_attention", inputs, {"sequence_id": plain_id, **flags})
        got, _ = via_shm(client, "kv_attention", inputs, {"O": out_bytes("FP16", [n, 32, 128])},
                         sequence_id=shm_id, sequence_start=flags["sequence_start"],
                         sequence_end=flags["sequence_end"])
        assert got == want, f"step {i}"


def test_linear_layer_in_shared_memory(server, client):
    x = raw_bytes(np.random.default_rng(13).standard_normal((2, 4096)), "FP16")
    want = plain(server.url, "up_proj_int4", [("X", "FP16", [2, 4096], x)])
    got, _ = via_shm(client, "up_proj_int4", [("X", "FP16", [2, 4096], x)], {"Y": out_bytes("FP16", [2, 14336])})
    assert got == want


def test_mixed_message_and_shared_memory_tensors(server, client):
    """Q from a region, K and V in raw_input_contents (one entry per input not in shared
    memory, as Triton counts them); O in the message, LSE in a region."""
    rng = np.random.default_rng(14)
    _, inputs = attention_inputs(rng, [12], hq=4, hkv=4, d=64, cu=False)
    want = plain(server.url, "attention", inputs, outputs=["O", "LSE"])
    q = inputs[0][3]
    with Region(client, "mixed_in", len(q)) as rin, Region(client, "mixed_out", 4 * 4 * 12) as rout:
        rin.write(q)
        tq = grpcclient.InferInput("Q", [12, 4, 64], "FP16")
        tq.set_shared_memory("mixed_in", len(q))
        others = []
        for name, dt, shape, raw in inputs[1:]:
            t = grpcclient.InferInput(name, shape, dt)
            t.set_data_from_numpy(np.frombuffer(raw, np.float16).reshape(shape))
            others.append(t)
        lse = grpcclient.InferRequestedOutput("LSE")
        lse.set_shared_memory("mixed_out", 4 * 4 * 12)
        res = client.infer("attention", [others[0], tq, others[1]], outputs=[grpcclient.InferRequestedOutput("O"), lse])
        names = [o.name for o in res.get_response().outputs]
        raw = dict(zip(names, res.get_response().raw_output_contents))
        assert raw["O"] == want["O"][2]
        assert raw["LSE"] == b""
        assert rout.read(4 * 4 * 12) == want["LSE"][2]


def test_stream_in_shared_memory(server, client):
    """ModelStreamInfer: the same regions, the same bytes as plain gRPC."""
    rng = np.random.default_rng(20)
    _, inputs = attention_inputs(rng, [5, 11], hq=4, hkv=2, d=64, dtype="FP16")
    want = plain(server.url, "attention", inputs, outputs=["O"])["O"][2]
    answers = []
    with Region(client, "st_in", 5 * 8192) as rin, Region(client, "st_out", len(want)) as rout:
        tensors = []
        for i, (name, dt, shape, raw) in enumerate(inputs):
            rin.write(raw, i * 8192)
            t = grpcclient.InferInput(name, shape, dt)
            t.set_shared_memory("st_in", len(raw), offset=i * 8192)
            tensors.append(t)
        o = grpcclient.InferRequestedOutput("O")
        o.set_shared_memory("st_out", len(want))
        c = grpcclient.InferenceServerClient(server.url)
        c.start_stream(callback=lambda result, error: answers.append((result, error)))
        c.async_stream_infer("attention", tensors, outputs=[o])
        c.stop_stream()  # waits for the answer
        c.close()
        assert len(answers) == 1 and answers[0][1] is None, answers
        assert rout.read(len(want)) == want


def test_outputs_in_shared_memory_are_not_held_to_the_message_limit(server, start_server, client):
    """With a 1 MiB message limit, a request whose tensors (2 MiB each) all travel in
    regions runs; the same request is over the limit over plain gRPC."""
    small = start_server("--grpc-max-message-bytes=1048576", name="shm-1mib")
    rng = np.random.default_rng(21)
    _, inputs = attention_inputs(rng, [256], hq=32, hkv=8, d=128, cu=False)
    want = plain(server.url, "attention", inputs, outputs=["O"])["O"][2]
    assert len(want) == 2 << 20
    c = grpcclient.InferenceServerClient(small.url)
    try:
        got, _ = via_shm(c, "attention", inputs, {"O": len(want)})
        assert got["O"][2] == want
        o = grpcclient.InferRequestedOutput("O")
        tensors = []
        with Region(c, "lim_in", sum(len(r) for *_, r in inputs)) as rin:
            off = 0
            for name, dt, shape, raw in inputs:
                rin.write(raw, off)
                t = grpcclient.InferInput(name, shape, dt)
                t.set_shared_memory("lim_in", len(raw), offset=off)
                tensors.append(t)
                off += len(raw)
            # Inputs in shared memory but O in the message: refused before compute.
            expect_rpc_error(lambda: c.infer("attention", tensors, outputs=[o]), C.RESOURCE_EXHAUSTED,
                             "--grpc-max-message-bytes")
    finally:
        c.close()


def test_status_and_metadata(client):
    md = client.get_server_metadata(as_json=True)
    assert "system_shared_memory" in md["extensions"], md
    assert "cuda_shared_memory" not in md["extensions"], md
    with Region(client, "st_a", 4096, offset=100, register_size=1000) as a, Region(client, "st_b", 8192):
        st = client.get_system_shared_memory_status(as_json=True)
        regions = {r["name"]: r for r in st["regions"].values()}
        assert {"st_a", "st_b"} <= set(regions), st
        assert regions["st_a"]["key"] == a.key
        assert int(regions["st_a"]["offset"]) == 100 and int(regions["st_a"]["byte_size"]) == 1000
        one = client.get_system_shared_memory_status("st_b", as_json=True)
        assert list(one["regions"]) == ["st_b"], one
    # tritonclient's cleanup of both kinds succeeds; CUDA regions cannot be registered yet.
    client.unregister_cuda_shared_memory()
    assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_cuda_register_is_unimplemented(server):
    ch, st = stub(server.url)
    with pytest.raises(grpc.RpcError) as e:
        st.CudaSharedMemoryRegister(service_pb2.CudaSharedMemoryRegisterRequest(
            name="gpu", raw_handle=b"\0" * 64, device_id=0, byte_size=1024), timeout=10)
    assert e.value.code() == C.UNIMPLEMENTED and "CUDA" in e.value.details(), e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        st.CudaSharedMemoryStatus(service_pb2.CudaSharedMemoryStatusRequest(name="gpu"), timeout=10)
    assert e.value.code() == C.NOT_FOUND
    ch.close()


def test_protocol_matches_tritonclient(server):
    """The shared-memory RPCs and messages that server reflection serves have the names,
    types and field numbers of tritonclient's own descriptor."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    ch = grpc.insecure_channel(server.url)
    resp = next(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")]),
        timeout=10))
    ch.close()
    ours = {}
    for b in resp.file_descriptor_response.file_descriptor_proto:
        f = descriptor_pb2.FileDescriptorProto.FromString(b)
        if f.package == "inference":
            ours[f.name] = f
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)

    def messages(f):
        return {m.name: m for m in f.message_type}

    def methods(f):
        return {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for s in f.service if s.name == "GRPCInferenceService" for m in s.method}

    ours_msgs = {k: v for f in ours.values() for k, v in messages(f).items()}
    ours_methods = {k: v for f in ours.values() for k, v in methods(f).items()}
    names = [n for n in methods(theirs) if "SharedMemory" in n]
    assert len(names) == 6, names
    for n in names:
        assert ours_methods.get(n) == methods(theirs)[n], n
        for kind in ("Request", "Response"):
            m = n + kind
            assert ours_msgs[m] == messages(theirs)[m], f"{m}:\nours {ours_msgs[m]}\ntheirs {messages(theirs)[m]}"
    for m in ("ModelInferRequest", "ModelInferResponse", "InferParameter"):
        assert ours_msgs[m].field == messages(theirs)[m].field, m


# ---- perf_analyzer -------------------------------------------------------------------------------

def test_perf_analyzer_system_shared_memory(server, client, tmp_dir):
    """perf_analyzer puts every input and every output (O and LSE) in system shared memory:
    one region per tensor, registered through the RPCs; it unregisters both kinds (system
    and CUDA) when it starts and when it exits. The tensors come as --input-data, because
    random INT32 would not be valid CU_SEQLENS."""
    def successes():
        st = client.get_inference_statistics("attention", as_json=True)
        return int(st["model_stats"][0]["inference_stats"].get("success", {}).get("count", 0))

    rng = np.random.default_rng(15)
    q = rng.standard_normal((64, 8, 64)).astype(np.float16)
    kv = rng.standard_normal((64, 2, 64)).astype(np.float16)
    data = tmp_dir / "attention_shm.json"
    data.write_text(json.dumps({"data": [{
        "Q": {"content": b64(q), "shape": [64, 8, 64]},
        "K": {"content": b64(kv), "shape": [64, 2, 64]},
        "V": {"content": b64(kv), "shape": [64, 2, 64]},
        "CU_SEQLENS_Q": {"content": [0, 24, 64], "shape": [3]},
        "CU_SEQLENS_K": {"content": [0, 24, 64], "shape": [3]}}]}))
    before = successes()
    rows, text = run_pa(["-i", "grpc", "-u", server.url, "-m", "attention", "--input-data", str(data),
                         "--shared-memory=system", "--output-shared-memory-size", str(64 * 8 * 64 * 2),
                         "--concurrency-range", "1:2"], tmp_dir)
    assert len(rows) == 2 and all(float(r["Inferences/Second"]) > 0 for r in rows), rows
    assert successes() - before >= 2
    st = client.get_system_shared_memory_status(as_json=True)
    assert not st.get("regions"), f"perf_analyzer left regions registered: {st}"


# ---- bad input: each gets its status, and the server keeps serving -------------------------------

def set_shm(tensor, region, byte_size, offset=None):
    """Triton's shared-memory parameters on a protobuf input or requested output."""
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = byte_size
    if offset is not None:
        tensor.parameters["shared_memory_offset"].int64_param = offset


@pytest.fixture(scope="module")
def bad_regions(client):
    """'bad_in' (64 KiB) holds Q, K, V of a small attention request at offsets 0, 8 KiB,
    16 KiB; 'bad_out' is 100 bytes. Returns the request's inputs."""
    _, inputs = attention_inputs(np.random.default_rng(16), [8], hq=4, hkv=2, d=64, cu=False)
    with Region(client, "bad_in", 64 << 10) as rin, Region(client, "bad_out", 100):
        for i, (*_, raw) in enumerate(inputs):
            rin.write(raw, i * 8192)
        yield inputs


def shm_request(inputs, out=None, edit=None):
    """The request with Q, K, V in 'bad_in'; `out` = (region, byte_size, offset) for O;
    `edit(req)` then breaks it."""
    req = infer_request("attention", inputs, outputs=["O"])
    del req.raw_input_contents[:]
    for i, t in enumerate(req.inputs):
        set_shm(t, "bad_in", len(inputs[i][3]), i * 8192)
    if out:
        set_shm(req.outputs[0], *out)
    if edit:
        edit(req)
    return req


def _q(req):
    return req.inputs[0]


BAD = {  # name -> (edit, output placement, code, words the message must hold)
    "input region not registered": (lambda r: setattr(_q(r).parameters["shared_memory_region"], "string_param", "nope"),
                                    None, C.NOT_FOUND, ["'Q'", "'nope'", "not registered"]),
    "input range past the region's end": (lambda r: setattr(_q(r).parameters["shared_memory_offset"], "int64_param",
                                                            62000), None, C.INVALID_ARGUMENT, ["'Q'", "'bad_in'", "65536"]),
    "input byte size is not shape x datatype": (lambda r: setattr(_q(r).parameters["shared_memory_byte_size"],
                                                                  "int64_param", 100),
                                                None, C.INVALID_ARGUMENT, ["'Q'", "4096", "100"]),
    "typed contents beside a region": (lambda r: _q(r).contents.fp32_contents.extend([1.0]), None, C.INVALID_ARGUMENT,
                                       ["'Q'", "typed contents"]),
    "raw contents for an input in a region": (lambda r: r.raw_input_contents.append(b"\0" * 4096), None,
                                              C.INVALID_ARGUMENT, ["raw_input_contents", "shared memory"]),
    "region not a string": (lambda r: setattr(_q(r).parameters["shared_memory_region"], "int64_param", 3), None,
                            C.INVALID_ARGUMENT, ["'Q'", "shared_memory_region"]),
    "byte size without a region": (lambda r: r.inputs[1].parameters.pop("shared_memory_region"), None,
                                   C.INVALID_ARGUMENT, ["'K'", "shared_memory_byte_size"]),
    "negative offset": (lambda r: setattr(_q(r).parameters["shared_memory_offset"], "int64_param", -8), None,
                        C.INVALID_ARGUMENT, ["'Q'", "-8"]),
    "output region too small": (None, ("bad_out", 100, 0), C.INVALID_ARGUMENT, ["'O'", "'bad_out'", "4096", "100"]),
    "output size past the region's end": (None, ("bad_out", 4096, 0), C.INVALID_ARGUMENT, ["'O'", "'bad_out'"]),
    "output region not registered": (None, ("nope", 4096, 0), C.NOT_FOUND, ["'O'", "'nope'"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_shared_memory_tensor(server, bad_regions, case):
    edit, out, code, words = BAD[case]
    with pytest.raises(grpc.RpcError) as e:
        call(server.url, shm_request(bad_regions, out, edit))
    msg = e.value.details() or ""
    print(f"{case}: {e.value.code().name}: {msg}")
    assert e.value.code() == code, f"{e.value.code().name} ({msg!r}), expected {code.name}"
    for w in words:
        assert w in msg, f"message {msg!r} does not name {w!r}"
    assert_still_serving(server.url)


def test_good_request_from_the_bad_cases_regions(server, bad_regions):
    """The unbroken request of the cases above: O from a region equals O over plain gRPC."""
    resp = call(server.url, shm_request(bad_regions))
    want = plain(server.url, "attention", bad_regions, outputs=["O"])
    assert resp.raw_output_contents[0] == want["O"][2]


def test_output_too_small_is_refused_before_compute(server, client, bad_regions):
    def counts():
        st = client.get_inference_statistics("attention", as_json=True)["model_stats"][0]
        return int(st.get("execution_count", 0)), int(st["inference_stats"].get("fail", {}).get("count", 0))

    executions, fails = counts()
    with pytest.raises(grpc.RpcError):
        call(server.url, shm_request(bad_regions, ("bad_out", 100, 0)))
    assert counts() == (executions, fails + 1)


def expect_rpc_error(fn, code, *words):
    with pytest.raises(InferenceServerException) as e:
        fn()
    msg = e.value.message()
    assert e.value.status() == f"StatusCode.{code.name}", f"{e.value.status()} ({msg!r}), expected {code.name}"
    for w in words:
        assert w in msg, f"message {msg!r} does not name {w!r}"
    return msg


def test_register_errors(server, client):
    with Region(client, "reg", 4096) as r:
        # A duplicate name, even for the same object and range.
        expect_rpc_error(lambda: client.register_system_shared_memory("reg", r.key, 4096), C.ALREADY_EXISTS, "'reg'")
        # offset + byte_size past the object's end.
        expect_rpc_error(lambda: client.register_system_shared_memory("reg2", r.key, 4000, offset=100),
                         C.INVALID_ARGUMENT, "'reg2'", "4100", "4096 bytes")
        # A key that cannot be opened: no such object, or not an object name.
        expect_rpc_error(lambda: client.register_system_shared_memory("reg3", "/flashq_no_such_object", 16),
                         C.NOT_FOUND, "'/flashq_no_such_object'")
        expect_rpc_error(lambda: client.register_system_shared_memory("reg4", "/a/b", 16), C.INVALID_ARGUMENT, "'/a/b'")
        expect_rpc_error(lambda: client.register_system_shared_memory("reg5", r.key, 0), C.INVALID_ARGUMENT, "byte_size")
        expect_rpc_error(lambda: client.get_system_shared_memory_status("reg3"), C.NOT_FOUND, "'reg3'")
        client.unregister_system_shared_memory("never_registered")  # not an error, as in Triton
        st = client.get_system_shared_memory_status(as_json=True)
        assert "reg" in st["regions"] and not {"reg2", "reg3", "reg4", "reg5"} & set(st["regions"]), st
    assert_still_serving(server.url)


def test_region_limit_and_extension_off(start_server):
    one = start_server("--max-shared-memory-regions=1", name="shm-one")
    c = grpcclient.InferenceServerClient(one.url)
    with Region(c, "first", 4096):
        with Region(c, "second", 4096, register=False) as r:
            expect_rpc_error(lambda: c.register_system_shared_memory("second", r.key, 4096), C.RESOURCE_EXHAUSTED,
                             "'second'", "--max-shared-memory-regions")
    c.close()
    off = start_server("--max-shared-memory-regions=0", name="shm-off")
    c = grpcclient.InferenceServerClient(off.url)
    assert "system_shared_memory" not in c.get_server_metadata(as_json=True)["extensions"]
    with Region(c, "off", 4096, register=False) as r:
        expect_rpc_error(lambda: c.register_system_shared_memory("off", r.key, 4096), C.UNIMPLEMENTED)
    x = grpcclient.InferInput("X", [1, 4096], "FP16")
    x.set_shared_memory("off", 8192)
    expect_rpc_error(lambda: c.infer("up_proj_int4", [x]), C.UNIMPLEMENTED, "'X'", "'off'")
    c.close()
    assert_still_serving(off.url)


def test_truncated_object_is_refused(server, client):
    """A client that shrinks its object below a registered region gets FAILED_PRECONDITION
    instead of the server reading past the object's end."""
    _, inputs = attention_inputs(np.random.default_rng(17), [8], hq=4, hkv=2, d=64, cu=False)
    with Region(client, "trunc", 3 * 8192) as r:
        for i, (*_, raw) in enumerate(inputs):
            r.write(raw, i * 8192)
        req = infer_request("attention", inputs)
        del req.raw_input_contents[:]
        for i, t in enumerate(req.inputs):
            set_shm(t, "trunc", len(inputs[i][3]), i * 8192)
        call(server.url, req)
        fd = os.open(f"/dev/shm{r.key}", os.O_RDWR)
        try:
            os.ftruncate(fd, 8192)
        finally:
            os.close(fd)
        with pytest.raises(grpc.RpcError) as e:
            call(server.url, req)
        assert e.value.code() == C.FAILED_PRECONDITION and "'trunc'" in e.value.details(), e.value.details()
    assert_still_serving(server.url)


# ---- unregister while in use ---------------------------------------------------------------------

def mapped(pid, key):
    """The server's mappings of the object `key`."""
    with open(f"/proc/{pid}/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(f"/dev/shm{key}"))


def test_unregister_in_use_defers_the_unmap(start_server):
    """One worker on one thread: a slow request computes while a small one that reads and writes region
    'busy' waits in the queue, holding the region. Unregistering 'busy' answers OK at
    once and removes the name (a new request naming it gets NOT_FOUND, and the name can be
    registered again), but the mapping stays until the waiting request has run and
    written its output."""
    from helpers import metric, scrape, wait_for
    srv = start_server("--workers-per-model=1", "--cpu-threads=1", name="shm-busy")
    pid = srv.proc.pid
    c = grpcclient.InferenceServerClient(srv.url)
    _, slow = attention_inputs(np.random.default_rng(18), [1024], cu=False)
    _, small = attention_inputs(np.random.default_rng(19), [8], hq=4, hkv=2, d=64, cu=False)
    want = plain(srv.url, "attention", small, outputs=["O"])["O"][2]
    r = Region(c, "busy", 5 * 8192)
    try:
        for i, (*_, raw) in enumerate(small):
            r.write(raw, i * 8192)

        def gauges():
            samples, _ = scrape(srv.metrics_url)
            return (metric(samples, "flashq_inflight_requests", model="attention"),
                    metric(samples, "flashq_queue_depth", model="attention"))

        ch, st = stub(srv.url)
        slow_call = st.ModelInfer.future(infer_request("attention", slow), timeout=120)
        wait_for(lambda: gauges() == (1, 0), what="the slow request computing")
        done = threading.Event()
        outcome = {}

        def finished(result, error):  # tritonclient passes both by keyword
            outcome["error"] = error
            done.set()

        tensors = []
        for i, (name, dt, shape, raw) in enumerate(small):
            t = grpcclient.InferInput(name, shape, dt)
            t.set_shared_memory("busy", len(raw), offset=i * 8192)
            tensors.append(t)
        o = grpcclient.InferRequestedOutput("O")
        o.set_shared_memory("busy", len(want), offset=4 * 8192)
        c.async_infer("attention", tensors, finished, outputs=[o])
        wait_for(lambda: gauges() == (2, 1), what="the shared-memory request queued")
        assert mapped(pid, r.key) == 1

        t0 = time.monotonic()
        c.unregister_system_shared_memory("busy")
        assert time.monotonic() - t0 < 1.0, "unregister waited for the request"
        assert not done.is_set()
        expect_rpc_error(lambda: c.get_system_shared_memory_status("busy"), C.NOT_FOUND, "'busy'")
        expect_rpc_error(lambda: c.infer("attention", tensors), C.NOT_FOUND, "'busy'")
        assert mapped(pid, r.key) == 1, "unmapped under a request in flight"
        c.register_system_shared_memory("busy", r.key, 8192)  # the name is free again
        assert mapped(pid, r.key) == 2

        assert done.wait(120), "the shared-memory request never finished"
        assert outcome["error"] is None, outcome["error"]
        assert r.read(len(want), 4 * 8192) == want
        slow_call.result()
        ch.close()
        wait_for(lambda: mapped(pid, r.key) == 1, what="the old mapping released")
        c.unregister_system_shared_memory("busy")
        assert mapped(pid, r.key) == 0
    finally:
        shm.destroy_shared_memory_region(r.handle)
        c.close()
    assert_still_serving(srv.url)
