"""Metrics on the metrics port: every documented name is exported with the right type,
and a real Prometheus server (Debian package `prometheus`), started here, scrapes it
and answers a histogram_quantile query over the latency histogram."""
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import PROMETHEUS, free_port
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


def test_metrics_http_basics(server):
    resp = urllib.request.urlopen(server.metrics_url, timeout=10)
    assert resp.status == 200
    assert resp.headers.get("Content-Type", "").startswith("text/plain")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/nope"), timeout=10)
    assert e.value.code == 404


@pytest.mark.skipif(not shutil.which(PROMETHEUS), reason="prometheus binary not installed (scripts/setup.sh)")
def test_prometheus_scrapes_and_answers_histogram_quantile(server, tmp_dir):
    port = free_port()
    cfg = tmp_dir / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: flashq
    static_configs:
      - targets: ['127.0.0.1:{server.metrics_port}']
""")
    log = open(tmp_dir / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_dir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    c = grpcclient.InferenceServerClient(server.url)

    def load():   # keep the counters moving so that rate() over the window is non-zero
        rng = np.random.default_rng(1)
        while not stop.is_set():
            send_attention(c, rng)
            time.sleep(0.05)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr):
        url = f"{api}/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=5).read())
        except OSError:
            return None
        res = body.get("data", {}).get("result", [])
        if body.get("status") != "success" or not res:
            return None
        v = float(res[0]["value"][1])
        return v if np.isfinite(v) else None

    try:
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
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
        if prom.returncode not in (0, -15):
            print((tmp_dir / "prometheus.log").read_text()[-3000:])
