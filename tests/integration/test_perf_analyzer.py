"""Triton's perf_analyzer (the binary from the tritonclient wheel, through
scripts/perf_analyzer) runs short concurrency sweeps against the server. It reads
ModelMetadata and ModelConfig first, so this also checks that those answers are what
Triton's tools expect."""
import base64
import csv
import json
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import PERF_ANALYZER

COMMON = ["--measurement-interval", "1000", "--max-trials", "6", "--stability-percentage", "100",
          "--percentile", "99"]


def run_pa(args, tmp_dir, timeout=240, common=COMMON):
    csv_path = tmp_dir / "pa.csv"
    cmd = [PERF_ANALYZER, *args, *common, "-f", str(csv_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = out.stdout + out.stderr
    print(" ".join(cmd))
    print(text[-4000:])
    assert out.returncode == 0, f"perf_analyzer exit {out.returncode}:\n{text[-4000:]}"
    rows = list(csv.DictReader(open(csv_path)))
    return rows, text


def b64(a):
    return {"b64": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_attention_concurrency_sweep(server, tmp_dir, protocol):
    """Two sequences per request (24 and 40 tokens), over gRPC and over HTTP (binary tensors).
    perf_analyzer asks for data for the optional CU_SEQLENS inputs when it generates random
    data, and random INT32 would not be valid cu_seqlens, so the tensors are given as
    --input-data."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 32, 128)).astype(np.float16)
    kv = rng.standard_normal((64, 8, 128)).astype(np.float16)
    data = tmp_dir / "attention.json"
    data.write_text(json.dumps({"data": [{
        "Q": {"content": b64(q), "shape": [64, 32, 128]},
        "K": {"content": b64(kv), "shape": [64, 8, 128]},
        "V": {"content": b64(kv), "shape": [64, 8, 128]},
        "CU_SEQLENS_Q": {"content": [0, 24, 64], "shape": [3]},
        "CU_SEQLENS_K": {"content": [0, 24, 64], "shape": [3]}}]}))
    url = server.url if protocol == "grpc" else server.http_url
    rows, text = run_pa(["-i", protocol, "-u", url, "-m", "attention", "--input-data", str(data),
                         "--concurrency-range", "1:4:2"], tmp_dir)
    assert "Throughput" in text
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 3], rows   # the CSV is sorted by throughput
    for r in rows:
        assert float(r["Inferences/Second"]) > 0, r
        assert float(r["p99 latency"]) >= float(r["p50 latency"]) > 0, r


def test_linear_layer_with_input_data(server, tmp_dir):
    """A linear layer, with X given as base64 raw bytes (perf_analyzer cannot generate
    random BF16 data itself). The CPU backend takes about a second per request here, so
    measurement windows count requests instead of milliseconds."""
    model = "up_proj_bf16"
    md = grpcclient.InferenceServerClient(server.url).get_model_metadata(model, as_json=True)
    dtype = next(i["datatype"] for i in md["inputs"] if i["name"] == "X")
    x = np.random.default_rng(0).standard_normal((2, 4096)).astype(np.float32)
    raw = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else x.astype(np.float16).tobytes()
    data = tmp_dir / "x.json"
    data.write_text(json.dumps({"data": [{"X": {"content": {"b64": base64.b64encode(raw).decode()},
                                               "shape": [2, 4096]}}]}))
    rows, text = run_pa(["-i", "grpc", "-u", server.url, "-m", model, "--input-data", str(data),
                         "--concurrency-range", "1:2"], tmp_dir,
                        common=["--measurement-mode", "count_windows", "--measurement-request-count", "3",
                                "--max-trials", "3", "--stability-percentage", "100", "--percentile", "99"])
    assert len(rows) == 2 and all(float(r["Inferences/Second"]) > 0 for r in rows), rows
