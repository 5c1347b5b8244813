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
import contextlib
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The server process and the request helpers are shared with the other Python suites (tests/pylib).
sys.path.insert(0, str(ROOT / "tests" / "pylib"))
from server_process import READY_LINE, FlashqServer, free_port  # noqa: E402,F401 (tests import them from here)

SERVER_BIN = os.environ.get("FLASHQ_SERVER", str(ROOT / "build/bin/flashq-server"))
DEMO_CACHE = os.environ.get("FLASHQ_DEMO_CACHE", str(ROOT / "build/integration/demo-cache"))
PERF_ANALYZER = os.environ.get("FLASHQ_PERF_ANALYZER", str(ROOT / "scripts/perf_analyzer"))
PROMETHEUS = os.environ.get("FLASHQ_PROMETHEUS") or "prometheus"
TEST_TMP = os.environ.get("FLASHQ_TEST_TMP", str(ROOT / "build/integration/tmp"))
BACKEND = os.environ.get("FLASHQ_TEST_BACKEND", "cpu")
# The first start generates the demo repository; later ones only map it.
READY_TIMEOUT_S = float(os.environ.get("FLASHQ_READY_TIMEOUT", "300"))


class ServerProcess(FlashqServer):
    """A server on the demo repository with the suite's backend."""

    def __init__(self, flags=(), name="server", env=None):
        super().__init__(SERVER_BIN, [f"--demo-cache-dir={DEMO_CACHE}", f"--backend={BACKEND}", *flags], name, TEST_TMP,
                         env=env)

    def start(self, timeout=READY_TIMEOUT_S):
        return super().start(timeout)


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


@contextlib.contextmanager
def prometheus(metrics_port, tmp_dir):
    """A real Prometheus scraping 127.0.0.1:metrics_port every second; yields query(expr): the
    first result's value, or None while there is none (or it is not finite). Its log is printed
    if it exits with an error."""
    port = free_port()
    cfg = tmp_dir / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: flashq
    static_configs:
      - targets: ['127.0.0.1:{metrics_port}']
""")
    log = open(tmp_dir / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_dir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)

    def query(expr):
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=5).read())
        except OSError:
            return None
        res = body.get("data", {}).get("result", [])
        if body.get("status") != "success" or not res:
            return None
        v = float(res[0]["value"][1])
        return v if math.isfinite(v) else None

    try:
        yield query
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
        if prom.returncode not in (0, -15):
            print((tmp_dir / "prometheus.log").read_text()[-3000:])
