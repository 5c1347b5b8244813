"""Metrics on the metrics port: every documented name is exported with the right type,
a request of known latency lands in the right latency buckets, and a real Prometheus
server (Debian package `prometheus`), started here, scrapes it and answers a
histogram_quantile query over the latency histogram."""
import shutil
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import PROMETHEUS, prometheus
from helpers import metric, round_to, scrape, wait_for

EXPECTED = {
    "flashq_request_duration_seconds": "histogram",
    "flashq_batch_requests": "histogram",
    "flashq_batch_tokens": "histogram",
    "flashq_requests_total": "counter",
    "flashq_inflight_requests": "gauge",
    "flashq_queue_depth": "gauge",
    "flashq_kv_cache_blocks_in_use": "gauge",
    "flashq_kv_cache_blocks_total": "gauge",
    "flashq_kv_cache_usage_ratio": "gauge",
}


def send_attention(client, rng, n=8):
    q = round_to(rng.standard_normal((n, 32, 128)), "FP16").astype(np.float16)
    kv = round_to(rng.standard_normal((n, 8, 128)), "FP16").astype(np.float16)
    ins = []
    for name, a in (("Q", q), ("K", kv), ("V", kv)):
        i = grpcclient.InferInput(name, list(a.shape), "FP16")
        i.set_data_from_numpy(a)
        ins.append(i)
    return client.infer("attention", ins, parameters={"causal": True})


def test_metric_names_and_types(server):
    c = grpcclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(0)
    for _ in range(3):
        send_attention(c, rng)
    samples, types = scrape(server.metrics_url)
    wrong = {n: types.get(n) for n, t in EXPECTED.items() if types.get(n) != t}
    assert not wrong, f"metrics missing or of the wrong type (name: found type): {wrong}"
    for stage in ("queue", "compute", "total"):
        assert metric(samples, "flashq_request_duration_seconds_count", model="attention", stage=stage) >= 3, stage
    assert metric(samples, "flashq_requests_total", model="attention", code="OK") >= 3
    assert metric(samples, "flashq_batch_requests_count", model="attention") >= 1
    assert metric(samples, "flashq_batch_tokens_sum", model="attention") >= 24
    assert metric(samples, "flashq_kv_cache_blocks_total") >= 512


def buckets(samples, name, **labels):
    """{le: cumulative count} of one histogram series."""
    want = set(labels.items())
    out = {}
    for (n, l), v in samples.items():
        d = dict(l)
        if n == name + "_bucket" and want <= set(l):
            out[float(d["le"])] = v
    return out


QUEUE_DELAY_S = 0.3  # between the buckets 0.2048 and 0.4096, far from both


def test_known_latency_lands_in_its_bucket(start_server):
    """One request alone on a server whose queue delay is 0.3 s waits exactly that long
    for company: its queue time is >= 0.3 s and its total <= the client's round trip.
    Each stage gets one observation, the observed value is the _sum's increase, and
    every cumulative bucket grows by 1 exactly when le >= that value."""
    s = start_server(f"--max-queue-delay-us={int(QUEUE_DELAY_S * 1e6)}", name="metrics-delay")
    c = grpcclient.InferenceServerClient(s.url)
    before, _ = scrape(s.metrics_url)
    t0 = time.monotonic()
    send_attention(c, np.random.default_rng(5))
    round_trip = time.monotonic() - t0
    after, _ = scrape(s.metrics_url)
    name = "flashq_request_duration_seconds"
    seen = {}
    for stage in ("queue", "compute", "total"):
        lab = dict(model="attention", stage=stage)
        n = metric(after, name + "_count", **lab) - metric(before, name + "_count", **lab)
        assert n == 1, f"{stage}: {n} observations, expected 1"
        v = metric(after, name + "_sum", **lab) - metric(before, name + "_sum", **lab)
        b0, b1 = buckets(before, name, **lab), buckets(after, name, **lab)
        assert sorted(b1) == sorted(b0) and float("inf") in b1 and len(b1) > 10, sorted(b1)
        wrong = {le: b1[le] - b0[le] for le in b1 if b1[le] - b0[le] != (1 if v <= le else 0)}
        assert not wrong, f"{stage} observed {v:.6f}s; bucket increases that disagree: {wrong}"
        seen[stage] = v
    assert QUEUE_DELAY_S <= seen["queue"] <= seen["total"] <= round_trip, (seen, round_trip)
    assert 0 < seen["compute"] <= seen["total"] - seen["queue"] + 1e-3, seen
    if round_trip <= 0.4096:  # then the queue time is in (0.2048, 0.4096]: that bucket and no lower one
        b0, b1 = (buckets(x, name, model="attention", stage="queue") for x in (before, after))
        assert (b1[0.2048] - b0[0.2048], b1[0.4096] - b0[0.4096]) == (0, 1), (b0, b1)
    print(f"queue {seen['queue'] * 1e3:.1f} ms, compute {seen['compute'] * 1e3:.2f} ms, total "
          f"{seen['total'] * 1e3:.1f} ms, client round trip {round_trip * 1e3:.1f} ms")


def test_metrics_http_basics(server):
    resp = urllib.request.urlopen(server.metrics_url, timeout=10)
    assert resp.status == 200
    assert resp.headers.get("Content-Type", "").startswith("text/plain")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/nope"), timeout=10)
    assert e.value.code == 404


@pytest.mark.skipif(not shutil.which(PROMETHEUS), reason="prometheus binary not installed (scripts/setup.sh)")
def test_prometheus_scrapes_and_answers_histogram_quantile(server, tmp_dir):
    stop = threading.Event()
    c = grpcclient.InferenceServerClient(server.url)

    def load():   # keep the counters moving so that rate() over the window is non-zero
        rng = np.random.default_rng(1)
        while not stop.is_set():
            send_attention(c, rng)
            time.sleep(0.05)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        with prometheus(server.metrics_port, tmp_dir) as query:
            expr = ('histogram_quantile(0.5, sum(rate(flashq_request_duration_seconds_bucket{stage="total"}[1m])) '
                    'by (le))')
            p50 = wait_for(lambda: query(expr), timeout=90, interval=1, what=f"a value for {expr}")
            assert p50 > 0, p50
            up = query('up{job="flashq"}')
            assert up == 1.0, up
            p99 = wait_for(lambda: query(expr.replace("0.5", "0.99")), timeout=30, interval=1, what="p99")
            assert p99 >= p50
            print(f"Prometheus: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
    finally:
        stop.set()
        t.join(timeout=30)
