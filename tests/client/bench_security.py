#!/usr/bin/env python3
"""flashq-bench against secured flashq-servers, with certificates made by openssl at test
time (a CA, a server certificate for 127.0.0.1 and localhost, a client certificate):

  - token only (plaintext): a run with -H 'authorization: Bearer <token>' passes, through a
    byte-counting TCP proxy, once as --input-data and uncompressed and once gzip-compressed;
    the gzip run sends far fewer bytes per request. A wrong or missing token exits non-zero
    and shows the server's UNAUTHENTICATED message.
  - TLS (--tls-cert/--tls-key): a run with --ssl-grpc-use-ssl and the CA passes (by the name
    localhost); a plaintext client fails with a hint to use TLS.
  - mutual TLS and a token (--tls-ca, --auth-token-file): a run with the client certificate and
    the token passes; without the client certificate, or with a wrong token, it fails with a
    clear message.

A passing run must exit 0 and its JSON report must show requests, no errors and the
security, compression and header names used (never the token).

    bench_security.py FLASHQ_BENCH FLASHQ_SERVER WORK_DIR [flashq-server arguments...]
"""
import base64
import json
import pathlib
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "pylib"))
from server_process import FlashqServer  # noqa: E402

TOKEN = "bench-test-token.0123"
# A short closed-loop run: one load point, small windows.
RUN = ["--concurrency=2", "--window=0.4", "--warmup=0.2", "--max-time=1.5", "--min-requests=3", "--no-plot",
       "--progress=off"]


def sh(*args, cwd):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=flashq test CA",
       cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        sh("openssl", "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext)
        sh("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
           "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    (d / "token").write_text(TOKEN + "\n")


class Server(FlashqServer):
    """A flashq-server with TLS or a token, as a context manager. It is ready at its log line:
    the plaintext gRPC probe cannot reach a TLS port."""

    def __init__(self, binary, work, name, flags):
        super().__init__(binary, flags, name, work)

    @property
    def port(self):
        return self.grpc_port

    def __enter__(self):
        return self.start(timeout=180, probe=False)

    def __exit__(self, *exc):
        self.stop()

    def requests(self, model):
        """Requests the server finished for `model`, any status (its Prometheus counter)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("flashq_requests_total{") and f'model="{model}"' in line)


class Proxy:
    """Forwards one local port to the server and counts the bytes going to the server."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.upstream_bytes = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src, dst, upstream):
        try:
            while data := src.recv(1 << 16):
                if upstream:
                    with self.lock:
                        self.upstream_bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def bench(binary, work, name, args):
    """Runs flashq-bench; returns (exit status, output, JSON report or None)."""
    out_dir = work / "results"
    report = out_dir / f"{name}.json"
    report.unlink(missing_ok=True)
    cmd = [binary, *RUN, f"--output-dir={out_dir}", f"--name={name}", *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(f"--- {name} ({time.monotonic() - t0:.1f} s, exit {p.returncode}): {' '.join(cmd)}\n{p.stdout}", flush=True)
    return p.returncode, p.stdout, json.loads(report.read_text()) if report.exists() else None


class Checks:
    def __init__(self):
        self.problems = []

    def passed(self, name, result, security, compression="none", headers=("authorization",)):
        rc, out, report = result
        if rc != 0:
            self.problems.append(f"{name}: flashq-bench exited {rc}")
            return
        if report is None:
            self.problems.append(f"{name}: no JSON report")
            return
        if TOKEN in json.dumps(report):
            self.problems.append(f"{name}: the token appears in the report")
        for key, want in (("security", security), ("compression", compression), ("headers", list(headers))):
            if report.get(key) != want:
                self.problems.append(f"{name}: report {key} is {report.get(key)!r}, not {want!r}")
        for s in report["scenarios"]:
            if s.get("error"):
                self.problems.append(f"{name}: {s['error']}")
            for p in s.get("points", []):
                if p.get("error_count") or p.get("warmup_errors") or not p.get("requests"):
                    self.problems.append(f"{name}: {p.get('requests')} requests, {p.get('error_count')} errors "
                                         f"({p.get('errors')}), {p.get('warmup_errors')} in warm-up")

    def failed(self, name, result, *messages):
        rc, out, _ = result
        if rc == 0:
            self.problems.append(f"{name}: flashq-bench exited 0; expected a failure")
        for m in messages:
            if m not in out:
                self.problems.append(f"{name}: the output lacks {m!r}")


def attention_data(path):
    """Two requests of zeros and ones (compressible): 24 tokens as raw FP16 bytes with two
    sequences, and 8 tokens as a value list."""
    hq, hkv, d = 8, 2, 64
    ones = lambda n: {"b64": base64.b64encode(struct.pack(f"<{n}e", *([1.0] * 8 + [0.0] * (n - 8)))).decode()}
    zeros = lambda n: [0.0] * n
    path.write_text(json.dumps({"data": [
        {"Q": {"content": ones(24 * hq * d), "shape": [24, hq, d]},
         "K": {"content": ones(24 * hkv * d), "shape": [24, hkv, d]},
         "V": {"content": ones(24 * hkv * d), "shape": [24, hkv, d]},
         "CU_SEQLENS_Q": {"content": [0, 10, 24], "shape": [3]},
         "CU_SEQLENS_K": {"content": [0, 10, 24], "shape": [3]}},
        {"Q": {"content": zeros(8 * hq * d), "shape": [8, hq, d]},
         "K": {"content": zeros(8 * hkv * d), "shape": [8, hkv, d]},
         "V": {"content": zeros(8 * hkv * d), "shape": [8, hkv, d]}}]}))
    return 16 * (hq + 2 * hkv) * d * 2  # mean raw tensor bytes per request


def main():
    bench_bin, server_bin, work, server_args = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)
    pki = work / "pki"
    make_pki(pki)
    data = work / "attention.json"
    raw_bytes = attention_data(data)
    c = Checks()
    bearer = ["-H", f"authorization: Bearer {TOKEN}"]
    tls = ["--ssl-grpc-use-ssl", f"--ssl-grpc-root-certifications-file={pki / 'ca.pem'}"]
    client_cert = [f"--ssl-grpc-private-key-file={pki / 'client.key'}",
                   f"--ssl-grpc-certificate-chain-file={pki / 'client.pem'}"]
    t0 = time.monotonic()

    with Server(server_bin, work, "token", [*server_args, f"--auth-token-file={pki / 'token'}"]) as s:
        proxy = Proxy(s.port)
        per_request = {}
        for comp in ("none", "gzip"):
            before_bytes, before_requests = proxy.upstream_bytes, s.requests("attention")
            r = bench(bench_bin, work, f"token-input-data-{comp}",
                      [f"--endpoints=127.0.0.1:{proxy.port}", "--model=attention", f"--input-data={data}",
                       f"--grpc-compression-algorithm={comp}", *bearer])
            c.passed(f"token, --input-data, {comp}", r, "plaintext", comp)
            requests = s.requests("attention") - before_requests
            per_request[comp] = (proxy.upstream_bytes - before_bytes) / max(requests, 1)
            if r[2] and "2 requests from" not in r[2]["scenarios"][0].get("description", ""):
                c.problems.append(f"--input-data: the scenario is {r[2]['scenarios'][0].get('description')!r}")
        print(f"bytes to the server per request: {per_request} (tensors: {raw_bytes})")
        if per_request["none"] < raw_bytes:
            c.problems.append(f"uncompressed: {per_request['none']:.0f} bytes per request, under the tensors' {raw_bytes}")
        if per_request["gzip"] > 0.25 * per_request["none"]:
            c.problems.append(f"gzip: {per_request['gzip']:.0f} bytes per request, not well under "
                              f"{per_request['none']:.0f} uncompressed")
        ep = [f"--endpoints=127.0.0.1:{s.port}", "--model=attention"]
        c.failed("token: wrong", bench(bench_bin, work, "token-wrong", [*ep, "-H", "authorization: Bearer nope"]),
                 "UNAUTHENTICATED: the bearer token is not valid for this server")
        c.failed("token: none", bench(bench_bin, work, "token-none", ep),
                 "UNAUTHENTICATED: this server requires a token")

    with Server(server_bin, work, "tls", [*server_args, f"--tls-cert={pki / 'server.pem'}",
                                          f"--tls-key={pki / 'server.key'}"]) as s:
        c.passed("TLS", bench(bench_bin, work, "tls", [f"--endpoints=localhost:{s.port}", "--model=attention", *tls]),
                 "tls", headers=())
        c.failed("TLS: plaintext client",
                 bench(bench_bin, work, "tls-plaintext", [f"--endpoints=127.0.0.1:{s.port}", "--model=attention"]),
                 "if the server serves TLS, add --ssl-grpc-use-ssl")

    with Server(server_bin, work, "mtls", [*server_args, f"--tls-cert={pki / 'server.pem'}",
                                           f"--tls-key={pki / 'server.key'}", f"--tls-ca={pki / 'ca.pem'}",
                                           f"--auth-token-file={pki / 'token'}"]) as s:
        ep = [f"--endpoints=127.0.0.1:{s.port}", "--model=attention"]
        c.passed("mTLS and token", bench(bench_bin, work, "mtls", [*ep, *tls, *client_cert, *bearer]), "mutual tls")
        c.failed("mTLS: no client certificate", bench(bench_bin, work, "mtls-no-cert", [*ep, *tls, *bearer]),
                 "not ready after", "a server that requires mutual TLS also needs --ssl-grpc-private-key-file")
        c.failed("mTLS: wrong token",
                 bench(bench_bin, work, "mtls-wrong-token", [*ep, *tls, *client_cert, "-H", "authorization: Bearer x"]),
                 "UNAUTHENTICATED: the bearer token is not valid for this server")

    if c.problems:
        print("bench_security: FAILED:\n  " + "\n  ".join(c.problems))
        return 1
    print(f"bench_security: passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    if shutil.which("openssl") is None:
        print("bench_security: skipped: openssl not installed")
        sys.exit(77)
    sys.exit(main())
