"""/metrics and /healthz while other connections misbehave, against a real flashq-server.
Kubernetes probes and the HPA's scrapes depend on this port, so a well-behaved request
must be answered within 1 s:
  (a) while 20 connections are open and send nothing;
  (b) while 500 slowloris connections each trickle a byte every 0.5 s (and reconnect when
      the server closes them), 10 rounds of a scrape and a /healthz probe.
Loopback only."""
import errno
import resource
import socket
import threading
import time

import rel
from rel import Server

HOST = "127.0.0.1"
PROBE_TIMEOUT_S = 1.0


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n, "need more file descriptors for this test"


def http_get(port, path, timeout=PROBE_TIMEOUT_S):
    """One GET within `timeout` in all (connect, send, read). Returns (status, body, seconds)."""
    t0 = time.monotonic()

    def left():
        r = timeout - (time.monotonic() - t0)
        if r <= 0:
            raise TimeoutError(f"GET {path}: no complete answer within {timeout} s")
        return r

    with socket.create_connection((HOST, port), timeout=left()) as s:
        s.settimeout(left())
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        data = b""
        while True:
            s.settimeout(left())
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return status, body, time.monotonic() - t0


def probe(port, path):
    """(ok, seconds or error) for one probe with the 1 s budget."""
    try:
        status, body, took = http_get(port, path)
    except OSError as e:  # TimeoutError included
        return False, repr(e)
    if status != 200 or not body:
        return False, f"status {status}, {len(body)} body bytes"
    return True, took


class Slowloris:
    """n connections, each sending a request head one byte every `interval` s, never
    finishing it; a connection the server closes is opened again. One thread, non-blocking
    sockets, bounded by `max_s`."""

    def __init__(self, port, n, interval=0.5, max_s=60.0):
        self.port, self.n, self.interval, self.max_s = port, n, interval, max_s
        self.socks = [None] * n
        self.connects = 0
        self.bytes_sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((HOST, self.port))  # EINPROGRESS; completes in the background
        self.socks[i] = [s, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", 0]
        self.connects += 1

    def _close(self, i):
        if self.socks[i] is not None:
            self.socks[i][0].close()
            self.socks[i] = None

    def _tick(self, i):
        if self.socks[i] is None:
            self._open(i)
            return
        s, head, off = self.socks[i]
        try:
            if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                self._close(i)  # the server closed it: come back
                self._open(i)
                return
        except BlockingIOError:
            pass  # open, nothing to read: as it should be
        except OSError:
            self._close(i)
            self._open(i)
            return
        try:
            byte = head[off:off + 1] if off < len(head) else b"a"
            if s.send(byte) == 1:
                self.socks[i][2] = off + 1
                self.bytes_sent += 1
        except BlockingIOError:
            pass  # still connecting
        except OSError as e:
            if e.errno not in (errno.ENOTCONN, errno.EAGAIN):
                self._close(i)
                self._open(i)

    def _run(self):
        t_end = time.monotonic() + self.max_s
        slices = 10  # each tick serves a tenth of the connections
        k = 0
        while not self.stop.is_set() and time.monotonic() < t_end:
            for i in range(k % slices, self.n, slices):
                self._tick(i)
            k += 1
            time.sleep(self.interval / slices)
        for i in range(self.n):
            self._close(i)

    def open_count(self):
        return sum(1 for s in self.socks if s is not None)

    def __enter__(self):
        for i in range(self.n):
            self._open(i)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)


def test_scrape_with_idle_connections_open():
    with Server(name="metrics-idle") as srv:
        idle = [socket.create_connection((HOST, srv.metrics_port), timeout=5) for _ in range(20)]
        try:
            time.sleep(0.2)
            results = [probe(srv.metrics_port, "/metrics") for _ in range(3)]
        finally:
            for s in idle:
                s.close()
        rel.record("metrics_idle", {"idle_connections": 20, "probes": [r[1] for r in results]})
        print(f"20 idle connections: probes {results}")
        bad = [r for r in results if not r[0]]
        assert not bad, f"{len(bad)} of {len(results)} scrapes failed the 1 s budget with 20 idle connections: {results}"


def test_scrape_and_healthz_under_slowloris():
    raise_fd_limit(2048)
    with Server(name="metrics-slowloris") as srv:
        with Slowloris(srv.metrics_port, 500, interval=0.5, max_s=40) as attack:
            time.sleep(2.5)  # all connected and trickling; the first ones reached the head deadline
            results = []
            for _ in range(10):
                for path in ("/metrics", "/healthz"):
                    results.append((path, *probe(srv.metrics_port, path)))
                time.sleep(0.2)
            still_open, connects, sent = attack.open_count(), attack.connects, attack.bytes_sent
        rel.record("metrics_slowloris", {"connections": 500, "connects": connects, "bytes_trickled": sent,
                                         "probes": [r[2] for r in results]})
        ok = [r for r in results if r[1]]
        worst = max((r[2] for r in ok), default=float("nan"))
        print(f"500 slowloris connections ({connects} connects, {sent} bytes trickled): {len(ok)} of {len(results)} "
              f"probes answered within 1 s, slowest {worst:.3f} s")
        assert still_open == 500 and connects >= 500, "the slow clients were not running"
        bad = [r for r in results if not r[1]]
        assert not bad, f"{len(bad)} of {len(results)} probes failed the 1 s budget under slowloris: {bad}"
        assert srv.proc.poll() is None, srv.log()
