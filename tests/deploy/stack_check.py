#!/usr/bin/env python3
"""Checks a running compose stack end to end: flashq serves, Prometheus scrapes it, and
PromQL over the scraped histograms answers.

    stack_check.py GRPC_HOST:PORT PROMETHEUS_URL

Waits for Prometheus's `flashq` target to be up, sends `attention` requests (checked
against the float64 reference) for a few scrape intervals, then asks Prometheus for the
p99 request latency, histogram_quantile over rate(flashq_request_duration_seconds_bucket),
until it answers with a number, checks that the rule files (recording rules and
alerts) are loaded and the HPA's recording rule has a value, and runs every query of
the Grafana dashboard (throughput and p99 latency must have data). Exit 0 on success.
"""
import json
import math
import os
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from check_deploy import dashboard_queries
from infer_once import attention_request, check_attention

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

P99 = ('histogram_quantile(0.99, sum by (le) '
       '(rate(flashq_request_duration_seconds_bucket{job="flashq",stage="total",model="attention"}[1m])))')
LOAD_S = 15.0  # three scrape intervals of deploy/prometheus/prometheus.yml


def api(prom, path, **params):
    url = f"{prom}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    body = json.load(urllib.request.urlopen(url, timeout=10))
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what, fn, timeout):
    """fn() until it returns something truthy; errors before the deadline count as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except (OSError, AssertionError, KeyError, ValueError) as e:
            last = e
        time.sleep(1)
    raise SystemExit(f"stack_check: FAILED: {what} within {timeout} s" + (f" (last error: {last})" if last else ""))


def main():
    grpc_addr, prom = sys.argv[1], sys.argv[2].rstrip("/")
    t0 = time.monotonic()
    target = wait_for("Prometheus reports the flashq target up", lambda: [
        t for t in api(prom, "targets")["activeTargets"]
        if t["labels"]["job"] == "flashq" and t["health"] == "up"], 90)[0]
    print(f"stack_check: Prometheus scrapes {target['scrapeUrl']} (up) after {time.monotonic() - t0:.1f} s")

    client = grpcclient.InferenceServerClient(url=grpc_addr)
    outputs = [grpcclient.InferRequestedOutput("O")]
    rng = np.random.default_rng(3)
    n = 0
    end = time.monotonic() + LOAD_S
    while time.monotonic() < end:
        inputs, q, k, v, cu = attention_request(rng, [int(x) for x in rng.integers(1, 64, size=3)])
        res = client.infer("attention", inputs, outputs=outputs, parameters={"causal": True}, client_timeout=60)
        check_attention(res.as_numpy("O"), q, k, v, cu)
        n += 1
        time.sleep(0.1)
    print(f"stack_check: {n} attention requests over {LOAD_S:.0f} s, all match the float64 reference")

    def p99():
        r = api(prom, "query", query=P99)["result"]
        v = float(r[0]["value"][1]) if r else math.nan
        return v if math.isfinite(v) and v > 0 else None
    t = time.monotonic()
    v = wait_for("histogram_quantile over the scraped histogram answers", p99, 60)
    print(f"stack_check: {P99} = {v * 1e3:.3f} ms (answered {time.monotonic() - t:.1f} s after the load)")

    groups = {g["name"]: g for g in api(prom, "rules")["groups"]}
    assert {"flashq.recording", "flashq.alerts"} <= set(groups), f"rule groups loaded: {sorted(groups)}"
    bad = [r["name"] for g in groups.values() for r in g["rules"] if r.get("health") not in ("ok", "unknown")]
    assert not bad, f"rules failing to evaluate: {bad}"
    q = wait_for("the recording rule flashq:queue_seconds:mean1m has a value",
                 lambda: api(prom, "query", query='flashq:queue_seconds:mean1m{model="attention"}')["result"], 60)
    print(f"stack_check: rules loaded ({', '.join(sorted(groups))}); flashq:queue_seconds:mean1m = {q[0]['value'][1]}")

    # The Grafana dashboard's queries, as Grafana would send them to this Prometheus.
    queries = dashboard_queries(SRC)
    empty = sorted({title for title, e in queries if not api(prom, "query", query=e)["result"]})
    for want in ("Throughput (requests/s) by model", "p99 latency by stage"):
        assert want not in empty, f"dashboard panel {want!r} has no data on the stack"
    print(f"stack_check: the {len(queries)} Grafana dashboard queries run here; panels without data "
          f"on this CPU-backend stack: {empty}")


if __name__ == "__main__":
    main()
