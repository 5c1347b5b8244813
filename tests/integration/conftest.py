"""Shared fixtures: a real flashq-server process on free loopback ports.

Environment (set by tests/integration/CMakeLists.txt; defaults fit a checkout
built into build/):
  FLASHQ_SERVER        path of flashq-server
  FLASHQ_DEMO_CACHE    demo repository cache folder, shared by all servers so the
                       demo weights are generated once (by test_startup.py)
  FLASHQ_PERF_ANALYZER wrapper that runs perf_analyzer (scripts/perf_analyzer)
  FLASHQ_PROMETHEUS    the prometheus binary
  FLASHQ_TEST_TMP      where server logs and temp folders go
  FLASHQ_TEST_BACKEND  the servers' backend (default cpu; cuda runs the same checks on a GPU)
"""
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time

import grpc
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER_BIN = os.environ.get("FLASHQ_SERVER", str(ROOT / "build/bin/flashq-server"))
DEMO_CACHE = os.environ.get("FLASHQ_DEMO_CACHE", str(ROOT / "build/integration/demo-cache"))
PERF_ANALYZER = os.environ.get("FLASHQ_PERF_ANALYZER", str(ROOT / "scripts/perf_analyzer"))
PROMETHEUS = os.environ.get("FLASHQ_PROMETHEUS") or "prometheus"
TEST_TMP = os.environ.get("FLASHQ_TEST_TMP", str(ROOT / "build/integration/tmp"))
BACKEND = os.environ.get("FLASHQ_TEST_BACKEND", "cpu")
READY_LINE = "flashq-server ready"
# The first start generates the demo repository; later ones only map it.
READY_TIMEOUT_S = float(os.environ.get("FLASHQ_READY_TIMEOUT", "300"))
STOP_TIMEOUT_S = 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One flashq-server process. start() waits for readiness; stop() sends SIGTERM
    and returns the exit code (the fixtures assert it is 0)."""

    def __init__(self, flags=(), name="server"):
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        os.makedirs(TEST_TMP, exist_ok=True)
        self.log_path = tempfile.mktemp(prefix=f"{name}-", suffix=".log", dir=TEST_TMP)
        self.cmd = [SERVER_BIN, f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                    "--host=127.0.0.1", f"--demo-cache-dir={DEMO_CACHE}", f"--backend={BACKEND}", *flags]
        self.proc = None
        self.returncode = None

    @property
    def url(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self):
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self, tail=60):
        try:
            lines = open(self.log_path, errors="replace").read().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def start(self, timeout=READY_TIMEOUT_S):
        assert os.path.exists(SERVER_BIN), f"{SERVER_BIN} not built"
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"flashq-server exited with {self.proc.returncode} before ready:\n"
                                     f"{' '.join(self.cmd)}\n{self.log()}")
            if READY_LINE in open(self.log_path, errors="replace").read():
                break
            time.sleep(0.1)
        else:
            self.proc.kill()
            raise AssertionError(f"flashq-server not ready after {timeout}s:\n{self.log()}")
        # The ready line comes once the gRPC port is open; confirm over the wire too.
        ch = grpc.insecure_channel(self.url)
        grpc.channel_ready_future(ch).result(timeout=30)
        ch.close()
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None or self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = "hung"
        self._logf.close()
        return self.returncode

    def assert_clean_stop(self, sig=signal.SIGTERM):
        code = self.stop(sig)
        assert code == 0, f"flashq-server exit code {code} after {sig!r} (expected 0):\n{self.log()}"


@pytest.fixture(scope="session")
def start_server():
    """Factory: start_server(flags...) starts a server with extra flags; every server
    it started is stopped with SIGTERM at the end of the session, asserting exit 0."""
    servers = []

    def _start(*flags, name="server"):
        s = ServerProcess(flags, name=name)
        servers.append(s)
        return s.start()

    yield _start
    bad = []
    for s in servers:
        code = s.stop()
        if code != 0:
            bad.append(f"{' '.join(s.cmd)} -> exit {code}\n{s.log(30)}")
    assert not bad, "servers did not exit 0 on SIGTERM:\n" + "\n\n".join(bad)


@pytest.fixture(scope="session")
def server(start_server):
    """The default server on the demo repository."""
    return start_server(name="default")


@pytest.fixture
def tmp_dir():
    os.makedirs(TEST_TMP, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TEST_TMP) as d:
        yield pathlib.Path(d)
