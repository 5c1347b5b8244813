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


def run_pa(args, tmp_dir, timeout=240):
    csv_path = tmp_dir / "pa.csv"
    cmd = [PERF_ANALYZER, *args, *COMMON, "-f", str(csv_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    text = out.stdout + out.stderr
    print(" ".join(cmd))
    print(text[-4000:])
    assert out.returncode == 0, f"perf_analyzer exit {out.returncode}:\n{text[-4000:]}"
    rows = list(csv.DictReader(open(csv_path)))
    return rows, text


def test_attention_concurrency_sweep(server, tmp_dir):
    rows, text = run_pa(["-i", "grpc", "-u", server.url, "-m", "attention",
                         "--shape", "Q:64,32,128", "--shape", "K:64,8,128", "--shape", "V:64,8,128",
                         "--concurrency-range", "1:4:2"], tmp_dir)
    assert "Throughput" in text
    assert [int(r["Concurrency"]) for r in rows] == [1, 3], rows
    for r in rows:
        assert float(r["Inferences/Second"]) > 0, r
        assert float(r["p99 latency"]) >= float(r["p50 latency"]) > 0, r


def test_linear_layer_with_input_data(server, tmp_dir):
    """A linear layer, with X given as base64 raw bytes (perf_analyzer cannot generate
    random BF16 data itself)."""
    model = "up_proj_bf16"
    md = grpcclient.InferenceServerClient(server.url).get_model_metadata(model, as_json=True)
    dtype = next(i["datatype"] for i in md["inputs"] if i["name"] == "X")
    x = np.random.default_rng(0).standard_normal((4, 4096)).astype(np.float32)
    raw = (x.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else x.astype(np.float16).tobytes()
    data = tmp_dir / "x.json"
    data.write_text(json.dumps({"data": [{"X": {"content": {"b64": base64.b64encode(raw).decode()},
                                               "shape": [4, 4096]}}]}))
    rows, text = run_pa(["-i", "grpc", "-u", server.url, "-m", model, "--input-data", str(data),
                         "--shape", "X:4,4096", "--concurrency-range", "1:2"], tmp_dir)
    assert len(rows) == 2 and all(float(r["Inferences/Second"]) > 0 for r in rows), rows
