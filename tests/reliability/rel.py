"""Helpers of the reliability tests: a small model repository, a flashq-server process
(TLS-aware), raw KServe requests, /metrics scraping, RSS, and an answer ledger that
counts every request sent against the answers it got.

Environment (set by tests/reliability/CMakeLists.txt; defaults fit build-rel/):
  FLASHQ_SERVER       flashq-server to test
  FLASHQ_TEST_TMP     where logs, repositories and certificates go
  FLASHQ_RESULTS      JSON file that tests append their figures to (optional)
"""
import collections
import json
import os
import pathlib
import struct
import sys
import threading
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The server process, request building, /metrics parsing and polling are shared with the other
# Python suites (tests/pylib).
sys.path.insert(0, str(ROOT / "tests" / "pylib"))
import helpers  # noqa: E402
from server_process import READY_LINE, FlashqServer, free_port  # noqa: E402,F401
SERVER_BIN = os.environ.get("FLASHQ_SERVER", str(ROOT / "build-rel/bin/flashq-server"))
TEST_TMP = pathlib.Path(os.environ.get("FLASHQ_TEST_TMP", str(ROOT / "build-rel/reliability/tmp")))
RESULTS = os.environ.get("FLASHQ_RESULTS")
C = grpc.StatusCode

# ---- a small repository: quick to start, no 400 MB demo -----------------------------
KV = dict(hq=8, hkv=2, d=64, page=16)
LIN_K, LIN_N = 256, 128


def _param(k, v):
    return f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'


def _safetensors(path, name, dtype, shape, data):
    header = json.dumps({name: {"dtype": dtype, "shape": list(shape), "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def small_repository(root):
    """attention (head dims 64/128), kv_attention (8/2 heads, D=64, 64 blocks of 16
    tokens) and lin (BF16, K=256, N=128). Returns the path."""
    root = pathlib.Path(root)
    queue = "dynamic_batching { max_queue_delay_microseconds: 500 default_queue_policy { max_queue_size: 256 } }\n"
    (root / "attention").mkdir(parents=True, exist_ok=True)
    (root / "attention/config.pbtxt").write_text(
        'name: "attention"\nmax_batch_size: 0\ninput [\n'
        ' { name: "Q" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n'
        ' { name: "K" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n'
        ' { name: "V" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n'
        ' { name: "CU_SEQLENS_Q" data_type: TYPE_INT32 dims: [ -1 ] optional: true },\n'
        ' { name: "CU_SEQLENS_K" data_type: TYPE_INT32 dims: [ -1 ] optional: true }\n]\n'
        'output [\n { name: "O" data_type: TYPE_FP16 dims: [ -1, -1, -1 ] },\n'
        ' { name: "LSE" data_type: TYPE_FP32 dims: [ -1, -1 ] }\n]\n'
        + queue + _param("kind", "attention") + _param("max_batch_tokens", "8192") + _param("head_dims", "64,128"))
    (root / "kv_attention").mkdir(exist_ok=True)
    (root / "kv_attention/config.pbtxt").write_text(
        'name: "kv_attention"\nmax_batch_size: 0\ninput [\n'
        f' {{ name: "Q" data_type: TYPE_FP16 dims: [ -1, {KV["hq"]}, {KV["d"]} ] }},\n'
        f' {{ name: "K" data_type: TYPE_FP16 dims: [ -1, {KV["hkv"]}, {KV["d"]} ] }},\n'
        f' {{ name: "V" data_type: TYPE_FP16 dims: [ -1, {KV["hkv"]}, {KV["d"]} ] }}\n]\n'
        f'output [ {{ name: "O" data_type: TYPE_FP16 dims: [ -1, {KV["hq"]}, {KV["d"]} ] }} ]\n'
        + _param("kind", "kv_attention") + _param("num_heads_q", KV["hq"]) + _param("num_heads_kv", KV["hkv"])
        + _param("head_dim", KV["d"]) + _param("page_size", KV["page"]) + _param("num_blocks", 64)
        + _param("max_tokens_per_sequence", 1024) + _param("session_idle_timeout_s", 600)
        + _param("max_queue_delay_us", 500) + _param("max_queue_size", 256))
    (root / "lin").mkdir(exist_ok=True)
    (root / "lin/config.pbtxt").write_text(
        f'name: "lin"\nmax_batch_size: 0\ninput [ {{ name: "X" data_type: TYPE_FP16 dims: [ -1, {LIN_K} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP16 dims: [ -1, {LIN_N} ] }} ]\n'
        + queue + _param("kind", "linear") + _param("in_features", LIN_K) + _param("out_features", LIN_N)
        + _param("max_batch_tokens", 1024) + _param("weight_format", "bf16"))
    w = np.random.default_rng(3).standard_normal((LIN_N, LIN_K)).astype(np.float32) * 0.05
    bits = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    _safetensors(root / "lin/model.safetensors", "weight", "BF16", (LIN_N, LIN_K), bits)
    return root


_repo_lock = threading.Lock()


def shared_repository():
    with _repo_lock:
        root = TEST_TMP / f"repo-{os.getpid()}"
        if not (root / "lin/model.safetensors").exists():
            small_repository(root)
        return root


# ---- the server process ---------------------------------------------------------------

class Server(FlashqServer):
    """flashq-server on loopback with the small repository (unless --model-repository is
    passed), CPU backend, 2 threads."""

    def __init__(self, *flags, name="server", env=None, binary=None, repo=None):
        base = ["--backend=cpu", "--cpu-threads=2"]
        if not any(f.startswith("--model-repository") for f in flags):
            base.append(f"--model-repository={repo or shared_repository()}")
        super().__init__(binary or SERVER_BIN, [*base, *flags], name, TEST_TMP, env=env)

    def log(self, tail=80):
        return super().log(tail)

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def metrics(self):
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")


def scrape(url, timeout=10):
    """Prometheus text -> {(name, frozenset(labels)): value}."""
    return helpers.scrape(url, timeout)[0]


metric_sum = helpers.metric


def requests_by_code(samples, model):
    out = collections.Counter()
    for (n, l), v in samples.items():
        d = dict(l)
        if n == "flashq_requests_total" and d.get("model") == model and v:
            out[d.get("code")] += int(v)
    return out


# ---- requests -------------------------------------------------------------------------

def channel(url, max_message_bytes=256 << 20, credentials=None, options=()):
    opts = [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes), *options]
    if credentials is not None:
        return grpc.secure_channel(url, credentials, options=opts)
    return grpc.insecure_channel(url, options=opts)


def stub(ch):
    return service_pb2_grpc.GRPCInferenceServiceStub(ch)


def request(model, inputs, params=None, outputs=None, rid=""):
    """inputs: list of (name, datatype, shape, raw bytes)."""
    return helpers.infer_request(model, inputs, params, outputs, request_id=rid)


def f16(rng, *shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float16).tobytes()


def attention_req(rng, tokens=64, hq=8, hkv=2, d=64, seqs=1, causal=True, rid=""):
    inputs = [("Q", "FP16", [tokens, hq, d], f16(rng, tokens, hq, d)),
              ("K", "FP16", [tokens, hkv, d], f16(rng, tokens, hkv, d)),
              ("V", "FP16", [tokens, hkv, d], f16(rng, tokens, hkv, d))]
    if seqs > 1:
        cu = np.linspace(0, tokens, seqs + 1).astype(np.int32)
        inputs += [("CU_SEQLENS_Q", "INT32", [seqs + 1], cu.tobytes()), ("CU_SEQLENS_K", "INT32", [seqs + 1], cu.tobytes())]
    return request("attention", inputs, {"causal": causal}, rid=rid)


def kv_req(rng, seq_id, n=1, start=False, end=False, rid=""):
    params = {"sequence_id": int(seq_id)}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    return request("kv_attention", [("Q", "FP16", [n, KV["hq"], KV["d"]], f16(rng, n, KV["hq"], KV["d"])),
                                    ("K", "FP16", [n, KV["hkv"], KV["d"]], f16(rng, n, KV["hkv"], KV["d"])),
                                    ("V", "FP16", [n, KV["hkv"], KV["d"]], f16(rng, n, KV["hkv"], KV["d"]))],
                   params, rid=rid)


def lin_req(rng, m=8, rid=""):
    return request("lin", [("X", "FP16", [m, LIN_K], f16(rng, m, LIN_K))], rid=rid)


# ---- the ledger: every request sent gets exactly one answer ---------------------------

class Ledger:
    """Counts requests sent and the answers they got. answer() raises on a second
    answer for the same request (double answer); missing() lists the unanswered."""

    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()
        self.sent = 0
        self.pending = {}
        self.codes = collections.Counter()
        self.double = 0
        self.latency = collections.defaultdict(list)

    def send(self, key):
        with self.lock:
            assert key not in self.pending, f"request key {key} reused"
            self.sent += 1
            self.pending[key] = time.monotonic()

    def answer(self, key, code):
        with self.lock:
            t0 = self.pending.pop(key, None)
            if t0 is None:
                self.double += 1
                return
            name = code.name if hasattr(code, "name") else str(code)
            self.codes[name] += 1
            self.latency[name].append(time.monotonic() - t0)

    @property
    def answered(self):
        return sum(self.codes.values())

    def missing(self):
        with self.lock:
            return list(self.pending)

    def check(self, allowed):
        """Asserts: nothing lost, nothing answered twice, only `allowed` codes."""
        lost = self.missing()
        assert not lost, f"{self.name}: {len(lost)} of {self.sent} requests got no answer"
        assert self.double == 0, f"{self.name}: {self.double} requests answered twice"
        bad = {c: n for c, n in self.codes.items() if c not in allowed}
        assert not bad, f"{self.name}: unexpected codes {bad} (allowed {sorted(allowed)}); all: {dict(self.codes)}"
        assert self.answered == self.sent

    def summary(self):
        return {"sent": self.sent, "answered": self.answered, "lost": len(self.pending), "double": self.double,
                "codes": dict(self.codes)}


def future_code(fut):
    try:
        fut.result()
        return C.OK
    except grpc.RpcError as e:
        return e.code()
    except grpc.FutureCancelledError:
        return C.CANCELLED


def record(section, figures):
    """Appends figures to FLASHQ_RESULTS (JSON lines) for docs/reliability.md."""
    if not RESULTS:
        return
    os.makedirs(os.path.dirname(RESULTS) or ".", exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps({"section": section, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            **figures}) + "\n")


def wait_for(cond, timeout=10.0, interval=0.05, what="condition"):
    return helpers.wait_for(cond, timeout=timeout, interval=interval, what=what)