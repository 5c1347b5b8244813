#!/usr/bin/env python3
"""Client-side balancing over a headless-Service-like DNS name, with the server flags of
deploy/k8s/deployment.yaml, against real flashq containers.

    balancing_check.py NETWORK NAME AGE_MS -- PODMAN_RUN_PREFIX...

PODMAN_RUN_PREFIX (`podman run -d --network NETWORK IMAGE ARGS`) is completed with --name
for each replica. Once a replica's HEALTHCHECK passes it is joined to NETWORK again under
the alias NAME, so the network's DNS server (aardvark-dns) answers NAME with one A record
per ready replica, as cluster DNS answers a headless Service with one per ready pod. One
gRPC channel, target dns://GATEWAY:53/NAME:8001 with the round_robin policy (what a
client of flashq-headless configures), sends `attention` calls throughout:
1. replica a alone serves them;
2. replica b becomes ready (an HPA scale-up): within a few connection ages (AGE_MS, the
   server's --grpc-max-connection-age) a GOAWAY-triggered re-resolution finds b, and b
   serves calls too; no call fails;
3. replica a stops under the calls (a scale-down): every call is answered (calls that
   reach a while it drains may be refused: UNAVAILABLE or CANCELLED), and once a is gone
   every call is served by b.
Exit 0 on success; prints each replica's share.
"""
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from infer_once import attention_request, check_attention


def sh(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def start_replica(prefix, network, alias, name):
    """Starts a replica; once healthy (the readiness a headless Service waits for), it is
    joined to the network under the alias. Returns its address."""
    sh(*prefix[:2], "--name", name, *prefix[2:])
    for _ in range(300):
        if subprocess.run(["podman", "healthcheck", "run", name], capture_output=True).returncode == 0:
            break
        time.sleep(1)
    else:
        raise SystemExit(f"balancing: FAILED: replica {name} not healthy within 300 s")
    sh("podman", "network", "disconnect", network, name)
    sh("podman", "network", "connect", "--alias", alias, network, name)
    return sh("podman", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name)


def served(ip):
    """Requests this replica has answered (flashq_requests_total, all codes)."""
    body = urllib.request.urlopen(f"http://{ip}:8002/metrics", timeout=5).read().decode()
    return sum(float(ln.rsplit(None, 1)[1]) for ln in body.splitlines()
               if ln.startswith("flashq_requests_total{") and 'model="attention"' in ln)


class Caller:
    """Sends one call at a time over one channel and records (send time, code)."""

    def __init__(self, target):
        # round_robin: one subchannel per resolved address, calls spread over the ready ones.
        # A resolution at most every second (gRPC's default is 30 s) keeps the test short.
        self.client = grpcclient.InferenceServerClient(url=target, channel_args=[
            ("grpc.lb_policy_name", "round_robin"), ("grpc.dns_min_time_between_resolutions_ms", 1000)])
        self.inputs, q, k, v, cu = attention_request(np.random.default_rng(5), [32, 48])
        self.ref = (q, k, v, cu)
        self.results = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                res = self.client.infer("attention", self.inputs, parameters={"causal": True}, client_timeout=30,
                                        outputs=[grpcclient.InferRequestedOutput("O")])
                check_attention(res.as_numpy("O"), *self.ref)
                code = "OK"
            except InferenceServerException as e:
                code = str(e.status()).replace("StatusCode.", "")
            self.results.append((t, code))
            time.sleep(0.01)

    def wait_until_served(self, timeout_s):
        """Seconds until a call through the name is answered. The name may resolve only a moment after `podman
        network connect` returns, and gRPC fails calls fast until it does, so the phases are timed from here."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            try:
                if self.client.is_server_ready(client_timeout=5):
                    return time.monotonic() - t0
            except InferenceServerException:
                pass
            time.sleep(0.25)
        raise SystemExit(f"balancing: FAILED: {timeout_s} s without an answer through the headless name")

    def codes(self, since=0.0, until=float("inf")):
        out = {}
        for t, c in self.results:
            if since <= t < until:
                out[c] = out.get(c, 0) + 1
        return out


def main():
    network, name, age_ms, sep, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    assert sep == "--" and prefix[:2] == ["podman", "run"], __doc__
    dns = sh("podman", "network", "inspect", "--format", "{{range .Subnets}}{{.Gateway}}{{end}}", network)
    tag = f"{name}-{int(time.time())}"
    replicas = {r: f"{tag}-{r}" for r in "ab"}
    problems = []
    try:
        ip_a = start_replica(prefix, network, name, replicas["a"])
        caller = Caller(f"dns://{dns}:53/{name}:8001")
        print(f"balancing: replica a answers through the name after {caller.wait_until_served(60):.1f} s")
        caller.thread.start()
        time.sleep(2)
        a0 = served(ip_a)
        ok1 = caller.codes()
        if not (a0 > 0 and set(ok1) == {"OK"}):
            problems.append(f"replica a alone: {ok1}, served {a0}")

        t_b = time.monotonic()
        ip_b = start_replica(prefix, network, name, replicas["b"])
        up_s = time.monotonic() - t_b
        deadline = time.monotonic() + 6 * age_ms / 1000 + 5
        while time.monotonic() < deadline and served(ip_b) < 20:
            time.sleep(0.5)
        found_s = time.monotonic() - t_b - up_s
        time.sleep(2)
        sa, sb = served(ip_a) - a0, served(ip_b)
        codes = caller.codes(since=t_b)
        print(f"balancing: scale-up: b healthy after {up_s:.1f} s, serving calls {found_s:.1f} s later; since: "
              f"a {sa:.0f}, b {sb:.0f} calls; codes {codes}")
        if sb < 20 or sa < 20:
            problems.append(f"after scale-up both replicas should serve calls: a {sa:.0f}, b {sb:.0f}")
        if set(codes) != {"OK"}:
            problems.append(f"calls failed during the scale-up: {codes}")

        t_stop = time.monotonic()
        sh("podman", "stop", "-t", "30", replicas["a"])
        stopped = time.monotonic()
        b1 = served(ip_b)
        time.sleep(3)
        caller.stop.set()
        caller.thread.join(timeout=60)
        during, after = caller.codes(t_stop, stopped + 0.5), caller.codes(stopped + 0.5)
        print(f"balancing: scale-down: `podman stop` a took {stopped - t_stop:.1f} s; calls meanwhile {during}, "
              f"after {after}, b served {served(ip_b) - b1:.0f} of them")
        # Refused, not lost: UNAVAILABLE while a drains, CANCELLED when a call reaches it as
        # gRPC itself shuts down (tests/reliability counts the same way).
        if set(during) - {"OK", "UNAVAILABLE", "CANCELLED"}:
            problems.append(f"calls during the stop got {during}")
        if set(after) != {"OK"} or after.get("OK", 0) < 20:
            problems.append(f"after a stopped, calls should all succeed on b: {after}")
        if sh("podman", "inspect", "--format", "{{.State.ExitCode}}", replicas["a"]) != "0":
            problems.append("replica a did not exit 0 on podman stop")
    finally:
        for r in replicas.values():
            subprocess.run(["podman", "rm", "-f", "-v", r], capture_output=True)
    for p in problems:
        print(f"balancing: FAILED: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
