"""The HTTP/REST endpoint (KServe v2 with Triton's extensions) through curl: every REST path,
JSON and binary tensors (Inference-Header-Content-Length), each bad request with its HTTP
status and a JSON error while the server keeps serving, the bearer token, system shared
memory through tritonclient.http, and a server with cuBLASLt loaded (its 94 KB static TLS
block breaks libraries whose threads have small stacks)."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from conftest import TEST_TMP, ServerProcess
from helpers import round_to, triton_inputs

DEMO_MODELS = ["attention", "kv_attention", "up_proj_bf16", "down_proj_bf16", "up_proj_int4",
               "down_proj_int4", "up_proj_fp8", "down_proj_fp8"]
CUBLASLT = "/usr/local/cuda/lib64/libcublasLt.so.13"


def curl(server, method, path, body=None, headers=()):
    """(status, headers as a lower-cased dict, body bytes) of one request made by curl."""
    os.makedirs(TEST_TMP, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TEST_TMP) as d:
        out, head = pathlib.Path(d) / "body", pathlib.Path(d) / "head"
        cmd = ["curl", "-sS", "-X", method, "-o", str(out), "-D", str(head), "-w", "%{http_code}",
               f"http://{server.http_url}{path}"]
        for h in headers:
            cmd += ["-H", h]
        if body is not None:
            cmd += ["--data-binary", "@-", "-H", "Expect:"]
            if not any(h.lower().startswith("content-type") for h in headers):
                cmd += ["-H", "Content-Type: application/json"]
        p = subprocess.run(cmd, input=body if isinstance(body, bytes) else (body or "").encode(),
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        hdrs = {}
        for line in head.read_text(errors="replace").splitlines()[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        return int(p.stdout), hdrs, out.read_bytes() if out.exists() else b""


def get_json(server, path, status=200, method="GET", body=None, headers=()):
    code, _, out = curl(server, method, path, body, headers)
    assert code == status, (method, path, code, out[:500])
    return json.loads(out) if out else None


def small_attention(seed=3, n=3):
    rng = np.random.default_rng(seed)
    q = round_to(rng.standard_normal((n, 32, 128)), "FP16").astype(np.float16)
    kv = round_to(rng.standard_normal((n, 8, 128)), "FP16").astype(np.float16)
    return q, kv


def json_attention_body(q, kv, **extra):
    t = lambda name, a: {"name": name, "shape": list(a.shape), "datatype": "FP16",  # noqa: E731
                         "data": a.astype(np.float32).ravel().tolist()}
    return json.dumps({"id": "j1", "inputs": [t("Q", q), t("K", kv), t("V", kv)], **extra})


def grpc_attention(server, q, kv):
    c = grpcclient.InferenceServerClient(server.url)
    o = c.infer("attention", triton_inputs(grpcclient, (("Q", q), ("K", kv), ("V", kv)))).as_numpy("O")
    c.close()
    return o


def assert_error(code, out, status, *words):
    assert code == status, (code, out[:500])
    msg = json.loads(out)["error"]
    for w in words:
        assert w in msg, msg


def assert_still_serving(server):
    q, kv = small_attention(seed=99, n=1)
    code, _, out = curl(server, "POST", "/v2/models/attention/infer", json_attention_body(q, kv))
    assert code == 200, out[:500]
    assert get_json(server, "/v2/health/live") is None


# ---- every path ------------------------------------------------------------------------------

def test_health_and_metadata_paths(server):
    assert curl(server, "GET", "/v2/health/live")[0] == 200
    assert curl(server, "GET", "/v2/health/ready")[0] == 200
    md = get_json(server, "/v2")
    assert md["name"] == "flashq" and md["version"], md
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(md["extensions"]), md
    for m in DEMO_MODELS:
        for base in (f"/v2/models/{m}", f"/v2/models/{m}/versions/1"):
            meta = get_json(server, base)
            assert meta["name"] == m and meta["versions"] == ["1"], meta
            assert all(isinstance(d, int) for t in meta["inputs"] for d in t["shape"]), meta
            assert curl(server, "GET", base + "/ready")[0] == 200
            cfg = get_json(server, base + "/config")
            # Triton's tools read these as JSON numbers, not the strings of protobuf's JSON mapping.
            assert cfg["name"] == m and cfg["max_batch_size"] == 0, cfg
            assert all(isinstance(d, int) for i in cfg["input"] for d in i["dims"]), cfg
            stats = get_json(server, base + "/stats")
            assert [s["name"] for s in stats["model_stats"]] == [m], stats
            assert isinstance(stats["model_stats"][0]["inference_count"], int), stats
    everything = get_json(server, "/v2/models/stats")
    assert {s["name"] for s in everything["model_stats"]} >= set(DEMO_MODELS)


def test_unknown_model_and_version(server):
    assert curl(server, "GET", "/v2/models/no_such_model/ready")[0] == 400   # not ready, as Triton answers
    assert curl(server, "GET", "/v2/models/attention/versions/2/ready")[0] == 400
    for path in ("/v2/models/no_such_model", "/v2/models/no_such_model/config", "/v2/models/no_such_model/stats"):
        code, _, out = curl(server, "GET", path)
        assert_error(code, out, 404, "no_such_model")
    for path in ("/v2/models/attention/versions/2", "/v2/models/attention/versions/2/config"):
        code, _, out = curl(server, "GET", path)
        assert_error(code, out, 404, "'2'")
    q, kv = small_attention()
    code, _, out = curl(server, "POST", "/v2/models/no_such_model/infer", json_attention_body(q, kv))
    assert_error(code, out, 404, "no_such_model")
    code, _, out = curl(server, "POST", "/v2/models/attention/versions/7/infer", json_attention_body(q, kv))
    assert_error(code, out, 404, "'7'")
    code, _, out = curl(server, "GET", "/v2/no/such/path")
    assert_error(code, out, 404, "/v2/no/such/path")


def test_repository_paths_without_model_control(server):
    index = get_json(server, "/v2/repository/index", method="POST", body="{}")
    assert {(e["name"], e["state"]) for e in index} == {(m, "READY") for m in DEMO_MODELS}, index
    for action in ("load", "unload"):
        code, _, out = curl(server, "POST", f"/v2/repository/models/attention/{action}", "{}")
        assert_error(code, out, 400, "--model-control-mode=explicit")


def test_repository_load_and_unload_in_explicit_mode(start_server):
    """The HTTP repository endpoints drive model control as the gRPC RPCs do: an unloaded
    model is listed without a state and refuses requests, a load serves it again, and an
    unknown model is 404."""
    s = start_server("--model-control-mode=explicit", "--load-model=attention", name="http-explicit")
    ready = {e["name"] for e in get_json(s, "/v2/repository/index", method="POST", body='{"ready": true}')}
    assert ready == {"attention"}, ready
    assert curl(s, "POST", "/v2/repository/models/attention/unload", "{}")[0] == 200
    q, kv = small_attention()
    code, _, out = curl(s, "POST", "/v2/models/attention/infer", json_attention_body(q, kv))
    assert code >= 400 and "attention" in json.loads(out)["error"], (code, out)
    states = {e["name"]: e.get("state", "") for e in get_json(s, "/v2/repository/index", method="POST", body="{}")}
    assert states["attention"] != "READY", states
    assert curl(s, "POST", "/v2/repository/models/attention/load", "")[0] == 200
    assert_still_serving(s)
    code, _, out = curl(s, "POST", "/v2/repository/models/no_such_model/load", "{}")
    assert_error(code, out, 404, "no_such_model")


def test_shared_memory_paths(server):
    assert get_json(server, "/v2/systemsharedmemory/status") == []
    assert get_json(server, "/v2/cudasharedmemory/status") == []
    code, _, out = curl(server, "GET", "/v2/systemsharedmemory/region/nope/status")
    assert_error(code, out, 404, "nope")
    code, _, out = curl(server, "POST", "/v2/systemsharedmemory/region/r/register",
                        json.dumps({"key": "/flashq_no_such_object", "offset": 0, "byte_size": 64}))
    assert code in (400, 404) and json.loads(out)["error"], (code, out)
    code, _, out = curl(server, "POST", "/v2/systemsharedmemory/region/r/register", "{not json")
    assert_error(code, out, 400, "malformed JSON")
    code, _, out = curl(server, "POST", "/v2/cudasharedmemory/region/c/register",
                        json.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}))
    assert code >= 400 and json.loads(out)["error"], (code, out)
    for base in ("/v2/systemsharedmemory", "/v2/cudasharedmemory"):
        assert curl(server, "POST", base + "/unregister", "")[0] == 200
        assert curl(server, "POST", base + "/region/r/unregister", "")[0] == 200


# ---- inference: JSON and binary tensors ----------------------------------------------------------

def test_json_infer_matches_grpc(server):
    q, kv = small_attention()
    code, hdrs, out = curl(server, "POST", "/v2/models/attention/infer", json_attention_body(q, kv))
    assert code == 200, out[:500]
    assert "inference-header-content-length" not in hdrs
    res = json.loads(out)
    assert res["model_name"] == "attention" and res["model_version"] == "1" and res["id"] == "j1", res
    o = next(t for t in res["outputs"] if t["name"] == "O")
    assert o["datatype"] == "FP16" and o["shape"] == [3, 32, 128], o
    got = np.array(o["data"], np.float32).astype(np.float16).reshape(o["shape"])
    np.testing.assert_array_equal(got, grpc_attention(server, q, kv))


def test_binary_tensors_match_grpc(server):
    q, kv = small_attention(seed=5)
    header = json.dumps({
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP16",
                    "parameters": {"binary_data_size": a.nbytes}} for n, a in (("Q", q), ("K", kv), ("V", kv))],
        "outputs": [{"name": "O", "parameters": {"binary_data": True}}]}).encode()
    body = header + q.tobytes() + kv.tobytes() + kv.tobytes()
    code, hdrs, out = curl(server, "POST", "/v2/models/attention/infer", body,
                           [f"Inference-Header-Content-Length: {len(header)}", "Content-Type: application/octet-stream"])
    assert code == 200, out[:500]
    n = int(hdrs["inference-header-content-length"])
    res = json.loads(out[:n])
    o = res["outputs"][0]
    assert o["name"] == "O" and o["parameters"]["binary_data_size"] == len(out) - n, res
    got = np.frombuffer(out[n:], np.float16).reshape(o["shape"])
    np.testing.assert_array_equal(got, grpc_attention(server, q, kv))


def test_tritonclient_http_json_and_binary_agree(server):
    """tritonclient.http with binary_data=False sends and receives JSON `data`; with the
    default, binary tensors. Both give the gRPC result."""
    q, kv = small_attention(seed=8)
    c = httpclient.InferenceServerClient(server.http_url)
    results = []
    for binary in (False, True):
        ins = []
        for name, a in (("Q", q), ("K", kv), ("V", kv)):
            i = httpclient.InferInput(name, list(a.shape), "FP16")
            i.set_data_from_numpy(a, binary_data=binary)
            ins.append(i)
        res = c.infer("attention", ins, outputs=[httpclient.InferRequestedOutput("O", binary_data=binary)])
        results.append(res.as_numpy("O").astype(np.float16))
    c.close()
    want = grpc_attention(server, q, kv)
    for r in results:
        np.testing.assert_array_equal(r.reshape(want.shape), want)


# ---- bad requests: status, error, still serving ------------------------------------------------

def bad_bodies():
    q, kv = small_attention(n=2)
    good = json.loads(json_attention_body(q, kv))

    def mutate(f):
        b = json.loads(json.dumps(good))
        f(b)
        return json.dumps(b)

    return {
        "malformed JSON": ("{\"inputs\": [", 400, "malformed JSON"),
        "not an object": ("[1, 2]", 400, "JSON object"),
        "no inputs": ("{}", 400, "inputs"),
        "data not numbers": (mutate(lambda b: b["inputs"][0].__setitem__("data", ["x"] * 2 * 32 * 128)), 400,
                             "not a number"),
        "too few values": (mutate(lambda b: b["inputs"][0].__setitem__("data", [0.0] * 10)), 400, "'Q'"),
        "wrong shape": (mutate(lambda b: b["inputs"][0].__setitem__("shape", [2, 32, 64])), 400, "'Q'"),
        "wrong datatype": (mutate(lambda b: b["inputs"][0].__setitem__("datatype", "INT32")), 400, "'Q'"),
        "unknown datatype": (mutate(lambda b: b["inputs"][0].__setitem__("datatype", "COMPLEX")), 400, "COMPLEX"),
        "unknown input": (mutate(lambda b: b["inputs"][0].__setitem__("name", "Z")), 400, "'Z'"),
        "no data": (mutate(lambda b: b["inputs"][0].pop("data")), 400, "no 'data'"),
        "binary size without header": (
            mutate(lambda b: b["inputs"][0].__setitem__("parameters", {"binary_data_size": 4})), 400,
            "Inference-Header-Content-Length"),
    }


@pytest.mark.parametrize("case", sorted(bad_bodies()))
def test_bad_json_request(server, case):
    body, status, word = bad_bodies()[case]
    code, _, out = curl(server, "POST", "/v2/models/attention/infer", body)
    assert_error(code, out, status, word)
    assert_still_serving(server)


def test_bad_binary_framing(server):
    q, kv = small_attention(n=1)
    header = json.dumps({"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP16",
                                     "parameters": {"binary_data_size": a.nbytes}}
                                    for n, a in (("Q", q), ("K", kv), ("V", kv))]}).encode()
    tensors = q.tobytes() + kv.tobytes() + kv.tobytes()
    octet = "Content-Type: application/octet-stream"
    cases = [
        (header + tensors, f"Inference-Header-Content-Length: {len(header) + len(tensors) + 1}",
         "Inference-Header-Content-Length"),                                    # header length past the body
        (header + tensors[:-10], f"Inference-Header-Content-Length: {len(header)}", "runs past the end"),
        (header + tensors + b"xx", f"Inference-Header-Content-Length: {len(header)}", "2 bytes after"),
        (header + tensors, "Inference-Header-Content-Length: twelve", "byte count"),
        (header + tensors, f"Inference-Header-Content-Length: {len(header) - 3}", "malformed JSON"),
    ]
    for body, h, word in cases:
        code, _, out = curl(server, "POST", "/v2/models/attention/infer", body, [h, octet])
        assert_error(code, out, 400, word)
    assert_still_serving(server)


def test_oversized_body_is_413(start_server):
    s = start_server("--grpc-max-message-bytes=1000000", name="http-small-body")
    q, kv = small_attention(n=16)   # 3*16*32*128 values as JSON text: several MB
    code, _, out = curl(s, "POST", "/v2/models/attention/infer", json_attention_body(q, kv))
    assert code == 413, (code, out[:300])
    assert_still_serving(s)


def test_bearer_token(start_server, tmp_dir):
    token = tmp_dir / "token"
    token.write_text("s3cret\n")
    s = start_server(f"--auth-token-file={token}", name="http-auth")
    q, kv = small_attention(n=1)
    body = json_attention_body(q, kv)
    for h in ([], ["Authorization: Bearer wrong"], ["Authorization: s3cret"]):
        for method, path, b in (("POST", "/v2/models/attention/infer", body), ("GET", "/v2", None),
                                ("GET", "/v2/models/attention/config", None), ("GET", "/v2/models/stats", None),
                                ("POST", "/v2/repository/index", "{}")):
            code, hdrs, out = curl(s, method, path, b, h)
            assert code == 401, (h, path, code, out[:300])
            assert json.loads(out)["error"] and hdrs.get("www-authenticate") == "Bearer", (hdrs, out)
    # The probes stay open, as on gRPC.
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/attention/ready"):
        assert curl(s, "GET", path)[0] == 200, path
    ok = ["Authorization: Bearer s3cret"]
    assert curl(s, "POST", "/v2/models/attention/infer", body, ok)[0] == 200
    assert get_json(s, "/v2", headers=ok)["name"] == "flashq"


def test_port_in_use_stops_the_server(server):
    """A second server on a taken HTTP port exits 1 naming it, rather than sharing the port."""
    s = ServerProcess([f"--http-port={server.http_port}"], name="http-port-taken")
    with pytest.raises(AssertionError, match=f"cannot listen on 127.0.0.1:{server.http_port}"):
        s.start(timeout=60)
    assert s.stop() == 1
    assert_still_serving(server)


# ---- shared memory through tritonclient.http ------------------------------------------------------

def test_system_shared_memory_over_http(server):
    q, kv = small_attention(seed=12)
    want = grpc_attention(server, q, kv)
    c = httpclient.InferenceServerClient(server.http_url)
    key = f"/flashq_it_http_{os.getpid()}"
    size_in = q.nbytes + 2 * kv.nbytes
    h_in = shm.create_shared_memory_region("http_in", key + "_in", size_in)
    h_out = shm.create_shared_memory_region("http_out", key + "_out", want.nbytes)
    try:
        shm.set_shared_memory_region(h_in, [q, kv, kv])
        c.register_system_shared_memory("http_in", key + "_in", size_in)
        c.register_system_shared_memory("http_out", key + "_out", want.nbytes)
        assert {r["name"] for r in c.get_system_shared_memory_status()} == {"http_in", "http_out"}
        ins, offset = [], 0
        for name, a in (("Q", q), ("K", kv), ("V", kv)):
            i = httpclient.InferInput(name, list(a.shape), "FP16")
            i.set_shared_memory("http_in", a.nbytes, offset=offset)
            offset += a.nbytes
            ins.append(i)
        out = httpclient.InferRequestedOutput("O", binary_data=True)
        out.set_shared_memory("http_out", want.nbytes)
        res = c.infer("attention", ins, outputs=[out])
        o = res.get_output("O")
        assert o["parameters"]["shared_memory_region"] == "http_out", o
        got = shm.get_contents_as_numpy(h_out, np.float16, list(want.shape))
        np.testing.assert_array_equal(got, want)
    finally:
        c.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        c.close()


# ---- a process with cuBLASLt loaded ----------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(CUBLASLT), reason=f"{CUBLASLT} not installed")
def test_http_and_metrics_with_cublaslt_loaded():
    """libcublasLt.so.13's 94 KB static TLS block is carved from every thread's stack once it is
    loaded at start-up; threads created with ~100 KB stacks then fail with EINVAL. Preloading it
    into the CPU build gives that process layout without a GPU (the CUDA build links it). The HTTP
    threads and the /metrics server must still answer."""
    env = {"LD_PRELOAD": CUBLASLT, "LD_LIBRARY_PATH": os.path.dirname(CUBLASLT)}
    # The hazard is real here: with cuBLASLt preloaded, a thread with civetweb's 100 KB stack cannot start.
    probe = ("import threading; threading.stack_size(100 * 1024); t = threading.Thread(target=lambda: None)\n"
             "try:\n    t.start(); t.join(); print('started')\nexcept RuntimeError:\n    print('EINVAL')")
    for preload, want in ((False, "started"), (True, "EINVAL")):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, **(env if preload else {})))
        assert out.stdout.strip() == want, (preload, out.stdout, out.stderr)
    s = ServerProcess(["--http-thread-count=4"], name="http-cublaslt", env=env)
    s.start()
    try:
        maps = pathlib.Path(f"/proc/{s.proc.pid}/maps").read_text()
        assert "libcublasLt.so.13" in maps, "cuBLASLt is not loaded in the server"
        for _ in range(3):   # more connections than one thread
            assert_still_serving(s)
        assert get_json(s, "/v2/models/stats")["model_stats"]
        import urllib.request
        assert b"flashq_" in urllib.request.urlopen(s.metrics_url, timeout=10).read()
    finally:
        s.assert_clean_stop()
