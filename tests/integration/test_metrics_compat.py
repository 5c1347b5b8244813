"""Metrics that Triton- and vLLM-shaped tools read, against the real server:
- with --metrics-compat=triton, Triton's nv_inference_* names, whose values agree with
  ModelStatistics as tritonclient reads it, and which a real Prometheus scrapes and stores;
- flashq_kv_cache_usage_ratio, per kv_attention model, following a live sequence's blocks;
- perf_analyzer --collect-metrics against the server, and its parser reading GPU gauges in the
  form the server writes them (the CPU backend exports no nv_gpu_* series; a CUDA build on a GPU
  host does, from NVML, and then this test also checks perf_analyzer's readings of them)."""
import csv
import http.server
import json
import shutil
import subprocess
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import PERF_ANALYZER, PROMETHEUS, prometheus
from helpers import metric, round_to, scrape, wait_for

TRITON = {
    "nv_inference_request_success": "counter", "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter", "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter", "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_infer_duration_us": "counter", "nv_inference_pending_request_count": "gauge",
    "nv_inference_compute_input_duration_us": "counter", "nv_inference_compute_output_duration_us": "counter",
}
GPU_GAUGES = ["nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"]


@pytest.fixture(scope="module")
def compat(start_server):
    return start_server("--metrics-compat=triton", name="metrics-compat")


def attention_inputs(rng, n=8):
    q = round_to(rng.standard_normal((n, 32, 128)), "FP16").astype(np.float16)
    kv = round_to(rng.standard_normal((n, 8, 128)), "FP16").astype(np.float16)
    ins = []
    for name, a in (("Q", q), ("K", kv), ("V", kv)):
        i = grpcclient.InferInput(name, list(a.shape), "FP16")
        i.set_data_from_numpy(a)
        ins.append(i)
    return ins


def test_triton_names_agree_with_model_statistics(compat):
    c = grpcclient.InferenceServerClient(compat.url)
    rng = np.random.default_rng(0)
    for _ in range(5):
        c.infer("attention", attention_inputs(rng))
    with pytest.raises(InferenceServerException):   # K's token count differs from V's: INVALID_ARGUMENT
        bad = attention_inputs(rng)
        k = np.zeros((3, 8, 128), np.float16)
        bad[1] = grpcclient.InferInput("K", list(k.shape), "FP16").set_data_from_numpy(k)
        c.infer("attention", bad)
    samples, types = scrape(compat.metrics_url)
    stats = c.get_inference_statistics("attention", as_json=True)["model_stats"][0]
    wrong = {n: types.get(n) for n, t in TRITON.items() if types.get(n) != t}
    assert not wrong, f"Triton metrics missing or of the wrong type (name: found type): {wrong}"
    inf = stats["inference_stats"]
    lab = dict(model="attention", version="1")
    got = {n: metric(samples, n, **lab) for n in TRITON}
    want = {
        "nv_inference_request_success": int(inf["success"]["count"]),
        "nv_inference_request_failure": int(inf["fail"]["count"]),
        "nv_inference_count": int(stats["inference_count"]),
        "nv_inference_exec_count": int(stats["execution_count"]),
        "nv_inference_request_duration_us": int(inf["success"]["ns"]) // 1000,
        "nv_inference_queue_duration_us": int(inf["queue"]["ns"]) // 1000,
        "nv_inference_compute_infer_duration_us": int(inf["compute_infer"]["ns"]) // 1000,
        "nv_inference_compute_input_duration_us": int(inf["compute_input"]["ns"]) // 1000,
        "nv_inference_compute_output_duration_us": int(inf["compute_output"]["ns"]) // 1000,
        "nv_inference_pending_request_count": 0,
    }
    assert got == want, f"/metrics {got}\nModelStatistics {want}"
    assert want["nv_inference_request_success"] == 5 and want["nv_inference_request_failure"] == 1, want
    assert 1 <= want["nv_inference_exec_count"] <= 5 and want["nv_inference_compute_infer_duration_us"] > 0, want
    # The CPU backend's conversions of the inputs to float and of the outputs back are the copies.
    assert int(inf["compute_input"]["ns"]) > 0 and int(inf["compute_output"]["ns"]) > 0, inf
    # Every served model has its series from the start, labelled as Triton labels them.
    models = {dict(l)["model"] for (n, l) in samples if n == "nv_inference_request_success"}
    assert {"attention", "kv_attention", "up_proj_bf16"} <= models, models
    assert all(dict(l).get("version") == "1" for (n, l) in samples if n.startswith("nv_inference_"))
    c.close()


def test_without_compat_there_are_no_triton_names(server):
    _, types = scrape(server.metrics_url)
    assert not [n for n in types if n.startswith("nv_inference_")], sorted(types)


def test_pending_request_count_sees_queued_requests(start_server):
    """One worker held busy by a slow request: requests behind it are pending, then drained."""
    s = start_server("--metrics-compat=triton", "--workers-per-model=1", "--max-queue-delay-us=0",
                     name="metrics-compat-pending")
    c = grpcclient.InferenceServerClient(s.url)
    rng = np.random.default_rng(2)
    big = attention_inputs(rng, n=2000)      # seconds on the CPU backend
    small = attention_inputs(rng)
    threads = [threading.Thread(target=c.infer, args=("attention", big))]
    threads += [threading.Thread(target=c.infer, args=("attention", small)) for _ in range(3)]
    threads[0].start()
    # Its ~25 MB take a while to arrive: send the others once it is admitted and computing.
    wait_for(lambda: metric(scrape(s.metrics_url)[0], "flashq_inflight_requests", model="attention") == 1,
             timeout=30, interval=0.02, what="the slow request admitted")
    for t in threads[1:]:
        t.start()
    seen = wait_for(lambda: metric(scrape(s.metrics_url)[0], "nv_inference_pending_request_count",
                                   model="attention") or None, timeout=20, interval=0.02,
                    what="a pending request while the worker is busy")
    assert 1 <= seen <= 3, seen
    for t in threads:
        t.join(timeout=120)
    assert wait_for(lambda: metric(scrape(s.metrics_url)[0], "nv_inference_pending_request_count",
                                   model="attention") == 0, what="the queue drained")
    c.close()


def kv_step(c, seq_id, n, start=False, end=False, seed=0):
    rng = np.random.default_rng(seed)
    ins = []
    for name, shape in (("Q", (n, 32, 128)), ("K", (n, 8, 128)), ("V", (n, 8, 128))):
        a = rng.standard_normal(shape).astype(np.float16)
        i = grpcclient.InferInput(name, list(shape), "FP16")
        i.set_data_from_numpy(a)
        ins.append(i)
    c.infer("kv_attention", ins, sequence_id=seq_id, sequence_start=start, sequence_end=end)


def test_kv_cache_usage_ratio_follows_a_sequence(server):
    def ratio():
        return metric(scrape(server.metrics_url)[0], "flashq_kv_cache_usage_ratio", model="kv_attention")

    samples, types = scrape(server.metrics_url)
    assert types.get("flashq_kv_cache_usage_ratio") == "gauge", types.get("flashq_kv_cache_usage_ratio")
    models = {dict(l)["model"] for (n, l) in samples if n == "flashq_kv_cache_usage_ratio"}
    assert models == {"kv_attention"}, f"only models with a KV cache have the gauge: {models}"
    c = grpcclient.InferenceServerClient(server.url)
    before = ratio()
    kv_step(c, 90210, 40, start=True)          # 40 tokens: 3 blocks of 16
    during, _ = scrape(server.metrics_url)
    in_use = metric(during, "flashq_kv_cache_blocks_in_use", model="kv_attention")
    total = metric(during, "flashq_kv_cache_blocks_total", model="kv_attention")
    r = metric(during, "flashq_kv_cache_usage_ratio", model="kv_attention")
    assert total > 0 and in_use >= 3 and r == pytest.approx(in_use / total), (r, in_use, total)
    assert 0 < r <= 1 and r - before == pytest.approx(3 / total), (before, r, total)
    kv_step(c, 90210, 0, end=True)
    assert ratio() == pytest.approx(before), "the sequence's blocks went back to the pool"
    c.close()


@pytest.mark.skipif(not shutil.which(PROMETHEUS), reason="prometheus binary not installed (scripts/setup.sh)")
def test_prometheus_scrapes_triton_names_and_kv_ratio(compat, tmp_dir):
    """A real Prometheus parses the whole exposition (a malformed line fails the scrape: up = 0)
    and stores Triton's names and the KV usage ratio with their labels."""
    c = grpcclient.InferenceServerClient(compat.url)
    try:
        with prometheus(compat.metrics_port, tmp_dir) as query:
            kv_step(c, 777, 20, start=True)       # 2 blocks held while Prometheus scrapes
            success = metric(scrape(compat.metrics_url)[0], "nv_inference_request_success", model="kv_attention")
            assert success >= 1
            assert wait_for(lambda: query('up{job="flashq"}'), timeout=60, interval=0.5, what="a scrape") == 1.0
            q = 'nv_inference_request_success{model="kv_attention",version="1"}'
            assert wait_for(lambda: query(q) == success, timeout=30, interval=0.5, what=q)
            ratio = wait_for(lambda: query('flashq_kv_cache_usage_ratio{model="kv_attention"}'), timeout=30,
                             interval=0.5, what="the KV usage ratio in Prometheus")
            assert 0 < ratio <= 1, ratio
            assert query('nv_inference_pending_request_count{model="attention",version="1"}') == 0.0
            assert query('sum(nv_inference_exec_count)') is not None
    finally:
        kv_step(c, 777, 0, end=True)
        c.close()


# ---- perf_analyzer --collect-metrics -----------------------------------------------------------

def write_input_data(path):
    import base64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, 32, 128)).astype(np.float16)
    kv = rng.standard_normal((8, 8, 128)).astype(np.float16)
    b64 = lambda a: {"b64": base64.b64encode(a.tobytes()).decode()}
    path.write_text(json.dumps({"data": [{
        "Q": {"content": b64(q), "shape": [8, 32, 128]}, "K": {"content": b64(kv), "shape": [8, 8, 128]},
        "V": {"content": b64(kv), "shape": [8, 8, 128]},
        "CU_SEQLENS_Q": {"content": [0, 8], "shape": [2]}, "CU_SEQLENS_K": {"content": [0, 8], "shape": [2]}}]}))


def run_pa_collecting(server, metrics_url, tmp_dir):
    data = tmp_dir / "attention.json"
    write_input_data(data)
    csv_path = tmp_dir / "pa.csv"
    cmd = [PERF_ANALYZER, "-i", "grpc", "-u", server.url, "-m", "attention", "--input-data", str(data),
           "--concurrency-range", "1", "--measurement-interval", "1000", "--max-trials", "6",
           "--stability-percentage", "100", "--collect-metrics", "--metrics-url", metrics_url,
           "--metrics-interval", "200", "--verbose-csv", "-f", str(csv_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    print(" ".join(cmd))
    print(text[-3000:])
    assert out.returncode == 0, f"perf_analyzer exit {out.returncode}:\n{text[-3000:]}"
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 1, rows
    return rows[0], text


def per_gpu(cell):
    """perf_analyzer's CSV cell for a GPU metric: 'GPU-a:0.25;GPU-b:0.75;' -> {uuid: value}."""
    out = {}
    for part in filter(None, (cell or "").split(";")):
        uuid, value = part.rsplit(":", 1)
        out[uuid] = float(value)
    return out


def test_perf_analyzer_collects_the_servers_metrics(compat, tmp_dir):
    row, text = run_pa_collecting(compat, compat.metrics_url, tmp_dir)
    assert "Server Prometheus Metrics" in text, text[-2000:]
    assert float(row["Inferences/Second"]) > 0, row
    samples, types = scrape(compat.metrics_url)
    gpus = {dict(l)["gpu_uuid"] for (n, l) in samples if n == "nv_gpu_memory_total_bytes"}
    cols = ["Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory"]
    assert all(c in row for c in cols), sorted(row)
    if not gpus:
        # The CPU backend (or a host without NVML) exports no GPU gauges: perf_analyzer says so
        # and leaves the columns empty; it still measures.
        assert all(not row[c] for c in cols), row
        assert "Unable to parse 'nv_gpu_utilization'" in text, text[-2000:]
        return
    total = per_gpu(row["Total GPU Memory"])
    assert set(total) == gpus, (total, gpus)
    for uuid in gpus:
        assert total[uuid] == metric(samples, "nv_gpu_memory_total_bytes", gpu_uuid=uuid) > 0
        assert 0 <= per_gpu(row["Avg GPU Utilization"])[uuid] <= 1
        assert per_gpu(row["Avg GPU Power Usage"])[uuid] > 0
        assert 0 < per_gpu(row["Max GPU Memory Usage"])[uuid] <= total[uuid]


class _GpuMetricsHandler(http.server.BaseHTTPRequestHandler):
    # The exposition exactly as the server writes its GPU gauges (prometheus-cpp's text format; the
    # unit test GpuMetricsTest.PerfAnalyzersParserReadsEveryGauge pins those lines).
    body = "".join(
        f"# HELP {name} {help}\n# TYPE {name} gauge\n" +
        "".join(f'{name}{{gpu_uuid="{u}"}} {v}\n' for u, v in values)
        for name, help, values in [
            ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", [("GPU-0a", "0.25"), ("GPU-0b", "0.75")]),
            ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes",
             [("GPU-0a", "150754820096"), ("GPU-0b", "150754820096")]),
            ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes",
             [("GPU-0a", "2147483648"), ("GPU-0b", "1073741824")]),
            ("nv_gpu_power_usage", "GPU power usage in watts", [("GPU-0a", "412.5"), ("GPU-0b", "100")]),
        ]).encode()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_perf_analyzer_parses_gpu_gauges_in_the_servers_format(server, tmp_dir):
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _GpuMetricsHandler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        row, text = run_pa_collecting(server, f"http://127.0.0.1:{httpd.server_port}/metrics", tmp_dir)
    finally:
        httpd.shutdown()
    assert "Unable to parse" not in text, text[-2000:]
    assert per_gpu(row["Avg GPU Utilization"]) == {"GPU-0a": 0.25, "GPU-0b": 0.75}, row
    assert per_gpu(row["Avg GPU Power Usage"]) == {"GPU-0a": 412.5, "GPU-0b": 100.0}, row
    assert per_gpu(row["Max GPU Memory Usage"]) == {"GPU-0a": 2147483648.0, "GPU-0b": 1073741824.0}, row
    assert per_gpu(row["Total GPU Memory"]) == {"GPU-0a": 150754820096.0, "GPU-0b": 150754820096.0}, row
