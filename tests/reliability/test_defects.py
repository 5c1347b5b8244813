"""Regression tests of defects an adversarial run found, each against a real flashq-server
process (CPU backend) and each answered now with the right status while the server keeps
serving (docs/reliability.md, "Adversarial findings"):
  - empty tensors with dimensions of 2^31 and 2^32 - 1 (a SIGFPE once), unary and stream;
  - a response over the message limit: refused before compute, that request alone;
  - configs and weights that aborted the start or crashed the first request;
  - client strings of up to a megabyte (sequence ids, model names);
  - a kv sequence at its token limit, ended with zero new tokens;
  - requests whose client gave up during compute, and refused tokens, in flashq_requests_total;
  - an empty --auth-token, and model versions that do not exist;
  - bytes that are not a ModelInferRequest (the server parses ModelInfer itself), unary and stream."""
import json
import re
import struct
import subprocess
import time

import grpc
import numpy as np
import pytest

import rel
from rel import C, Server
from test_faults import stream_call


def empty_attention(q_shape, kv_shape):
    return rel.request("attention", [("Q", "FP16", q_shape, b""), ("K", "FP16", kv_shape, b""),
                                     ("V", "FP16", kv_shape, b"")])


def call(st, req, timeout=30):
    try:
        st.ModelInfer(req, timeout=timeout)
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details()


WIDE_K, WIDE_N = 64, 4096  # Y is 64 times X: a request under the message limit whose answer is over it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = rel.small_repository(tmp_path_factory.mktemp("defects") / "repo")
    (repo / "wide").mkdir()
    (repo / "wide/config.pbtxt").write_text(
        f'name: "wide"\nmax_batch_size: 0\ninput [ {{ name: "X" data_type: TYPE_FP16 dims: [ -1, {WIDE_K} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP16 dims: [ -1, {WIDE_N} ] }} ]\n'
        + rel._param("kind", "linear") + rel._param("weight_format", "bf16") + rel._param("max_batch_tokens", 4096))
    w = (np.random.default_rng(8).standard_normal((WIDE_N, WIDE_K)).astype(np.float32) * 0.05)
    rel._safetensors(repo / "wide/model.safetensors", "weight", "BF16", (WIDE_N, WIDE_K),
                     (w.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    with Server("--grpc-max-message-bytes=1048576", f"--model-repository={repo}", name="defects") as srv:
        yield srv


def wide_req(rng, m):
    return rel.request("wide", [("X", "FP16", [m, WIDE_K], rel.f16(rng, m, WIDE_K))])


def test_extreme_dimensions_of_empty_tensors(server):
    ch = rel.channel(server.url)
    st = rel.stub(ch)
    crash = empty_attention([0, 2 ** 31, 64], [0, 2 ** 32 - 1, 64])
    assert len(crash.SerializeToString()) < 100
    code, msg = call(st, crash)
    assert code == "INVALID_ARGUMENT" and "2147483648" in msg, (code, msg)
    edges = [0, 1, 2, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63 - 1]
    reqs = [empty_attention([a, b, c], [a, b, c]) for a in edges for b in edges[::2] for c in edges[::3]]
    for r in reqs[:40]:
        assert call(st, r)[0] == "INVALID_ARGUMENT"
    got = stream_call(st, [crash] + reqs[40:80] + [rel.lin_req(np.random.default_rng(1))])
    assert [g[0] for g in got[:-1]] == ["INVALID_ARGUMENT"] * (len(got) - 1), got
    assert got[-1][0] == "OK"
    assert server.proc.poll() is None, server.log()
    ch.close()


def test_bytes_that_are_not_a_request(server):
    """ModelInfer and ModelStreamInfer parse their own bytes (server/frontend/infer_codec.h): a truncated
    or malformed message is INVALID_ARGUMENT, saying where, and the server and the stream go on."""
    ch = rel.channel(server.url)
    method = "/inference.GRPCInferenceService/ModelInfer"
    unary = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
    good = rel.lin_req(np.random.default_rng(3)).SerializeToString()
    cases = [good[:len(good) // 2],                       # truncated inside the tensor bytes
             b"\x3a\xff\xff\xff\xff\x0f",                  # raw_input_contents longer than the message
             b"\x0b\x08\x01",                              # a group that never ends
             b"\x0a\x02\xff\xfe"]                          # model_name that is not UTF-8
    for bad in cases:
        with pytest.raises(grpc.RpcError) as e:
            unary(bad, timeout=30)
        assert e.value.code() == C.INVALID_ARGUMENT and "not a valid ModelInferRequest" in e.value.details(), \
            (bad[:16], e.value.code(), e.value.details())
    assert rel.service_pb2.ModelInferResponse.FromString(unary(good, timeout=30)).outputs[0].name == "Y"
    stream = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None,
                              response_deserializer=rel.service_pb2.ModelStreamInferResponse.FromString)
    got = list(stream(iter([cases[0], good, cases[1], good]), timeout=60))
    errors = [r.error_message for r in got if r.error_message]
    assert len(got) == 4 and len(errors) == 2, [r.error_message for r in got]
    assert all(m.startswith("INVALID_ARGUMENT: the request is not a valid ModelInferRequest") for m in errors), errors
    assert server.proc.poll() is None, server.log()
    ch.close()


def test_response_over_the_message_limit_is_refused_before_compute(server):
    ch = rel.channel(server.url, max_message_bytes=64 << 20)
    st = rel.stub(ch)
    rng = np.random.default_rng(2)
    before = rel.requests_by_code(server.metrics(), "wide")
    batches = rel.metric_sum(server.metrics(), "flashq_batch_requests_count", model="wide")
    big_out = wide_req(rng, 200)  # X 25 KB, Y 1.6 MB: over the 1 MiB limit only on the way out
    code, msg = call(st, big_out)
    assert code == "RESOURCE_EXHAUSTED" and "--grpc-max-message-bytes" in msg and "1638400 bytes" in msg, (code, msg)
    rel.wait_for(lambda: rel.requests_by_code(server.metrics(), "wide")["RESOURCE_EXHAUSTED"]
                 == before["RESOURCE_EXHAUSTED"] + 1, what="counted as RESOURCE_EXHAUSTED")
    assert rel.metric_sum(server.metrics(), "flashq_batch_requests_count", model="wide") == batches, \
        "refused only after a batch computed it"
    assert rel.requests_by_code(server.metrics(), "wide")["OK"] == before["OK"]
    assert call(st, wide_req(rng, 100))[0] == "OK", "an answer of 800 KB fits"
    # On a stream it answers that request alone; the ones after it are answered too.
    got = stream_call(st, [wide_req(rng, 4), big_out, wide_req(rng, 4), rel.attention_req(rng, tokens=32)])
    assert [g[0] for g in got] == ["OK", "RESOURCE_EXHAUSTED", "OK", "OK"], got
    ch.close()


def test_megabyte_client_strings(server):
    ch = rel.channel(server.url, max_message_bytes=64 << 20)
    st = rel.stub(ch)
    rng = np.random.default_rng(3)
    rss0 = server.rss_mb()
    for i in range(30):
        r = rel.kv_req(rng, 1, n=1, start=True)
        r.parameters["sequence_id"].string_param = f"{i}-" + "x" * (1 << 19)
        code, msg = call(st, r)
        assert code == "INVALID_ARGUMENT" and "the limit is 256" in msg and len(msg) < 300, (code, msg[:300])
    assert server.rss_mb() < rss0 + 64, "refused ids were kept"
    r = rel.kv_req(rng, 1, n=1, start=True)
    r.parameters["sequence_id"].string_param = "y" * 1000000
    assert call(st, r)[0] == "INVALID_ARGUMENT"
    r = rel.lin_req(rng)
    r.model_name = "m" * 1000000
    code, msg = call(st, r)
    assert code == "NOT_FOUND" and len(msg) < 1000 and "1000000 bytes" in msg, (code, msg[:300])
    # A string id "77" and the number 77 are different sequences.
    def string_id(r, sid):
        r.parameters["sequence_id"].string_param = sid
        return r
    assert call(st, rel.kv_req(rng, 77, n=2, start=True))[0] == "OK"
    assert call(st, string_id(rel.kv_req(rng, 1, n=2, start=True), "77"))[0] == "OK"
    assert call(st, rel.kv_req(rng, 77, n=0, end=True))[0] == "OK"
    assert call(st, string_id(rel.kv_req(rng, 1, n=0, end=True), "77"))[0] == "OK"
    ch.close()


def test_zero_token_end_releases_a_sequence_at_its_limit(tmp_path):
    repo = rel.small_repository(tmp_path / "repo")
    _kv_param("max_tokens_per_sequence", 32)(repo)
    rng = np.random.default_rng(4)
    with Server(f"--model-repository={repo}", name="kvlimit") as srv:
        st = rel.stub(rel.channel(srv.url))
        assert call(st, rel.kv_req(rng, 5, n=32, start=True))[0] == "OK"
        code, msg = call(st, rel.kv_req(rng, 5, n=1, end=True))
        assert code == "INVALID_ARGUMENT" and "max_tokens_per_sequence=32" in msg, (code, msg)
        assert call(st, rel.kv_req(rng, 5, n=0, end=True))[0] == "OK"
        rel.wait_for(lambda: rel.metric_sum(srv.metrics(), "flashq_kv_cache_blocks_in_use", model="kv_attention") == 0,
                     what="the blocks freed")
        assert call(st, rel.kv_req(rng, 5, n=1, start=True, end=True))[0] == "OK", "the id starts again"


def test_give_up_during_compute_and_refused_tokens_are_counted(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    rng = np.random.default_rng(5)
    with Server(f"--auth-token-file={token}", name="counting") as srv:
        st = rel.stub(rel.channel(srv.url))
        md = (("authorization", "Bearer t0k3n"),)
        # 4096 causal tokens take seconds on the CPU backend: the 0.3 s deadline fires mid-compute.
        req = rel.attention_req(rng, tokens=4096, hq=8, hkv=8)
        with pytest.raises(grpc.RpcError) as e:
            st.ModelInfer(req, timeout=0.3, metadata=md)
        assert e.value.code() == C.DEADLINE_EXCEEDED
        rel.wait_for(lambda: rel.metric_sum(srv.metrics(), "flashq_inflight_requests", model="attention") == 0,
                     timeout=120, what="the request to finish computing")
        codes = rel.requests_by_code(srv.metrics(), "attention")
        assert codes.get("OK", 0) == 0 and codes["DEADLINE_EXCEEDED"] == 1, codes
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as e:
                st.ModelInfer(rel.lin_req(rng), timeout=10)
            assert e.value.code() == C.UNAUTHENTICATED
        rel.wait_for(lambda: rel.requests_by_code(srv.metrics(), "lin")["UNAUTHENTICATED"] == 3,
                     what="UNAUTHENTICATED counted")


def test_model_versions_that_do_not_exist(server):
    ch = rel.channel(server.url)
    st = rel.stub(ch)
    r = rel.lin_req(np.random.default_rng(6))
    r.model_version = "7"
    code, msg = call(st, r)
    assert code == "NOT_FOUND" and "'7'" in msg and "version 1" in msg, (code, msg)
    r.model_version = "1"
    assert call(st, r)[0] == "OK"
    from tritonclient.grpc import service_pb2
    assert not st.ModelReady(service_pb2.ModelReadyRequest(name="lin", version="7")).ready
    assert st.ModelReady(service_pb2.ModelReadyRequest(name="lin", version="1")).ready
    with pytest.raises(grpc.RpcError) as e:
        st.ModelMetadata(service_pb2.ModelMetadataRequest(name="lin", version="7"))
    assert e.value.code() == C.NOT_FOUND
    ch.close()


def test_empty_auth_token_is_refused():
    p = subprocess.run([rel.SERVER_BIN, "--auth-token=", "--grpc-port=0", "--metrics-port=0", "--http-port=0", "--backend=cpu",
                        f"--model-repository={rel.shared_repository()}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--auth-token is empty" in p.stderr, (p.returncode, p.stderr)


# ---- start-up: each bad config or weight file is refused with a message, never an abort ----

def _write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _gptq(folder, g_idx_entry):
    k, n, g = 64, 16, 32
    rng = np.random.default_rng(7)
    g_idx = (np.arange(k) * 7 % k // g).astype(np.int32)
    g_idx[3] = g_idx_entry
    _write_safetensors(folder / "model.safetensors", {
        "qweight": ("I32", (k // 8, n), rng.integers(0, 2 ** 31, (k // 8, n), dtype=np.int32).tobytes()),
        "qzeros": ("I32", (k // g, n // 8), np.full((k // g, n // 8), 0x77777777, np.int32).tobytes()),
        "scales": ("F16", (k // g, n), np.full((k // g, n), 0.01, np.float16).tobytes()),
        "g_idx": ("I32", (k,), g_idx.tobytes())})
    (folder / "config.pbtxt").write_text(
        'name: "lin"\nmax_batch_size: 0\ninput [ { name: "X" data_type: TYPE_FP16 dims: [ -1, 64 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP16 dims: [ -1, 16 ] } ]\n'
        + rel._param("kind", "linear") + rel._param("weight_format", "gptq") + rel._param("group_size", 32))


def _edit(folder, old, new):
    cfg = folder / "config.pbtxt"
    text = cfg.read_text()
    assert old in text, old
    cfg.write_text(text.replace(old, new))


def _kv_param(key, value):
    def change(repo):
        cfg = repo / "kv_attention/config.pbtxt"
        cfg.write_text(re.sub(f'(key: "{key}" value: {{ string_value: ")[^"]*"', rf'\g<1>{value}"', cfg.read_text()))
    return change


STARTUP_CASES = {
    "kv num_blocks 1e8 (host memory)": (_kv_param("num_blocks", 100000000), [], ["host memory", "num_blocks"]),
    "kv page_size 1e9": (_kv_param("page_size", 1000000000), [], ["page_size is 1000000000", "1..65536"]),
    "kv num_blocks 2^32 + 1": (_kv_param("num_blocks", 4294967297), [], ["num_blocks is 4294967297"]),
    "--kv-cache-blocks=1e8": (None, ["--kv-cache-blocks=100000000"], ["--kv-cache-blocks", "host memory"]),
    "--kv-cache-blocks=2^32": (None, ["--kv-cache-blocks=4294967296"], ["--kv-cache-blocks", "out of range"]),
    "--workers-per-model=1e6": (None, ["--workers-per-model=1000000"], ["--workers-per-model", "-1..256"]),
    "g_idx INT_MAX": (lambda repo: _gptq(repo / "lin", 2 ** 31 - 1), [], ["g_idx entry 2147483647"]),
    "g_idx 2.5e8": (lambda repo: _gptq(repo / "lin", 250000000), [], ["g_idx entry 250000000"]),
    "attention with optional Q": (lambda repo: _edit(repo / "attention", 'name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ]',
                                                     'name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] optional: true'),
                                  [], ["'Q' is marked optional"]),
    "attention inputs A, K, V": (lambda repo: _edit(repo / "attention", 'name: "Q"', 'name: "A"'), [],
                                 ["no input 'A'"]),
    "linear input Z": (lambda repo: _edit(repo / "lin", 'name: "X"', 'name: "Z"'), [], ["no input 'Z'"]),
}


@pytest.mark.parametrize("case", list(STARTUP_CASES))
def test_bad_configs_are_refused_at_start(tmp_path, case):
    change, flags, words = STARTUP_CASES[case]
    repo = rel.small_repository(tmp_path / "repo")
    if change:
        change(repo)
    t0 = time.monotonic()
    p = subprocess.run([rel.SERVER_BIN, "--grpc-port=0", "--metrics-port=0", "--http-port=0", "--backend=cpu", "--host=127.0.0.1",
                        f"--model-repository={repo}", *flags], capture_output=True, text=True, timeout=120)
    assert p.returncode in (1, 2), f"{case}: exit {p.returncode} (a signal is negative)\n{p.stderr[-2000:]}"
    for w in words:
        assert w in p.stderr, f"{case}: the message does not name {w!r}:\n{p.stderr[-2000:]}"
    if not flags:
        assert "config.pbtxt" in p.stderr, p.stderr[-2000:]
    assert time.monotonic() - t0 < 30
