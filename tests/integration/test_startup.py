"""Start-up and shutdown of the real server process. Runs first (a ctest fixture):
its first start generates the demo repository into the shared cache folder. Every
flag that --help lists parses with its documented default, rejects a bad value, and
the server starts with all of them given at once."""
import glob
import os
import re
import signal
import subprocess
import time

import pytest

import tritonclient.grpc as grpcclient

from conftest import DEMO_CACHE, SERVER_BIN, ServerProcess

DEMO_MODELS = ["attention", "kv_attention", "up_proj_bf16", "down_proj_bf16", "up_proj_int4",
               "down_proj_int4", "up_proj_fp8", "down_proj_fp8"]
FLAGS = ["--http-port", "--http-thread-count", "--grpc-port", "--metrics-port", "--host", "--model-repository", "--demo-cache-dir", "--backend",
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


def help_flags():
    """{name: (kind, default, range)} for every flag in --help ("  --name (default VALUE)", or
    "(default VALUE, LO..HI)" for an integer with a range); kind is str (quoted default), bool or int."""
    out = subprocess.run([SERVER_BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    flags = {}
    for name, default in re.findall(r"^  --([a-z0-9-]+) \(default (.*)\)$", out.stdout, re.M):
        if default.startswith('"'):
            flags[name] = (str, default[1:-1], None)
        elif default in ("true", "false"):
            flags[name] = (bool, default, None)
        else:
            m = re.fullmatch(r"(-?[0-9]+)(?:, (-?[0-9]+)\.\.(-?[0-9]+))?", default)
            assert m, f"--{name}: default {default!r} is neither quoted nor a number"
            rng = (int(m.group(2)), int(m.group(3))) if m.group(2) else None
            if rng:
                assert rng[0] <= int(m.group(1)) <= rng[1], f"--{name}: default {m.group(1)} outside {rng}"
            flags[name] = (int, m.group(1), rng)
    assert len(flags) >= len(FLAGS), f"parsed only {sorted(flags)} from --help"
    return flags


HELP_FLAGS = help_flags()


def parse_only(*args):
    """Runs flashq-server with args that end in a bad integer, so that it exits right after
    parsing: (exit code, stderr). A flag that parsed names nothing; the bad one is named."""
    out = subprocess.run([SERVER_BIN, *args], capture_output=True, text=True, timeout=30)
    return out.returncode, out.stderr


@pytest.mark.parametrize("name", sorted(HELP_FLAGS))
def test_every_help_flag_parses_with_its_default_and_rejects_bad_values(name):
    kind, default, rng = HELP_FLAGS[name]
    stop = "--metrics-port=x" if name != "metrics-port" else "--grpc-port=x"
    stop_name = stop.split("=")[0]
    # The documented default parses: the run stops at the bad flag after it, not at this one.
    for form in ([f"--{name}={default}"], [f"--{name}", default] if kind is not bool else [f"--{name}"]):
        code, err = parse_only(*form, stop)
        assert code == 2 and f"{stop_name} expects an integer" in err, (form, code, err)
    # A value of the wrong kind is rejected and names this flag.
    if kind is not str:
        code, err = parse_only(f"--{name}=not-a-{kind.__name__}")
        assert code == 2 and f"--{name} expects" in err, (name, code, err)
    # The ends of a documented range parse; one past either end is refused, naming the flag and the range.
    if rng:
        for v in rng:
            code, err = parse_only(f"--{name}={v}", stop)
            assert code == 2 and f"{stop_name} expects an integer" in err, (name, v, code, err)
        for v in (rng[0] - 1, rng[1] + 1):
            if not -2 ** 63 <= v < 2 ** 63:
                continue  # past int64 itself: "expects an integer", checked above
            code, err = parse_only(f"--{name}={v}")
            assert code == 2 and f"--{name}={v} is out of range" in err and f"{rng[0]}..{rng[1]}" in err, (name, v, err)


def test_server_starts_with_every_help_flag_at_its_default():
    """Every flag in --help given explicitly with its documented default (the listening
    address, ports, demo cache and backend take this test's values instead): the server
    starts, serves and stops cleanly."""
    own = {"host", "grpc-port", "metrics-port", "http-port", "demo-cache-dir", "backend"}  # set by ServerProcess
    # An explicitly empty --auth-token is refused (it would turn authentication off without a word;
    # reliability.defects checks that): its default is given by leaving it out.
    unset = {"auth-token"}
    flags = [f"--{n}={d}" for n, (_, d, _) in sorted(HELP_FLAGS.items()) if n not in own | unset]
    s = ServerProcess(flags, name="all-defaults").start()
    try:
        c = grpcclient.InferenceServerClient(s.url)
        assert c.is_server_ready()
        for m in DEMO_MODELS:
            assert c.is_model_ready(m), f"demo model {m} not ready"
        given = {a.split("=")[0] for a in s.cmd[1:]}
        want = {f"--{n}" for n in HELP_FLAGS if n not in unset}
        assert given >= want, sorted(want - given)
    finally:
        s.assert_clean_stop(signal.SIGTERM)
