"""TLS, mutual TLS and bearer-token auth (docs/security.md). Certificates are made with
openssl at test time: CA A signs the server and a good client; CA B signs an impostor.
  - TLS: a client trusting CA A succeeds; one trusting only CA B, or speaking plaintext, fails.
  - mTLS (--tls-ca): no client certificate, or one from CA B, is refused in the handshake.
  - token: missing or wrong -> UNAUTHENTICATED on inference and administrative RPCs;
    the right one succeeds; probes (live, ready, model ready, grpc.health.v1) stay open.
  - bad flag combinations stop the server at start with exit code 2."""
import shutil
import subprocess

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2

import rel
from rel import C, Server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")

TOKEN = "s3cr3t-token.for_tests"


def sh(*args, cwd):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=flashq test {name}", cwd=d)


def make_cert(d, name, ca, ext):
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    sh("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
       "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca_a")
    make_ca(d, "ca_b")
    make_cert(d, "server", "ca_a", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    make_cert(d, "client", "ca_a", "extendedKeyUsage=clientAuth\n")
    make_cert(d, "impostor", "ca_b", "extendedKeyUsage=clientAuth\n")
    return d


def read(d, name):
    return (d / name).read_bytes()


def creds(pki, ca="ca_a", client=None):
    kw = {"root_certificates": read(pki, f"{ca}.pem")}
    if client:
        kw.update(private_key=read(pki, f"{client}.key"), certificate_chain=read(pki, f"{client}.pem"))
    return grpc.ssl_channel_credentials(**kw)


def live(url, credentials=None, timeout=10, metadata=None):
    """ServerLive over a fresh channel: returns the status code."""
    ch = rel.channel(url, credentials=credentials)
    try:
        rel.stub(ch).ServerLive(service_pb2.ServerLiveRequest(), timeout=timeout, metadata=metadata)
        return C.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        ch.close()


def infer(url, credentials=None, metadata=None, timeout=30):
    ch = rel.channel(url, credentials=credentials)
    try:
        rel.stub(ch).ModelInfer(rel.lin_req(np.random.default_rng(0), m=2), timeout=timeout, metadata=metadata)
        return C.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()
    finally:
        ch.close()


def tls_server(pki, *flags, name):
    s = Server(f"--tls-cert={pki / 'server.pem'}", f"--tls-key={pki / 'server.key'}", *flags, name=name)
    return s.start(probe=False)


def test_tls_right_ca_succeeds_wrong_ca_and_plaintext_fail(pki):
    srv = tls_server(pki, name="tls")
    try:
        assert "(TLS)" in srv.log()
        assert infer(srv.url, creds(pki))[0] == C.OK
        assert live(srv.url, creds(pki, ca="ca_b")) == C.UNAVAILABLE   # cannot verify the server
        assert live(srv.url) == C.UNAVAILABLE                          # plaintext to a TLS port
        # Existing clients work unchanged: tritonclient over SSL.
        import tritonclient.grpc as tc
        cl = tc.InferenceServerClient(srv.url, ssl=True, root_certificates=str(pki / "ca_a.pem"))
        assert cl.is_server_live() and cl.is_model_ready("lin")
        cl.close()
    finally:
        srv.assert_clean_stop()


def test_mtls_refuses_missing_and_wrong_client_certificates(pki):
    srv = tls_server(pki, f"--tls-ca={pki / 'ca_a.pem'}", name="mtls")
    try:
        assert "(mutual TLS)" in srv.log()
        assert infer(srv.url, creds(pki, client="client"))[0] == C.OK
        assert live(srv.url, creds(pki)) == C.UNAVAILABLE                       # no client certificate
        assert live(srv.url, creds(pki, client="impostor")) == C.UNAVAILABLE    # signed by CA B
        assert live(srv.url) == C.UNAVAILABLE                                   # plaintext
        assert infer(srv.url, creds(pki, client="client"))[0] == C.OK          # still serving
    finally:
        srv.assert_clean_stop()


def curl_https(srv, pki, ca="ca_a", client=None, scheme="https"):
    """The HTTP status of GET /v2/health/ready on the server's HTTP port, or curl's exit code as a
    negative number when the connection or the handshake fails."""
    cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
           f"{scheme}://127.0.0.1:{srv.http_port}/v2/health/ready"]
    if scheme == "https":
        cmd += ["--cacert", str(pki / f"{ca}.pem")]
    if client:
        cmd += ["--cert", str(pki / f"{client}.pem"), "--key", str(pki / f"{client}.key")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return int(p.stdout) if p.returncode == 0 else -p.returncode


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_https_and_mutual_tls_on_the_http_port(pki):
    """The HTTP port takes the same TLS files: HTTPS only, and with --tls-ca a client certificate
    from that CA is required."""
    srv = tls_server(pki, name="https")
    try:
        assert curl_https(srv, pki) == 200
        assert curl_https(srv, pki, ca="ca_b") < 0              # cannot verify the server
        assert curl_https(srv, pki, scheme="http") < 0          # plaintext to an HTTPS port
    finally:
        srv.assert_clean_stop()
    srv = tls_server(pki, f"--tls-ca={pki / 'ca_a.pem'}", name="https-mtls")
    try:
        assert curl_https(srv, pki, client="client") == 200
        assert curl_https(srv, pki) < 0                         # no client certificate
        assert curl_https(srv, pki, client="impostor") < 0      # signed by CA B
        assert curl_https(srv, pki, client="client") == 200     # still serving
    finally:
        srv.assert_clean_stop()


def admin_calls(st, md):
    """Every non-probe RPC except inference: name -> status code."""
    calls = {
        "ServerMetadata": lambda: st.ServerMetadata(service_pb2.ServerMetadataRequest(), metadata=md, timeout=10),
        "ModelMetadata": lambda: st.ModelMetadata(service_pb2.ModelMetadataRequest(name="lin"), metadata=md, timeout=10),
        "ModelConfig": lambda: st.ModelConfig(service_pb2.ModelConfigRequest(name="lin"), metadata=md, timeout=10),
        "ModelStatistics": lambda: st.ModelStatistics(service_pb2.ModelStatisticsRequest(), metadata=md, timeout=10),
        "SystemSharedMemoryStatus": lambda: st.SystemSharedMemoryStatus(
            service_pb2.SystemSharedMemoryStatusRequest(), metadata=md, timeout=10),
        "SystemSharedMemoryUnregister": lambda: st.SystemSharedMemoryUnregister(
            service_pb2.SystemSharedMemoryUnregisterRequest(), metadata=md, timeout=10),
        "CudaSharedMemoryStatus": lambda: st.CudaSharedMemoryStatus(
            service_pb2.CudaSharedMemoryStatusRequest(), metadata=md, timeout=10),
        "CudaSharedMemoryUnregister": lambda: st.CudaSharedMemoryUnregister(
            service_pb2.CudaSharedMemoryUnregisterRequest(), metadata=md, timeout=10),
    }
    out = {}
    for name, fn in calls.items():
        try:
            fn()
            out[name] = C.OK
        except grpc.RpcError as e:
            out[name] = e.code()
    return out


def probe_calls(st, ch):
    out = {}
    out["ServerLive"] = st.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
    out["ServerReady"] = st.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
    out["ModelReady"] = st.ModelReady(service_pb2.ModelReadyRequest(name="lin"), timeout=10).ready
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    out["Health"] = h.status == health_pb2.HealthCheckResponse.SERVING
    return out


def stream_code(st, md):
    try:
        for _ in st.ModelStreamInfer(iter([rel.lin_req(np.random.default_rng(1), m=2)]), metadata=md, timeout=30):
            pass
        return C.OK
    except grpc.RpcError as e:
        return e.code()


def test_token_required_on_inference_and_admin_rpcs_not_on_probes(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with Server(f"--auth-token-file={token_file}", name="token") as srv:
        assert "(bearer token)" in srv.log()
        good = (("authorization", f"Bearer {TOKEN}"),)
        for md, what in ((None, "missing"), ((("authorization", "Bearer wrong"),), "wrong"),
                         ((("authorization", TOKEN),), "no Bearer prefix"),
                         ((("authorization", f"Bearer {TOKEN}x"),), "longer")):
            code, msg = infer(srv.url, metadata=md)
            assert code == C.UNAUTHENTICATED, f"{what} token: {code} {msg}"
            assert "token" in msg.lower() or "bearer" in msg.lower(), msg
            assert TOKEN not in msg
        assert infer(srv.url, metadata=good)[0] == C.OK
        assert infer(srv.url, metadata=(("authorization", f"bearer {TOKEN}"),))[0] == C.OK  # scheme is case-insensitive
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        assert set(admin_calls(st, None).values()) == {C.UNAUTHENTICATED}
        assert set(admin_calls(st, good).values()) == {C.OK}
        assert stream_code(st, None) == C.UNAUTHENTICATED
        assert stream_code(st, good) == C.OK
        assert all(probe_calls(st, ch).values())
        ch.close()
        # tritonclient passes the token as a header.
        import tritonclient.grpc as tc
        cl = tc.InferenceServerClient(srv.url)
        x = tc.InferInput("X", [1, rel.LIN_K], "FP16")
        x.set_data_from_numpy(np.zeros((1, rel.LIN_K), np.float16))
        assert cl.infer("lin", [x], headers={"authorization": f"Bearer {TOKEN}"}).as_numpy("Y").shape == (1, rel.LIN_N)
        with pytest.raises(Exception, match="UNAUTHENTICATED|token"):
            cl.infer("lin", [x])
        cl.close()


def test_token_admin_only_mode(tmp_path):
    with Server(f"--auth-token={TOKEN}", "--auth-inference=false", name="token-admin") as srv:
        assert infer(srv.url)[0] == C.OK
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        assert set(admin_calls(st, None).values()) == {C.UNAUTHENTICATED}
        assert set(admin_calls(st, (("authorization", f"Bearer {TOKEN}"),)).values()) == {C.OK}
        ch.close()


def test_token_guards_shared_memory_registration(tmp_path):
    """Registering a region opens and maps a file of the server's host: the token guards it
    like every administrative RPC, also when inference is left open."""
    import os
    import tritonclient.grpc as tc
    import tritonclient.utils.shared_memory as shm
    key = f"/flashq_sec_{os.getpid()}"
    handle = shm.create_shared_memory_region("sec", key, 4096)
    good = {"authorization": f"Bearer {TOKEN}"}
    try:
        with Server(f"--auth-token={TOKEN}", "--auth-inference=false", name="token-shm") as srv:
            cl = tc.InferenceServerClient(srv.url)
            with pytest.raises(Exception, match="UNAUTHENTICATED"):
                cl.register_system_shared_memory("sec", key, 4096)
            assert cl.get_system_shared_memory_status(headers=good, as_json=True).get("regions", {}) == {}
            cl.register_system_shared_memory("sec", key, rel.LIN_K * 2, headers=good)
            shm.set_shared_memory_region(handle, [np.ones((1, rel.LIN_K), np.float16)])
            x = tc.InferInput("X", [1, rel.LIN_K], "FP16")
            x.set_shared_memory("sec", rel.LIN_K * 2)
            assert cl.infer("lin", [x]).as_numpy("Y").shape == (1, rel.LIN_N)  # inference is open here
            with pytest.raises(Exception, match="UNAUTHENTICATED"):
                cl.unregister_system_shared_memory("sec")
            cl.unregister_system_shared_memory("sec", headers=good)
            cl.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_mtls_and_token_together(pki):
    srv = tls_server(pki, f"--tls-ca={pki / 'ca_a.pem'}", f"--auth-token={TOKEN}", name="mtls-token")
    try:
        good = creds(pki, client="client")
        assert infer(srv.url, good)[0] == C.UNAUTHENTICATED
        assert infer(srv.url, good, metadata=(("authorization", f"Bearer {TOKEN}"),))[0] == C.OK
    finally:
        srv.assert_clean_stop()


@pytest.mark.parametrize("flags,words", [
    (["--tls-cert={pki}/server.pem"], "--tls-key"),
    (["--tls-ca={pki}/ca_a.pem"], "--tls-cert"),
    (["--tls-cert={pki}/missing.pem", "--tls-key={pki}/server.key"], "missing.pem"),
    (["--tls-cert={pki}/server.ext", "--tls-key={pki}/server.key"], "not PEM"),
    (["--auth-token=a", "--auth-token-file={pki}/ca_a.pem"], "not both"),
    (["--auth-token-file={pki}/empty"], "no token"),
    (["--tls-cert={pki}/server.pem", "--tls-key={pki}/client.key"], "--tls-key '{pki}/client.key' is not the private key"),
    (["--tls-cert={pki}/server.pem", "--tls-key={pki}/server.pem"], "--tls-key '{pki}/server.pem' holds no"),
    (["--tls-cert={pki}/server.csr", "--tls-key={pki}/server.key"], "--tls-cert '{pki}/server.csr' holds no PEM certificate"),
    (["--tls-cert={pki}/server.pem", "--tls-key={pki}/server.key", "--tls-ca={pki}/ca_a.key"],
     "--tls-ca '{pki}/ca_a.key' holds no PEM certificate"),
])
def test_bad_security_flags_stop_the_server(pki, flags, words):
    (pki / "empty").write_text("\n")
    cmd = [rel.SERVER_BIN, "--grpc-port=0", "--metrics-port=0", "--http-port=0", "--backend=cpu",
           f"--model-repository={rel.shared_repository()}"] + [f.format(pki=pki) for f in flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert words.format(pki=pki) in p.stderr, p.stderr
