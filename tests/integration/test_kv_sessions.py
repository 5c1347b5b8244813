"""kv_attention through the real server with many sessions at once:
- batch invariance: every step of several sequences, sent in lockstep so that the
  server merges steps of different sequences into one batch, is bitwise identical to
  the same step sent alone (the batches are checked through flashq_batch_requests);
- concurrent sessions: several client threads, each driving several sequences
  (prefill, then decode steps, some of several tokens), every output checked against
  float64 causal attention of the new queries over all cached K/V (numpy)."""
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from helpers import assert_close, attention_ref, metric, round_to, scrape

HQ, HKV, D = 32, 8, 128   # the demo kv_attention model


@pytest.fixture(scope="module")
def kv_server(start_server):
    # The queue delay lets steps sent together land in one batch on a loaded 2-core machine.
    return start_server("--max-queue-delay-us=30000", name="kv-sessions")


def make_steps(rng, lens, dtype):
    """Random Q/K/V (rounded to dtype) for a sequence whose requests carry `lens` tokens."""
    return [tuple(round_to(rng.standard_normal((n, h, D)), dtype) for h in (HQ, HKV, HKV)) for n in lens]


def infer_step(client, q, k, v, dtype, seq_id, start, end):
    ins = []
    for name, a in (("Q", q), ("K", k), ("V", v)):
        i = grpcclient.InferInput(name, list(a.shape), dtype)
        i.set_data_from_numpy(a.astype(np.float16) if dtype == "FP16" else a.astype(np.float32))
        ins.append(i)
    res = client.infer("kv_attention", ins, sequence_id=seq_id, sequence_start=start, sequence_end=end,
                       client_timeout=120)
    out = res.get_output("O")
    assert out.datatype == dtype and list(out.shape) == [q.shape[0], HQ, D], (out.datatype, out.shape)
    return res.get_response().raw_output_contents[0]


def decode(raw, dtype, n):
    if dtype == "FP16":
        return np.frombuffer(raw, np.float16).astype(np.float64).reshape(n, HQ, D)
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(n, HQ, D)


def check_step(raw, steps, i, dtype, what):
    """Output of step i against float64 attention of its queries over steps 0..i's K/V."""
    q = steps[i][0]
    ks = np.concatenate([s[1] for s in steps[:i + 1]])
    vs = np.concatenate([s[2] for s in steps[:i + 1]])
    o_ref, _ = attention_ref(q, ks, vs, causal=True)
    assert_close(decode(raw, dtype, q.shape[0]), o_ref, dtype, what)


def batches(s):
    samples, _ = scrape(s.metrics_url)
    return (metric(samples, "flashq_batch_requests_sum", model="kv_attention"),
            metric(samples, "flashq_batch_requests_count", model="kv_attention"))


def test_steps_merged_with_other_sequences_match_alone_bitwise(kv_server):
    s = kv_server
    rng = np.random.default_rng(4400)
    prefill = [5, 17, 33, 1, 48, 20]
    seqs = [make_steps(rng, [n, 1, 1, 2, 1], "FP16") for n in prefill]
    n_steps = len(seqs[0])
    clients = [grpcclient.InferenceServerClient(s.url) for _ in seqs]
    merged = [[None] * n_steps for _ in seqs]
    errors = []
    barrier = threading.Barrier(len(seqs))
    r0, b0 = batches(s)

    def run(j):
        try:
            for i in range(n_steps):
                barrier.wait(timeout=60)   # every sequence sends step i at once
                merged[j][i] = infer_step(clients[j], *seqs[j][i], "FP16", 7100 + j, i == 0, i == n_steps - 1)
        except Exception as e:  # reported below
            errors.append((j, repr(e)))
            barrier.abort()

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(seqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    r1, b1 = batches(s)
    assert r1 - r0 == len(seqs) * n_steps, f"{r1 - r0} requests executed, expected {len(seqs) * n_steps}"
    assert (r1 - r0) / (b1 - b0) > 1.5, f"{r1 - r0} requests in {b1 - b0} batches: the steps were not merged"

    # The same sequences (new ids) one request at a time: every batch holds one request.
    solo = grpcclient.InferenceServerClient(s.url)
    alone = [[infer_step(solo, *seqs[j][i], "FP16", 7200 + j, i == 0, i == n_steps - 1) for i in range(n_steps)]
             for j in range(len(seqs))]
    r2, b2 = batches(s)
    assert r2 - r1 == b2 - b1 == len(seqs) * n_steps, f"alone phase: {r2 - r1} requests in {b2 - b1} batches"

    differ = [(j, i) for j in range(len(seqs)) for i in range(n_steps) if merged[j][i] != alone[j][i]]
    assert not differ, f"(sequence, step) whose merged output differs from the alone one: {differ}"
    for j in range(len(seqs)):
        for i in range(n_steps):
            check_step(merged[j][i], seqs[j], i, "FP16", f"sequence {j} step {i}")
    print(f"{r1 - r0} steps ran in {b1 - b0} batches ({(r1 - r0) / (b1 - b0):.1f} per batch); all equal alone")
    for c in clients + [solo]:
        c.close()


def test_concurrent_sessions_match_float64_reference(kv_server):
    """4 client threads x 3 sequences each, interleaved within a thread: prefill, then
    decode steps (one of 3 tokens), the last with sequence_end. FP16 and BF16 sessions,
    integer and string sequence ids."""
    s = kv_server
    n_threads, per_thread = 4, 3
    errors, checked = [], []

    def run(t):
        try:
            dtype = "FP16" if t % 2 == 0 else "BF16"
            rng = np.random.default_rng(4500 + t)
            client = grpcclient.InferenceServerClient(s.url)
            seqs = {}
            for j in range(per_thread):
                sid = 8000 + 10 * t + j if j % 2 == 0 else f"kv-{t}-{j}"
                lens = [int(rng.integers(1, 41)), 1, 1, 3, 1, 1]
                seqs[sid] = make_steps(rng, lens, dtype)
            n_steps = len(next(iter(seqs.values())))
            for i in range(n_steps):
                for sid, steps in seqs.items():
                    raw = infer_step(client, *steps[i], dtype, sid, i == 0, i == n_steps - 1)
                    check_step(raw, steps, i, dtype, f"thread {t} sequence {sid!r} step {i} ({dtype})")
                    checked.append((t, sid, i))
            client.close()
        except Exception as e:  # reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(checked) == n_threads * per_thread * 6, len(checked)
