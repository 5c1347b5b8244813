#!/usr/bin/env python3
"""One real inference against a running flashq server, plus a /metrics read.

    infer_once.py GRPC_HOST:PORT METRICS_HOST:PORT

Sends one `attention` request (FP16, two ragged sequences, GQA 4/2 heads, head dim 128,
causal) through tritonclient, checks O against a float64 numpy reference, then checks
that /metrics serves the flashq_ families and counted the request. Exit 0 on success.
Used by the bundle and container tests (tests/deploy/*_test.sh) and handy by hand;
stop_under_load.py and stack_check.py import its request and reference helpers.
"""
import sys
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient


def reference(q, k, v, cu_q, cu_k, causal):
    """float64 attention per sequence; GQA by repeating K/V heads; bottom-right causal mask."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    rep = hq // hkv
    out = np.zeros(q.shape, np.float64)
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s]:cu_q[s + 1]].astype(np.float64)
        ks = np.repeat(k[cu_k[s]:cu_k[s + 1]].astype(np.float64), rep, axis=1)
        vs = np.repeat(v[cu_k[s]:cu_k[s + 1]].astype(np.float64), rep, axis=1)
        sc = np.einsum("qhd,khd->hqk", qs, ks) / np.sqrt(d)
        if causal:
            lq, lk = qs.shape[0], ks.shape[0]
            mask = np.arange(lk)[None, :] > (np.arange(lq)[:, None] + lk - lq)
            sc = np.where(mask[None], -np.inf, sc)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[cu_q[s]:cu_q[s + 1]] = np.einsum("hqk,khd->qhd", p, vs)
    return out


def attention_request(rng, lens, hq=4, hkv=2, d=128):
    """Random FP16 `attention` inputs for ragged sequences of `lens` tokens (causal, GQA):
    (tritonclient inputs, q, k, v, cu_seqlens)."""
    cu = np.array([0] + list(np.cumsum(lens)), np.int32)
    q = rng.standard_normal((cu[-1], hq, d)).astype(np.float16)
    k = rng.standard_normal((cu[-1], hkv, d)).astype(np.float16)
    v = rng.standard_normal((cu[-1], hkv, d)).astype(np.float16)
    inputs = []
    for name, arr, dt in (("Q", q, "FP16"), ("K", k, "FP16"), ("V", v, "FP16"),
                          ("CU_SEQLENS_Q", cu, "INT32"), ("CU_SEQLENS_K", cu, "INT32")):
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs, q, k, v, cu


def check_attention(o, q, k, v, cu):
    """Asserts O matches the float64 reference rounded through FP16; returns the max abs error."""
    assert o is not None and o.shape == q.shape, f"O shape {None if o is None else o.shape} != {q.shape}"
    ref16 = reference(q, k, v, cu, cu, causal=True).astype(np.float16).astype(np.float64)
    err = np.abs(o.astype(np.float64) - ref16)
    tol = 2e-3 + 2e-2 * np.abs(ref16)
    assert np.all(err <= tol), f"O differs from the reference: max abs err {err.max():.3g}"
    return err.max()


def main():
    grpc_addr, metrics_addr = sys.argv[1], sys.argv[2]
    client = grpcclient.InferenceServerClient(url=grpc_addr)
    assert client.is_server_live() and client.is_server_ready(), "server not live/ready"
    assert client.is_model_ready("attention"), "model `attention` not ready"

    inputs, q, k, v, cu = attention_request(np.random.default_rng(7), [5, 11])
    res = client.infer("attention", inputs, outputs=[grpcclient.InferRequestedOutput("O")],
                       parameters={"causal": True}, client_timeout=60)
    o = res.as_numpy("O")
    err = check_attention(o, q, k, v, cu)
    print(f"infer_once: attention O {list(o.shape)} fp16 matches the float64 reference (max abs err {err:.2g})")

    body = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=10).read().decode()
    fams = sorted({ln.split()[2] for ln in body.splitlines() if ln.startswith("# TYPE flashq_")})
    assert fams, "/metrics has no flashq_ families"
    counted = [ln for ln in body.splitlines()
               if ln.startswith("flashq_requests_total") and 'model="attention"' in ln]
    assert counted and sum(float(ln.rsplit(None, 1)[1]) for ln in counted) >= 1, \
        "flashq_requests_total{model=\"attention\"} did not count the request"
    print(f"infer_once: /metrics serves {len(fams)} flashq_ families; request counted")


if __name__ == "__main__":
    main()
