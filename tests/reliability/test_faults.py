"""Fault injection against a real flashq-server process (CPU backend): cancellations in
the queue and mid-batch, deadlines shorter than the queue time, clients killed
mid-stream, oversized messages and tensors, kv_attention misuse, KV-cache exhaustion
and SIGTERM under load. Every request sent is counted against the answers it got:
exactly one each (a result or the right error), none lost; the server's own
flashq_requests_total agrees where the client can know what the server saw."""
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import rel
from rel import C, Ledger, Server

INJECTED = {}  # fault -> number injected, recorded at the end


def count(fault, n=1):
    INJECTED[fault] = INJECTED.get(fault, 0) + n


@pytest.fixture(scope="module", autouse=True)
def _record():
    yield
    rel.record("faults", {"injected": INJECTED, "total_injected": sum(INJECTED.values())})


def server_flags_supported(*flags):
    out = subprocess.run([rel.SERVER_BIN, "--help"], capture_output=True, text=True).stdout
    return all(f"--{f} " in out for f in flags)


def inflight(srv, model):
    return rel.metric_sum(srv.metrics(), "flashq_inflight_requests", model=model)


def server_total(srv, model):
    return sum(rel.requests_by_code(srv.metrics(), model).values())


def send_all(st, ledger, reqs, timeout=60.0, prefix="r"):
    futs = []
    for i, r in enumerate(reqs):
        key = f"{prefix}{i}"
        ledger.send(key)
        f = st.ModelInfer.future(r, timeout=timeout)
        f.add_done_callback(lambda f, key=key: ledger.answer(key, rel.future_code(f)))
        futs.append(f)
    return futs


def wait_answered(ledger, timeout=60.0):
    rel.wait_for(lambda: not ledger.missing(), timeout, what=f"{ledger.name}: all answers")


def test_cancel_in_queue_and_mid_batch():
    rng = np.random.default_rng(1)
    # Batches close after 1 s: the requests wait in the queue long enough to be cancelled there.
    with Server("--max-queue-delay-us=1000000", "--workers-per-model=1", name="cancel") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        ledger = Ledger("cancel in queue")
        n = 40
        futs = send_all(st, ledger, [rel.attention_req(rng, tokens=32) for _ in range(n)])
        rel.wait_for(lambda: inflight(srv, "attention") >= n, 10, what="all requests at the server")
        for f in futs[::2]:
            f.cancel()
        count("cancel_in_queue", n // 2)
        wait_answered(ledger)
        ledger.check({"OK", "CANCELLED"})
        assert ledger.codes["CANCELLED"] == n // 2 and ledger.codes["OK"] == n // 2, ledger.summary()
        # The server answered each once: its counter covers every request, and the
        # cancelled ones were dropped before compute.
        rel.wait_for(lambda: inflight(srv, "attention") == 0, 20, what="inflight back to 0")
        by_code = rel.requests_by_code(srv.metrics(), "attention")
        assert sum(by_code.values()) == n, by_code
        assert by_code["CANCELLED"] == n // 2, by_code

        # Mid-batch: large requests, cancelled while their batch computes.
        ledger2 = Ledger("cancel mid-batch")
        m = 12
        futs = send_all(st, ledger2, [rel.attention_req(rng, tokens=768) for _ in range(m)], timeout=600, prefix="big")
        rel.wait_for(lambda: inflight(srv, "attention") >= m, 10, what="all big requests at the server")
        time.sleep(1.1)  # the first batch has closed and is computing
        for f in futs[1::2]:
            f.cancel()
        count("cancel_mid_batch", m // 2)
        wait_answered(ledger2, 600)
        ledger2.check({"OK", "CANCELLED"})
        rel.wait_for(lambda: inflight(srv, "attention") == 0, 600, what="inflight back to 0")
        assert server_total(srv, "attention") == n + m
        # Still serving.
        assert st.ModelInfer(rel.attention_req(rng, tokens=8), timeout=30).model_name == "attention"
        ch.close()
        rel.record("cancel", {"in_queue": ledger.summary(), "mid_batch": ledger2.summary(),
                              "server_codes": dict(rel.requests_by_code(srv.metrics(), "attention"))})


def test_deadline_shorter_than_queue_time():
    rng = np.random.default_rng(2)
    with Server("--max-queue-delay-us=400000", name="deadline") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        short, long_ = Ledger("short deadline"), Ledger("long deadline")
        send_all(st, short, [rel.lin_req(rng, m=4) for _ in range(20)], timeout=0.1, prefix="s")
        send_all(st, long_, [rel.lin_req(rng, m=4) for _ in range(20)], timeout=30, prefix="l")
        count("deadline_shorter_than_queue", 20)
        wait_answered(short)
        wait_answered(long_)
        short.check({"DEADLINE_EXCEEDED"})
        long_.check({"OK"})
        # The server dropped the expired ones before compute, each answered once.
        rel.wait_for(lambda: inflight(srv, "lin") == 0, 10, what="inflight back to 0")
        by_code = rel.requests_by_code(srv.metrics(), "lin")
        assert sum(by_code.values()) == 40, by_code
        # gRPC marks a call cancelled once its deadline passes, and the scheduler polls
        # `cancelled` before the deadline, so the server may count these as CANCELLED.
        assert by_code["DEADLINE_EXCEEDED"] + by_code["CANCELLED"] == 20 and by_code["OK"] == 20, by_code
        ch.close()


CHILD = r"""
import sys, time, numpy as np
sys.path.insert(0, sys.argv[2])
import rel
rng = np.random.default_rng(5)
ch = rel.channel(sys.argv[1])
st = rel.stub(ch)
reqs = [rel.attention_req(rng, tokens=512) for _ in range(30)]
stream = st.ModelStreamInfer(iter(reqs + [rel.lin_req(rng) for _ in range(30)]))
futs = [st.ModelInfer.future(rel.attention_req(rng, tokens=512), timeout=60) for _ in range(30)]
print("sent", flush=True)
next(stream)  # the first answer
print("streaming", flush=True)
time.sleep(60)
"""


def test_client_killed_mid_stream():
    rng = np.random.default_rng(3)
    with Server("--max-queue-delay-us=2000", name="disconnect") as srv:
        for round_ in range(3):
            child = subprocess.Popen([sys.executable, "-c", CHILD, srv.url, os.path.dirname(__file__)],
                                     stdout=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "sent"
            assert child.stdout.readline().strip() == "streaming"
            child.kill()  # SIGKILL: no goodbye, the sockets just close
            child.wait()
            count("client_killed_mid_stream")
            # The server drops what it cannot deliver, keeps nothing in flight, and serves on.
            rel.wait_for(lambda: inflight(srv, "attention") + inflight(srv, "lin") == 0, 120,
                         what="inflight back to 0 after the client died")
            ch = rel.channel(srv.url)
            assert rel.stub(ch).ModelInfer(rel.lin_req(rng), timeout=30).model_name == "lin"
            ch.close()
        assert srv.proc.poll() is None, srv.log()


def test_oversized_message_and_tensor_limits():
    flags = ["--grpc-max-message-bytes=1048576"]
    limits = server_flags_supported("max-tensor-bytes", "max-sequences-per-request")
    if limits:
        flags += ["--max-tensor-bytes=262144", "--max-sequences-per-request=4"]
    rng = np.random.default_rng(4)
    with Server(*flags, name="oversize") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        ledger = Ledger("oversized")
        cases = []  # (request, expected code, words the message must contain)
        big = rel.lin_req(rng, m=4096)  # 2 MiB > 1 MiB message limit
        cases.append((big, "RESOURCE_EXHAUSTED", []))
        if limits:
            # 288 KiB tensor < 1 MiB message, > 256 KiB tensor limit
            cases.append((rel.attention_req(rng, tokens=288, hq=8, hkv=8, d=64), "RESOURCE_EXHAUSTED",
                          ["--max-tensor-bytes"]))
            cases.append((rel.attention_req(rng, tokens=64, seqs=8), "RESOURCE_EXHAUSTED",
                          ["--max-sequences-per-request"]))
            cases.append((rel.attention_req(rng, tokens=64, seqs=4), "OK", []))
        cases += [(rel.lin_req(rng), "OK", [])] * 4
        results = {}
        for rep in range(5):
            for i, (r, want, words) in enumerate(cases):
                key = f"{rep}-{i}"
                ledger.send(key)
                f = st.ModelInfer.future(r, timeout=60)

                def done(f, key=key, want=want, words=words):
                    code = rel.future_code(f)
                    results[key] = (code.name, want, words, "" if code == C.OK else f.exception().details())
                    ledger.answer(key, code)
                f.add_done_callback(done)
                count("oversized" if want != "OK" else "control")
        wait_answered(ledger)
        ledger.check({"OK", "RESOURCE_EXHAUSTED"})
        for key, (got, want, words, msg) in results.items():
            assert got == want, f"{key}: {got} ({msg}), expected {want}"
            for w in words:
                assert w in msg, f"{key}: message {msg!r} does not name {w}"
        ch.close()


def stream_call(st, reqs, timeout=60):
    """Sends reqs on one ModelStreamInfer; returns one (code name, message) per request, in order of ids."""
    for i, r in enumerate(reqs):
        r.id = str(i)
    out = {}
    for resp in st.ModelStreamInfer(iter(reqs), timeout=timeout):
        rid = resp.infer_response.id
        assert rid not in out, f"request {rid} answered twice on the stream"
        out[rid] = (resp.error_message.split(":")[0] if resp.error_message else "OK", resp.error_message)
    assert len(out) == len(reqs), f"{len(reqs) - len(out)} stream requests got no answer"
    return [out[str(i)] for i in range(len(reqs))]


def test_kv_misuse_unary_and_stream():
    rng = np.random.default_rng(6)
    with Server(name="kvmisuse") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        ledger = Ledger("kv misuse")

        def unary(r, key):
            ledger.send(key)
            try:
                st.ModelInfer(r, timeout=30)
                ledger.answer(key, C.OK)
                return "OK", ""
            except grpc.RpcError as e:
                ledger.answer(key, e.code())
                return e.code().name, e.details()

        assert unary(rel.kv_req(rng, 9001, n=1), "unknown")[0] == "FAILED_PRECONDITION"
        assert unary(rel.kv_req(rng, 9002, n=1, end=True), "end-no-start")[0] == "FAILED_PRECONDITION"
        assert unary(rel.kv_req(rng, 9003, n=4, start=True), "start")[0] == "OK"
        code, msg = unary(rel.kv_req(rng, 9003, n=4, start=True), "dup-start")
        assert code == "ALREADY_EXISTS" and "9003" in msg, msg
        # The live sequence survived the misuse: it continues and ends normally.
        assert unary(rel.kv_req(rng, 9003, n=1), "decode")[0] == "OK"
        assert unary(rel.kv_req(rng, 9003, n=1, end=True), "end")[0] == "OK"
        assert unary(rel.kv_req(rng, 9003, n=1), "after-end")[0] == "FAILED_PRECONDITION"
        count("kv_misuse_unary", 4)
        ledger.check({"OK", "FAILED_PRECONDITION", "ALREADY_EXISTS"})

        # The same on one stream, mixed with good requests: one answer each, in any order.
        got = stream_call(st, [rel.kv_req(rng, 9101, n=1), rel.kv_req(rng, 9102, n=2, start=True),
                               rel.kv_req(rng, 9103, n=1, end=True), rel.lin_req(rng),
                               rel.kv_req(rng, 9102, n=1, end=True)])
        assert [g[0] for g in got] == ["FAILED_PRECONDITION", "OK", "FAILED_PRECONDITION", "OK", "OK"], got
        got = stream_call(st, [rel.kv_req(rng, 9201, n=2, start=True), rel.kv_req(rng, 9201, n=2, start=True)])
        assert sorted(g[0] for g in got) == ["ALREADY_EXISTS", "OK"], got
        count("kv_misuse_stream", 3)
        # 9201 is still live (flashq_kv_cache_blocks_in_use is never set on this build, so ask it).
        st.ModelInfer(rel.kv_req(rng, 9201, n=1, end=True), timeout=30)
        ch.close()


def test_kv_cache_exhaustion_and_recovery():
    rng = np.random.default_rng(7)
    # 8 blocks of 16 tokens: four 24-token sequences (2 blocks each) fit.
    with Server("--kv-cache-blocks=8", name="kvfull") as srv:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        ledger = Ledger("kv exhaustion")
        codes = {}
        lock = threading.Lock()

        def session(sid):
            key = f"start{sid}"
            ledger.send(key)
            try:
                st.ModelInfer(rel.kv_req(rng, sid, n=24, start=True), timeout=60)
                ledger.answer(key, C.OK)
                with lock:
                    codes[sid] = "OK"
            except grpc.RpcError as e:
                ledger.answer(key, e.code())
                with lock:
                    codes[sid] = e.code().name

        threads = [threading.Thread(target=session, args=(100 + i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        count("kv_cache_exhaustion", 10)
        ledger.check({"OK", "RESOURCE_EXHAUSTED"})
        live = [s for s, c in codes.items() if c == "OK"]
        assert len(live) == 4, codes
        # Full: one more start is refused at once with a message that says so.
        with pytest.raises(grpc.RpcError) as e:
            st.ModelInfer(rel.kv_req(rng, 998, n=16, start=True), timeout=30)
        assert e.value.code() == C.RESOURCE_EXHAUSTED and "KV cache full" in e.value.details()
        # Ending the live sessions frees the cache; new sessions start again, as many as before.
        # (A session whose end needs a new block cannot end while the cache is full: it waits
        # for session_idle_timeout_s. Reported in docs/reliability.md.)
        for s in live:
            st.ModelInfer(rel.kv_req(rng, s, n=1, end=True), timeout=30)  # 25th token: still in block 2
        for i in range(4):
            st.ModelInfer(rel.kv_req(rng, 1000 + i, n=24, start=True), timeout=30)
        for i in range(4):
            st.ModelInfer(rel.kv_req(rng, 1000 + i, n=8, end=True), timeout=30)
        ch.close()


def test_sigterm_under_load():
    rng = np.random.default_rng(8)
    srv = Server("--max-queue-delay-us=1000", name="sigterm").start()
    try:
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        unary, streams = Ledger("unary under SIGTERM"), Ledger("stream under SIGTERM")
        stop = threading.Event()
        reqs = [rel.attention_req(rng, tokens=128), rel.lin_req(rng, m=16)]
        sent_at, code_of = {}, {}

        def sender(t):
            i = 0
            sem = threading.Semaphore(8)
            while not stop.is_set():
                sem.acquire()
                key = f"{t}-{i}"
                i += 1
                unary.send(key)
                sent_at[key] = time.monotonic()
                f = st.ModelInfer.future(reqs[i % 2], timeout=60)

                def done(f, key=key):
                    code_of[key] = rel.future_code(f).name
                    unary.answer(key, code_of[key])
                    sem.release()
                f.add_done_callback(done)
                time.sleep(0.002)

        def streamer(t):
            j = 0
            while not stop.is_set():
                batch = [rel.lin_req(rng, m=4) for _ in range(16)]
                keys = [f"s{t}-{j}-{k}" for k in range(len(batch))]
                j += 1
                for k in keys:
                    streams.send(k)
                try:
                    for i, code in enumerate(stream_call(rel.stub(ch), batch)):
                        streams.answer(keys[i], C.OK if code[0] == "OK" else code[0])
                except (grpc.RpcError, AssertionError) as e:
                    # The stream itself failed (server gone): that is the answer to what is left.
                    code = e.code() if isinstance(e, grpc.RpcError) else "STREAM_INCOMPLETE"
                    for k in keys:
                        if k in streams.pending:
                            streams.answer(k, code)

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(3)]
        threads += [threading.Thread(target=streamer, args=(t,)) for t in range(1)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        sent_before = unary.sent
        t_term = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        count("sigterm_under_load")
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        wait_answered(unary, 120)
        code = srv.stop()
        assert code == 0, f"exit {code} after SIGTERM under load:\n{srv.log()}"
        # Admitted work finished (OK); what came during the drain got UNAVAILABLE; nothing lost.
        # A call that reaches the port while gRPC itself shuts down (after the drain) may be
        # cancelled by the gRPC library before our handler sees it: CANCELLED, only after SIGTERM.
        unary.check({"OK", "UNAVAILABLE", "CANCELLED"})
        streams.check({"OK", "UNAVAILABLE", "CANCELLED"})
        early = {code_of[k] for k, t in sent_at.items() if t < t_term - 0.05}
        assert early <= {"OK", "UNAVAILABLE"}, f"requests sent before SIGTERM got {early}"
        assert unary.codes["OK"] >= min(sent_before, 20), unary.summary()
        rel.record("sigterm", {"unary": unary.summary(), "stream": streams.summary()})
        ch.close()
    finally:
        srv.stop()
