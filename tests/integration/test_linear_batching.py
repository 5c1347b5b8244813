"""Batch invariance of the quantized linear layers across requests merged by the server:
INT4 (GPTQ v1 with act-order, GPTQ v2 with K not a multiple of the group size, AWQ),
FP8 W8A16 and FP8 W8A8 (per-channel and per-tensor weight scales). For each layer,
concurrent clients send requests of a few rows at once (FP16 and BF16), the server
merges them (checked through flashq_batch_requests), and every output is bitwise equal
to that of the same request sent alone; outputs also match a float64 reference built
from the checkpoint's integers and scales here (shares no code with the server). A
second server with --batch-invariant=false merges the same way and stays correct."""
import json
import pathlib
import struct
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import TEST_TMP
from helpers import _fp8_e4m3_table, assert_close, metric, round_to, scrape

N_CLIENTS = 16
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _param(k, v):
    return f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'


def _safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}"""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _config(name, k, n, params):
    return (f'name: "{name}"\nmax_batch_size: 0\n'
            f'input [ {{ name: "X" data_type: TYPE_FP16 dims: [ -1, {k} ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP16 dims: [ -1, {n} ] }} ]\n'
            'dynamic_batching { max_queue_delay_microseconds: 500 default_queue_policy { max_queue_size: 256 } }\n'
            + _param("kind", "linear") + _param("in_features", k) + _param("out_features", n)
            + _param("max_batch_tokens", 1024) + "".join(_param(a, b) for a, b in params.items()))


def _nibbles(q):
    """Packs the last axis (a multiple of 8 values 0..15) into int32 words, low nibble first."""
    q = q.astype(np.uint32).reshape(*q.shape[:-1], -1, 8)
    return (q << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32).view(np.int32)


def _int4_layer(rng, k, n, group, act_order):
    """Random int4 weights: q [K, N] in 0..15, zeros [G, N] in 1..15, scales [G, N] (FP16),
    g_idx [K]; float64 W [K, N] = (q - zeros[g_idx]) * scales[g_idx]."""
    g = -(-k // group)
    q = rng.integers(0, 16, (k, n))
    zeros = rng.integers(1, 16, (g, n))
    scales = (rng.uniform(0.5, 1.5, (g, n)) / (8 * np.sqrt(k))).astype(np.float16)
    g_idx = np.arange(k) // group
    if act_order:
        g_idx = np.argsort(rng.permutation(k)) // group   # each group still holds `group` channels
    w = (q - zeros[g_idx]) * scales.astype(np.float64)[g_idx]
    return q, zeros, scales, g_idx.astype(np.int32), w


def write_gptq(d, rng, k, n, group, v1, act_order):
    q, zeros, scales, g_idx, w = _int4_layer(rng, k, n, group, act_order)
    stored = zeros - 1 if v1 else zeros
    tensors = {"qweight": ("I32", [k // 8, n], _nibbles(q.T).T.copy().tobytes()),
               "qzeros": ("I32", [zeros.shape[0], n // 8], _nibbles(stored).tobytes()),
               "scales": ("F16", list(scales.shape), scales.tobytes())}
    if act_order:
        tensors["g_idx"] = ("I32", [k], g_idx.tobytes())
    _safetensors(d / "model.safetensors", tensors)
    return {"weight_format": "gptq", "group_size": group, "gptq_version": 1 if v1 else 2}, w


def write_awq(d, rng, k, n, group):
    q, zeros, scales, _, w = _int4_layer(rng, k, n, group, False)
    inter = lambda a: a.reshape(*a.shape[:-1], -1, 8)[..., AWQ_ORDER].reshape(a.shape)  # nibble i = column 8c + order[i]
    _safetensors(d / "model.safetensors", {
        "qweight": ("I32", [k, n // 8], _nibbles(inter(q)).tobytes()),
        "qzeros": ("I32", [zeros.shape[0], n // 8], _nibbles(inter(zeros)).tobytes()),
        "scales": ("F16", list(scales.shape), scales.tobytes())})
    return {"weight_format": "awq", "group_size": group}, w


def write_fp8(d, rng, k, n, activation, per_channel):
    # E4M3 codes with exponent field <= 10 (|w8| <= 15): no NaN, no saturation.
    codes = (rng.integers(0, 0x58, (n, k)) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)
    scale = (rng.uniform(0.5, 1.5, n if per_channel else 1) / (4 * np.sqrt(k))).astype(np.float32)
    _safetensors(d / "model.safetensors", {"weight": ("F8_E4M3", [n, k], codes.tobytes()),
                                           "weight_scale": ("F32", [scale.size], scale.tobytes())})
    w = _fp8_e4m3_table()[codes] * scale.astype(np.float64).reshape(-1, 1)
    return {"weight_format": "fp8", "fp8_activation": activation}, w.T


# name: (writer, K, N)
LAYERS = {
    "gptq_v1_act_order": (lambda d, r: write_gptq(d, r, 256, 192, 64, v1=True, act_order=True), 256, 192),
    "gptq_v2_k_leftover": (lambda d, r: write_gptq(d, r, 200, 128, 64, v1=False, act_order=False), 200, 128),
    "awq": (lambda d, r: write_awq(d, r, 256, 192, 64), 256, 192),
    "fp8_w8a16": (lambda d, r: write_fp8(d, r, 256, 192, "bf16", per_channel=True), 256, 192),
    "fp8_w8a8": (lambda d, r: write_fp8(d, r, 256, 192, "fp8", per_channel=True), 256, 192),
    "fp8_w8a8_tensor": (lambda d, r: write_fp8(d, r, 192, 128, "fp8", per_channel=False), 192, 128),
}


@pytest.fixture(scope="module")
def repository():
    """The layers above, written once: (folder, {name: float64 W [K, N]})."""
    root = pathlib.Path(TEST_TMP) / "linear-batching-repo"
    rng = np.random.default_rng(9100)
    weights = {}
    for name, (write, k, n) in LAYERS.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        params, w = write(d, rng)
        (d / "config.pbtxt").write_text(_config(name, k, n, params))
        weights[name] = w
    return root, weights


@pytest.fixture(scope="module")
def linear_server(start_server, repository):
    root, weights = repository
    # A queue delay long enough that clients starting together share batches.
    s = start_server(f"--model-repository={root}", "--max-queue-delay-us=50000", name="linear-batching")
    return s, weights


@pytest.fixture(scope="module")
def fast_server(start_server, repository):
    root, weights = repository
    s = start_server(f"--model-repository={root}", "--max-queue-delay-us=50000", "--batch-invariant=false",
                     name="linear-fast")
    return s, weights


def infer(client, model, x, dtype):
    i = grpcclient.InferInput("X", list(x.shape), dtype)
    i.set_data_from_numpy(x.astype(np.float16) if dtype == "FP16" else x.astype(np.float32))
    res = client.infer(model, [i], client_timeout=120)
    out = res.get_output("Y")
    assert out.datatype == dtype, out.datatype
    return res.get_response().raw_output_contents[0]


def decode(raw, dtype, m, n):
    if dtype == "FP16":
        return np.frombuffer(raw, np.float16).astype(np.float64).reshape(m, n)
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(m, n)


def batches(s, model):
    samples, _ = scrape(s.metrics_url)
    return (metric(samples, "flashq_batch_requests_sum", model=model),
            metric(samples, "flashq_batch_requests_count", model=model))


def random_requests(model, seed):
    """N_CLIENTS requests of 1..6 rows, half FP16 and half BF16 (each dtype is its own batch
    key, so both get merged batches)."""
    _, k, _ = LAYERS[model]
    rng = np.random.default_rng(seed + list(LAYERS).index(model))
    reqs = []
    for i in range(N_CLIENTS):
        dtype = "FP16" if i % 2 == 0 else "BF16"
        reqs.append((round_to(rng.standard_normal((int(rng.integers(1, 7)), k)), dtype), dtype))
    return reqs


def send_together(s, model, reqs):
    """Every request from its own client at once; asserts the server merged them.
    Returns the raw outputs and the number of batches."""
    clients = [grpcclient.InferenceServerClient(s.url) for _ in reqs]
    out, errors = [None] * len(reqs), []
    barrier = threading.Barrier(len(reqs))
    r0, b0 = batches(s, model)

    def run(i):
        try:
            barrier.wait(timeout=60)
            out[i] = infer(clients[i], model, *reqs[i])
        except Exception as e:  # reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    for c in clients:
        c.close()
    assert not errors, errors
    r1, b1 = batches(s, model)
    assert r1 - r0 == len(reqs), f"{r1 - r0} requests executed, expected {len(reqs)}"
    assert (r1 - r0) / (b1 - b0) >= 2, f"{model}: {r1 - r0} requests in {b1 - b0} batches: not merged"
    return out, b1 - b0


def check_reference(model, w, reqs, raws):
    n = LAYERS[model][2]
    for i, ((x, dtype), raw) in enumerate(zip(reqs, raws)):
        y = decode(raw, dtype, x.shape[0], n)
        ref = x.astype(np.float64) @ w
        if model.startswith("fp8_w8a8"):
            # W8A8 also quantizes X to E4M3 (per row): a relative-norm bound.
            rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            assert rel < 0.06, f"{model} request {i} ({dtype}): relative error {rel:.3g}"
        else:
            tol = 1.6e-2  # the dequantized weight may pass through the activation dtype
            assert_close(y, ref, dtype, f"{model} request {i}", atol=tol * np.sqrt(np.mean(ref ** 2)), rtol=tol)


@pytest.mark.parametrize("model", list(LAYERS))
def test_merged_requests_match_alone_bitwise(linear_server, model):
    s, weights = linear_server
    reqs = random_requests(model, 9200)
    merged, n_batches = send_together(s, model, reqs)

    solo = grpcclient.InferenceServerClient(s.url)
    r1, b1 = batches(s, model)
    alone = [infer(solo, model, *r) for r in reqs]
    solo.close()
    r2, b2 = batches(s, model)
    assert r2 - r1 == b2 - b1 == len(reqs), f"alone phase: {r2 - r1} requests in {b2 - b1} batches"
    differ = [i for i in range(len(reqs)) if merged[i] != alone[i]]
    assert not differ, f"{model}: requests whose merged output differs from the alone one: {differ}"
    check_reference(model, weights[model], reqs, merged)
    print(f"{model}: {len(reqs)} requests in {n_batches:.0f} batches; equal alone")


@pytest.mark.parametrize("model", list(LAYERS))
def test_batch_invariant_false_merges_and_is_correct(fast_server, model):
    """--batch-invariant=false (faster paths that may depend on the batch): the server
    starts, merges, and every output still matches the float64 reference."""
    s, weights = fast_server
    reqs = random_requests(model, 9300)
    merged, _ = send_together(s, model, reqs)
    check_reference(model, weights[model], reqs, merged)
