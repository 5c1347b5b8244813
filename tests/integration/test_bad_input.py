"""Bad input and overload: each case gets its gRPC status code and a message that
names the tensor, or the limit and the expected value. After each, a health check
passes and a good request still succeeds."""
import re
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers import attention_inputs, infer_request, metric, raw_bytes, scrape, stub, wait_for

C = grpc.StatusCode


def call(url, req, timeout=60, max_message_bytes=256 << 20):
    ch, s = stub(url, max_message_bytes)
    try:
        return s.ModelInfer(req, timeout=timeout)
    finally:
        ch.close()


def expect_error(url, req, code, *must_name, timeout=60):
    """Sends req, asserts the status code and that the message contains every string
    in must_name (a plain string, or a compiled regex). Returns the message."""
    with pytest.raises(grpc.RpcError) as e:
        call(url, req, timeout=timeout)
    got, msg = e.value.code(), e.value.details() or ""
    assert got == code, f"status {got.name} ({msg!r}), expected {code.name}"
    for name in must_name:
        if isinstance(name, re.Pattern):
            assert name.search(msg), f"message {msg!r} does not match {name.pattern!r}"
        else:
            assert name in msg, f"message {msg!r} does not name {name!r}"
    return msg


def word(w):
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])")


def good_attention(seed=0, n=4):
    _, inputs = attention_inputs(np.random.default_rng(seed), [n], cu=False)
    return infer_request("attention", inputs, {"causal": True})


def assert_still_serving(url):
    ch = grpc.insecure_channel(url)
    try:
        st = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert st.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        ch.close()
    resp = call(url, good_attention())
    assert [o.name for o in resp.outputs][:1] == ["O"]


def qkv(n=4, hq=32, hkv=8, d=128, dtype="FP16", hkv_v=None, dq=None):
    rng = np.random.default_rng(5)
    hkv_v = hkv if hkv_v is None else hkv_v
    dq = d if dq is None else dq
    return [("Q", dtype, [n, hq, dq], raw_bytes(rng.standard_normal((n, hq, dq)), dtype)),
            ("K", dtype, [n, hkv, d], raw_bytes(rng.standard_normal((n, hkv, d)), dtype)),
            ("V", dtype, [n, hkv_v, d], raw_bytes(rng.standard_normal((n, hkv_v, d)), dtype))]


def with_cu(inputs, cu_q, cu_k):
    return inputs + [("CU_SEQLENS_Q", "INT32", [len(cu_q)], np.array(cu_q, np.int32).tobytes()),
                     ("CU_SEQLENS_K", "INT32", [len(cu_k)], np.array(cu_k, np.int32).tobytes())]


def replace(inputs, name, **kw):
    out = []
    for n, dt, shape, raw in inputs:
        if n == name:
            dt, shape, raw = kw.get("dt", dt), kw.get("shape", shape), kw.get("raw", raw)
        out.append((n, dt, shape, raw))
    return out


# ---- INVALID_ARGUMENT and NOT_FOUND on the default server -----------------------------------

def _cases():
    base = qkv(8)
    x = np.random.default_rng(1).standard_normal((2, 4096))
    return {
        # wrong shape
        "Q rank 2": (infer_request("attention", replace(base, "Q", shape=[8, 4096])),
                     C.INVALID_ARGUMENT, [word("Q")]),
        "kv_attention Q head dim 64": (infer_request("kv_attention", qkv(4, dq=64), {"sequence_id": 31, "sequence_start": True}),
                                       C.INVALID_ARGUMENT, [word("Q"), "128"]),
        "kv_attention 16 query heads": (infer_request("kv_attention", qkv(4, hq=16), {"sequence_id": 32, "sequence_start": True}),
                                        C.INVALID_ARGUMENT, [word("Q"), "32"]),
        "K and V differ": (infer_request("attention", qkv(8, hkv_v=4)), C.INVALID_ARGUMENT, [word("V")]),
        "linear X wrong K": (infer_request("up_proj_bf16", [("X", "BF16", [2, 4000], raw_bytes(np.zeros((2, 4000)), "BF16"))]),
                             C.INVALID_ARGUMENT, [word("X"), "4096"]),
        # wrong dtype
        "Q INT32": (infer_request("attention", replace(base, "Q", dt="INT32")), C.INVALID_ARGUMENT, [word("Q"), "INT32"]),
        "Q FP16 K BF16": (infer_request("attention", replace(base, "K", dt="BF16")), C.INVALID_ARGUMENT, [word("K")]),
        "X INT8": (infer_request("up_proj_bf16", [("X", "INT8", [2, 4096], bytes(2 * 4096))]),
                   C.INVALID_ARGUMENT, [word("X"), "INT8"]),
        "CU_SEQLENS FP32": (infer_request("attention", base + [("CU_SEQLENS_Q", "FP32", [2], np.array([0, 8], np.float32).tobytes()),
                                                               ("CU_SEQLENS_K", "INT32", [2], np.array([0, 8], np.int32).tobytes())]),
                            C.INVALID_ARGUMENT, [word("CU_SEQLENS_Q"), "INT32"]),
        # raw size mismatch: [8,32,128] FP16 is 65536 bytes
        "Q raw bytes short": (infer_request("attention", replace(base, "Q", raw=base[0][3][:-2])),
                              C.INVALID_ARGUMENT, [word("Q"), "65536"]),
        "Q raw bytes long": (infer_request("attention", replace(base, "Q", raw=base[0][3] + b"\0\0")),
                             C.INVALID_ARGUMENT, [word("Q"), "65536"]),
        "X raw bytes short": (infer_request("up_proj_bf16", [("X", "BF16", [2, 4096], raw_bytes(x, "BF16")[:100])]),
                              C.INVALID_ARGUMENT, [word("X"), "16384"]),
        # cu_seqlens
        "CU_SEQLENS_Q not monotonic": (infer_request("attention", with_cu(base, [0, 5, 3, 8], [0, 2, 4, 8])),
                                       C.INVALID_ARGUMENT, [word("CU_SEQLENS_Q")]),
        "CU_SEQLENS_K not monotonic": (infer_request("attention", with_cu(base, [0, 2, 4, 8], [0, 6, 4, 8])),
                                       C.INVALID_ARGUMENT, [word("CU_SEQLENS_K")]),
        "CU_SEQLENS_Q does not end at total_q": (infer_request("attention", with_cu(base, [0, 5, 7], [0, 4, 8])),
                                                 C.INVALID_ARGUMENT, [word("CU_SEQLENS_Q"), "8"]),
        "CU_SEQLENS_Q does not start at 0": (infer_request("attention", with_cu(base, [1, 5, 8], [0, 4, 8])),
                                             C.INVALID_ARGUMENT, [word("CU_SEQLENS_Q")]),
        "CU_SEQLENS lengths differ": (infer_request("attention", with_cu(base, [0, 8], [0, 4, 8])),
                                      C.INVALID_ARGUMENT, [re.compile("CU_SEQLENS")]),
        # heads
        "Hq not a multiple of Hkv": (infer_request("attention", qkv(8, hq=32, hkv=5)), C.INVALID_ARGUMENT,
                                     [re.compile("head", re.I), "32", "5"]),
        "Hkv > Hq": (infer_request("attention", qkv(8, hq=4, hkv=8)), C.INVALID_ARGUMENT, [re.compile("head", re.I)]),
        # missing / unknown tensors, bad parameters
        "V missing": (infer_request("attention", base[:2]), C.INVALID_ARGUMENT, [word("V")]),
        "unknown input": (infer_request("attention", base + [("ZZZ", "FP16", [1], b"\0\0")]), C.INVALID_ARGUMENT, [word("ZZZ")]),
        "unknown output": (infer_request("attention", base, outputs=["NOPE"]), C.INVALID_ARGUMENT, [word("NOPE")]),
        "causal not bool": (infer_request("attention", base, {"causal": "maybe"}), C.INVALID_ARGUMENT, [word("causal")]),
        # NOT_FOUND
        "unknown model": (infer_request("no_such_model", base), C.NOT_FOUND, [word("no_such_model")]),
    }


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_rejected_with_code_and_message(server, case):
    req, code, names = CASES[case]
    msg = expect_error(server.url, req, code, *names)
    print(f"{case}: {code.name}: {msg}")
    assert_still_serving(server.url)


def test_unknown_model_metadata_not_found(server):
    ch, s = stub(server.url)
    from tritonclient.grpc import service_pb2
    for rpc, req in ((s.ModelMetadata, service_pb2.ModelMetadataRequest(name="no_such_model")),
                     (s.ModelConfig, service_pb2.ModelConfigRequest(name="no_such_model"))):
        with pytest.raises(grpc.RpcError) as e:
            rpc(req, timeout=10)
        assert e.value.code() == C.NOT_FOUND and "no_such_model" in e.value.details()
    ch.close()


def test_rejections_are_counted(server):
    samples, _ = scrape(server.metrics_url)
    assert metric(samples, "flashq_requests_total", code="INVALID_ARGUMENT") >= 1
    assert metric(samples, "flashq_requests_total", model="attention", code="OK") >= 1


# ---- kv_attention sequences ------------------------------------------------------------------

def kv_req(seq_id, start=False, end=False, n=1, dtype="FP16"):
    params = {"sequence_id": seq_id, "sequence_start": start, "sequence_end": end}
    return infer_request("kv_attention", qkv(n, dtype=dtype), params)


def test_sequence_never_started(server):
    expect_error(server.url, kv_req(987654), C.FAILED_PRECONDITION, "987654")
    expect_error(server.url, kv_req("never-seen"), C.FAILED_PRECONDITION, "never-seen")
    assert_still_serving(server.url)


def test_sequence_reused_after_end(server):
    call(server.url, kv_req(555001, start=True, n=3))
    call(server.url, kv_req(555001, end=True))
    expect_error(server.url, kv_req(555001), C.FAILED_PRECONDITION, "555001")
    # Starting it again is fine.
    call(server.url, kv_req(555001, start=True, end=True))
    assert_still_serving(server.url)


def test_duplicate_sequence_start(server):
    call(server.url, kv_req(666001, start=True, n=2))
    expect_error(server.url, kv_req(666001, start=True, n=2), C.ALREADY_EXISTS, "666001")
    # The first session is intact and can go on and end.
    call(server.url, kv_req(666001))
    call(server.url, kv_req(666001, end=True))
    assert_still_serving(server.url)


def test_sequence_request_without_sequence_id(server):
    msg = None
    with pytest.raises(grpc.RpcError) as e:
        call(server.url, infer_request("kv_attention", qkv(2)))
    assert e.value.code() in (C.INVALID_ARGUMENT, C.FAILED_PRECONDITION), e.value
    assert "sequence_id" in e.value.details(), e.value.details()
    assert_still_serving(server.url)


# ---- RESOURCE_EXHAUSTED -------------------------------------------------------------------------

def test_message_over_size_limit(start_server):
    s = start_server("--grpc-max-message-bytes=1048576", name="small-msg")
    _, inputs = attention_inputs(np.random.default_rng(2), [160], cu=False)   # Q alone is 1.25 MiB
    expect_error(s.url, infer_request("attention", inputs), C.RESOURCE_EXHAUSTED, "1048576")
    assert_still_serving(s.url)


def test_queue_full(start_server):
    s = start_server("--max-queue-size=1", "--max-queue-delay-us=1000000", name="queue-1")
    ch, st = stub(s.url)
    futures = [st.ModelInfer.future(good_attention(seed=i), timeout=60) for i in range(16)]
    codes, msgs = [], []
    for f in futures:
        try:
            f.result()
            codes.append(C.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            msgs.append(e.details())
    ch.close()
    assert C.RESOURCE_EXHAUSTED in codes, codes
    assert C.OK in codes, codes
    assert set(codes) <= {C.OK, C.RESOURCE_EXHAUSTED}, codes
    msg = msgs[0]
    assert re.search("queue", msg, re.I) and word("1").search(msg), f"message {msg!r} should name the queue limit 1"
    assert_still_serving(s.url)


def test_kv_cache_full(start_server):
    s = start_server("--kv-cache-blocks=4", name="kv-4")   # 4 blocks of 16 tokens
    call(s.url, kv_req(1, start=True, n=48))                # 3 blocks
    msg = expect_error(s.url, kv_req(2, start=True, n=32), C.RESOURCE_EXHAUSTED, re.compile("KV", re.I))
    assert "4" in msg, f"message {msg!r} should name the cache size (4 blocks)"
    samples, _ = scrape(s.metrics_url)
    assert metric(samples, "flashq_kv_cache_blocks_in_use") == 3
    assert metric(samples, "flashq_kv_cache_blocks_total") == 4
    call(s.url, kv_req(1, end=True))                        # 49 tokens: the 4th block, then freed
    call(s.url, kv_req(2, start=True, end=True, n=32))      # fits now
    samples, _ = scrape(s.metrics_url)
    assert metric(samples, "flashq_kv_cache_blocks_in_use") == 0
    assert_still_serving(s.url)


# ---- DEADLINE_EXCEEDED and CANCELLED --------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_server(start_server):
    # One request alone waits the full queue delay for company: 1.5 s.
    return start_server("--max-queue-delay-us=1500000", name="slow-queue")


def _counts(s, code):
    samples, _ = scrape(s.metrics_url)
    return (metric(samples, "flashq_requests_total", model="attention", code=code),
            metric(samples, "flashq_request_duration_seconds_count", model="attention", stage="compute"))


def test_deadline_exceeded_dropped_before_compute(slow_server):
    s = slow_server
    n0, compute0 = _counts(s, "DEADLINE_EXCEEDED")
    with pytest.raises(grpc.RpcError) as e:
        call(s.url, good_attention(seed=3), timeout=0.3)
    assert e.value.code() == C.DEADLINE_EXCEEDED
    wait_for(lambda: _counts(s, "DEADLINE_EXCEEDED")[0] > n0, timeout=10,
             what='flashq_requests_total{code="DEADLINE_EXCEEDED"} to grow')
    time.sleep(2)  # past the queue delay: the expired request must not have been computed
    assert _counts(s, "DEADLINE_EXCEEDED")[1] == compute0, "the expired request reached compute"
    assert_still_serving(s.url)


def test_cancelled_dropped_before_compute(slow_server):
    s = slow_server
    n0, compute0 = _counts(s, "CANCELLED")
    ch, st = stub(s.url)
    f = st.ModelInfer.future(good_attention(seed=4), timeout=60)
    time.sleep(0.3)
    assert f.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        f.result()
    ch.close()
    wait_for(lambda: _counts(s, "CANCELLED")[0] > n0, timeout=10,
             what='flashq_requests_total{code="CANCELLED"} to grow')
    time.sleep(2)
    assert _counts(s, "CANCELLED")[1] == compute0, "the cancelled request reached compute"
    assert_still_serving(s.url)
