"""Start-up and shutdown of the real server process. Runs first (a ctest fixture):
its first start generates the demo repository into the shared cache folder."""
import glob
import os
import signal
import subprocess
import time

import tritonclient.grpc as grpcclient

from conftest import DEMO_CACHE, SERVER_BIN, ServerProcess

DEMO_MODELS = ["attention", "kv_attention", "up_proj_bf16", "down_proj_bf16", "up_proj_int4",
               "down_proj_int4", "up_proj_fp8", "down_proj_fp8"]
FLAGS = ["--grpc-port", "--metrics-port", "--host", "--model-repository", "--demo-cache-dir", "--backend",
         "--max-queue-delay-us", "--max-queue-size", "--max-batch-tokens", "--grpc-max-message-bytes",
         "--kv-cache-blocks", "--batch-invariant"]


def test_help_lists_flags():
    out = subprocess.run([SERVER_BIN, "--help"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    missing = [f for f in FLAGS if f.lstrip("-") not in text]
    assert not missing, f"--help does not document {missing}:\n{text[:3000]}"


def test_first_start_generates_demo_repository():
    t0 = time.monotonic()
    s = ServerProcess(name="startup").start()
    try:
        first = time.monotonic() - t0
        c = grpcclient.InferenceServerClient(s.url)
        assert c.is_server_live() and c.is_server_ready()
        for m in DEMO_MODELS:
            assert c.is_model_ready(m), f"demo model {m} not ready"
        files = glob.glob(os.path.join(DEMO_CACHE, "**", "*.safetensors"), recursive=True)
        assert files, f"no safetensors files under {DEMO_CACHE}"
        configs = glob.glob(os.path.join(DEMO_CACHE, "**", "config.pbtxt"), recursive=True)
        assert len(configs) >= len(DEMO_MODELS), f"config.pbtxt files under {DEMO_CACHE}: {configs}"
    finally:
        s.assert_clean_stop(signal.SIGTERM)
    print(f"first start (demo repository generation included): {first:.1f}s")


def test_restart_reuses_cache_and_sigint_exits_0():
    t0 = time.monotonic()
    s = ServerProcess(name="restart").start()
    second = time.monotonic() - t0
    try:
        assert grpcclient.InferenceServerClient(s.url).is_server_ready()
    finally:
        s.assert_clean_stop(signal.SIGINT)
    print(f"second start (cached demo repository): {second:.1f}s")
    assert second < 60, f"start with a cached demo repository took {second:.1f}s"


def test_bad_flag_fails():
    out = subprocess.run([SERVER_BIN, "--no-such-flag=1"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
