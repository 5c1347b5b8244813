"""One flashq-server process on free loopback ports: what the integration suite's fixtures
(tests/integration/conftest.py), the reliability suite (tests/reliability/rel.py), the conformance
test (tests/server_gpu/test_cuda_server.py) and tests/client/bench_security.py start, each with its
own default flags. No pytest here: the conformance test runs without it on a host with a GPU."""
import os
import signal
import socket
import subprocess
import tempfile
import time

READY_LINE = "flashq-server ready"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlashqServer:
    """start() waits for the ready line (then for the gRPC port, with probe); stop() sends a
    signal (SIGTERM) and returns the exit code, or "hung". As a context manager it starts the
    server and, unless the block raised, asserts that it exits 0 on SIGTERM."""

    def __init__(self, binary, flags, name, tmp_dir, env=None):
        os.makedirs(tmp_dir, exist_ok=True)
        self.grpc_port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
        self.log_path = tempfile.mktemp(prefix=f"{name}-", suffix=".log", dir=str(tmp_dir))
        self.cmd = [str(binary), f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                    f"--http-port={self.http_port}", "--host=127.0.0.1", *flags]
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.returncode = None

    @property
    def url(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self):
        """host:port of the HTTP/REST endpoint, as tritonclient.http and perf_analyzer -u take it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self):
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self, tail=60):
        try:
            return "\n".join(open(self.log_path, errors="replace").read().splitlines()[-tail:])
        except OSError:
            return ""

    def start(self, timeout=120, probe=True):
        assert os.path.exists(self.cmd[0]), f"{self.cmd[0]} not built"
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"flashq-server exited with {self.proc.returncode} before ready:\n"
                                     f"{' '.join(self.cmd)}\n{self.log()}")
            if READY_LINE in open(self.log_path, errors="replace").read():
                break
            time.sleep(0.05)
        else:
            self.proc.kill()
            raise AssertionError(f"flashq-server not ready after {timeout}s:\n{self.log()}")
        if probe:  # the ready line comes once the gRPC port is open; confirm over the wire too
            import grpc  # here, so that stdlib-only scripts can start servers with probe=False
            ch = grpc.insecure_channel(self.url)
            grpc.channel_ready_future(ch).result(timeout=30)
            ch.close()
        return self

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc is None or self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = "hung"
        self._logf.close()
        return self.returncode

    def assert_clean_stop(self, sig=signal.SIGTERM):
        code = self.stop(sig)
        assert code == 0, f"flashq-server exit code {code} after {sig!r} (expected 0):\n{self.log()}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if exc[0] is None:
            self.assert_clean_stop()
        else:
            self.stop()
