"""ModelStreamInfer clients that never read their answers, against a real flashq-server
(CPU backend). A linear model whose answer is 2 MiB (Y [1024, 1024] FP16 from X [1024, 16])
makes each unread answer count.

- Backpressure: the server stops reading a stream once its unsent answers reach the
  stream limits (--stream-max-unanswered, --stream-max-unsent-bytes), so RSS stays bounded
  while a client keeps sending on several streams; other clients are served meanwhile.
- Heap release: once that client is gone, the freed answers go back to the OS beyond the
  warm reserve (--heap-reserve-mb), and RSS returns near its baseline within seconds.
- Semantics under tight limits: every request gets exactly one answer, errors included."""
import os
import pathlib
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import rel
from rel import C, Ledger, Server

K, N, ROWS = 16, 1024, 1024  # one answer: ROWS x N FP16 = 2 MiB
ANSWER_MB = ROWS * N * 2 / 2**20
BAD_STREAMS = 4
SEND_S = 12.0
# Bounded: 4 streams x (32 MiB of answers + 8 MiB HTTP/2 window of requests + one answer in
# gRPC's hands), plus gRPC and compute buffers. Unbounded, it grows by ~2 MiB per answer
# computed: several hundred MB within SEND_S on two cores.
GROWTH_BOUND_MB = 320.0
# After the client is gone: back within this much of the baseline, within RECOVER_S.
RECOVER_MB = 48.0
RECOVER_S = 8.0


def sanitizer_build():
    """ASan's allocator (quarantine, no release to the OS) makes RSS meaningless here."""
    if not os.path.exists(rel.SERVER_BIN):
        return False
    with open(rel.SERVER_BIN, "rb") as f:
        return b"__asan_init" in f.read()


def wide_repository(root):
    root = pathlib.Path(root)
    (root / "wide").mkdir(parents=True, exist_ok=True)
    (root / "wide/config.pbtxt").write_text(
        f'name: "wide"\nmax_batch_size: 0\ninput [ {{ name: "X" data_type: TYPE_FP16 dims: [ -1, {K} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP16 dims: [ -1, {N} ] }} ]\n'
        'dynamic_batching { default_queue_policy { max_queue_size: 256 } }\n'
        + rel._param("kind", "linear") + rel._param("in_features", K) + rel._param("out_features", N)
        + rel._param("max_batch_tokens", 4 * ROWS) + rel._param("weight_format", "bf16"))
    w = np.random.default_rng(13).standard_normal((N, K)).astype(np.float32) * 0.05
    bits = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    rel._safetensors(root / "wide/model.safetensors", "weight", "BF16", (N, K), bits)
    return root


def wide_req(rng, rows=ROWS, rid=""):
    return rel.request("wide", [("X", "FP16", [rows, K], rel.f16(rng, rows, K))], rid=rid)


# The client that never reads: BAD_STREAMS streams, each fed by a generator as fast as gRPC
# takes requests; the answers are never iterated. Bounded: it stops after 60 s or 20,000 requests.
CHILD = r"""
import sys, threading, time, numpy as np
sys.path.insert(0, sys.argv[2])
import rel
rows, k, streams = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
req = rel.request("wide", [("X", "FP16", [rows, k], rel.f16(np.random.default_rng(9), rows, k))])
sent = [0]
lock = threading.Lock()
def gen():
    for _ in range(20000):
        with lock:
            sent[0] += 1
        yield req
ch = rel.channel(sys.argv[1])
st = rel.stub(ch)
calls = [st.ModelStreamInfer(gen()) for _ in range(streams)]
print("sending", flush=True)
for _ in range(120):
    time.sleep(0.5)
    print(sent[0], flush=True)
"""


@pytest.mark.skipif(sanitizer_build(), reason="RSS bounds do not apply to a sanitizer build")
def test_unread_stream_memory_is_bounded_and_returned():
    rng = np.random.default_rng(12)
    repo = wide_repository(rel.TEST_TMP / f"wide-repo-{os.getpid()}")
    with Server(f"--model-repository={repo}", name="stream-unread") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        # Warm-up: the model's working set, on unary and stream, read as usual.
        for _ in range(4):
            st.ModelInfer(wide_req(rng), timeout=60)
        for _ in st.ModelStreamInfer(iter([wide_req(rng) for _ in range(4)]), timeout=60):
            pass
        time.sleep(3.0)  # the heap releaser's window passes: the baseline is the idle server
        baseline = srv.rss_mb()

        child = subprocess.Popen([sys.executable, "-c", CHILD, srv.url, os.path.dirname(__file__), str(ROWS), str(K),
                                  str(BAD_STREAMS)], stdout=subprocess.PIPE, text=True)
        sent_lines = []
        reader = threading.Thread(target=lambda: sent_lines.extend(line.strip() for line in child.stdout), daemon=True)
        try:
            # Meanwhile, another client is served: small unary requests and short streams that read.
            good = Ledger("other clients")
            stop = threading.Event()

            def other():
                i = 0
                while not stop.is_set():
                    key = f"u{i}"
                    good.send(key)
                    try:
                        st.ModelInfer(wide_req(rng, rows=8), timeout=20)
                        good.answer(key, C.OK)
                    except grpc.RpcError as e:
                        good.answer(key, e.code())
                    keys = [f"s{i}-{j}" for j in range(3)]
                    for k in keys:
                        good.send(k)
                    got = 0
                    try:
                        for resp in st.ModelStreamInfer(iter([wide_req(rng, rows=8) for _ in keys]), timeout=20):
                            good.answer(keys[got], C.OK if not resp.error_message else resp.error_message)
                            got += 1
                    except grpc.RpcError as e:
                        for k in keys[got:]:
                            good.answer(k, e.code())
                    i += 1
                    time.sleep(0.2)

            assert child.stdout.readline().strip() == "sending"
            reader.start()
            t_other = threading.Thread(target=other)
            t_other.start()
            peak, samples = baseline, []
            t0 = time.monotonic()
            while time.monotonic() - t0 < SEND_S:
                rss = srv.rss_mb()
                samples.append(round(rss, 1))
                peak = max(peak, rss)
                if peak - baseline > 2 * GROWTH_BOUND_MB:
                    break  # clearly unbounded: no need to push the machine further
                time.sleep(0.2)
            stop.set()
            t_other.join(timeout=60)
            sent_by_child = int(sent_lines[-1]) if sent_lines and sent_lines[-1].isdigit() else -1
        finally:
            child.kill()  # SIGKILL: the sockets just close
            child.wait()

        # After the client is gone the server drops its answers and gives the memory back.
        t_kill = time.monotonic()
        after = srv.rss_mb()
        while time.monotonic() - t_kill < RECOVER_S:
            after = srv.rss_mb()
            if after - baseline <= RECOVER_MB:
                break
            time.sleep(0.25)
        recovered_s = time.monotonic() - t_kill
        rel.record("stream_unread", {"baseline_mb": round(baseline, 1), "peak_mb": round(peak, 1),
                                     "after_mb": round(after, 1), "recovered_s": round(recovered_s, 2),
                                     "requests_offered_by_child": sent_by_child, "other": good.summary()})
        print(f"RSS baseline {baseline:.0f} MB, peak {peak:.0f} MB while {BAD_STREAMS} streams did not read "
              f"(child offered {sent_by_child} requests), {after:.0f} MB {recovered_s:.1f} s after the client died; "
              f"other clients: {good.summary()}")
        assert peak - baseline < GROWTH_BOUND_MB, (
            f"RSS grew {peak - baseline:.0f} MB (bound {GROWTH_BOUND_MB}) while a client did not read: {samples}")
        assert after - baseline <= RECOVER_MB, (
            f"RSS {after:.0f} MB, {after - baseline:.0f} MB above the baseline {baseline:.0f} MB, "
            f"{RECOVER_S} s after the client died")
        good.check({"OK"})
        assert good.answered >= 4, good.summary()
        # Still serving, with the same answers as before.
        assert st.ModelInfer(wide_req(rng, rows=8), timeout=30).model_name == "wide"
        ch.close()


def test_tight_stream_limits_keep_one_answer_per_request():
    """With limits of 2 answers and 1 byte, a stream of 120 requests, a third of them
    errors, gets every answer exactly once, in any order, and finishes OK."""
    rng = np.random.default_rng(14)
    repo = wide_repository(rel.TEST_TMP / f"wide-repo-{os.getpid()}")
    with Server(f"--model-repository={repo}", "--stream-max-unanswered=2", "--stream-max-unsent-bytes=1",
                name="stream-tight") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        reqs = []
        for i in range(120):
            if i % 3 == 2:
                r = rel.request("wide", [("X", "FP16", [4, K + 1], rel.f16(rng, 4, K + 1))])  # wrong K
            else:
                r = wide_req(rng, rows=64 if i % 3 else 8)
            r.id = str(i)
            reqs.append(r)
        got = {}
        call = st.ModelStreamInfer(iter(reqs), timeout=120)
        for resp in call:
            rid = resp.infer_response.id
            assert rid not in got, f"request {rid} answered twice"
            got[rid] = resp.error_message
        assert call.code() == C.OK
        assert len(got) == len(reqs), f"{len(reqs) - len(got)} requests got no answer"
        for i in range(len(reqs)):
            if i % 3 == 2:
                assert got[str(i)].startswith("INVALID_ARGUMENT"), (i, got[str(i)])
            else:
                assert got[str(i)] == "", (i, got[str(i)])
        ch.close()
