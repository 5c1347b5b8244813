"""tritonclient.grpc and tritonclient.http against the real server: every RPC of the
service (and its HTTP/REST endpoint), inference on every demo model with FP16 and BF16 raw
(binary) tensors, streaming (gRPC), and kv_attention sequences, checked against float64
references. Each test that takes `client` runs once per protocol."""
import glob
import os
import queue
import threading

from importlib.metadata import version as package_version

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from conftest import DEMO_CACHE
from helpers import assert_close, attention_ref, config_param, linear_weight_bf16, linear_weight_dequant, round_to

LINEAR = {  # model -> (K, N)
    "up_proj_bf16": (4096, 14336), "down_proj_bf16": (14336, 4096),
    "up_proj_int4": (4096, 14336), "down_proj_int4": (14336, 4096),
    "up_proj_fp8": (4096, 14336), "down_proj_fp8": (14336, 4096),
}
DEMO_MODELS = ["attention", "kv_attention", *LINEAR]
# The numpy dtype this tritonclient takes for each datatype: for BF16, float32 (truncated to BF16)
# up to 2.69, ml_dtypes.bfloat16 from 2.70 on (docs/protocol.md, "BF16 through tritonclient").
tritonclient_version = package_version("tritonclient")
NP_IN = {dt: triton_to_np_dtype(dt) for dt in ("FP16", "BF16", "FP32")}
BF16_NATIVE = NP_IN["BF16"] is not np.float32
print(f"tritonclient {tritonclient_version}: BF16 inputs as {np.dtype(NP_IN['BF16']).name}")


def as_f32(a):
    """An output as float32 for the comparisons: tritonclient from 2.70 returns BF16 outputs as
    ml_dtypes.bfloat16 arrays, older ones as float32."""
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


class HttpClient:
    """tritonclient.http with tritonclient.grpc's call forms, so that one test body serves both:
    as_json= is accepted (HTTP answers are JSON already) and the config comes as {"config": ...}."""
    module = httpclient

    def __init__(self, url):
        self._c = httpclient.InferenceServerClient(url)

    def __getattr__(self, name):
        return getattr(self._c, name)

    def get_server_metadata(self, as_json=True):
        return self._c.get_server_metadata()

    def get_model_metadata(self, model_name, model_version="", as_json=True):
        return self._c.get_model_metadata(model_name, model_version)

    def get_model_config(self, model_name, model_version="", as_json=True):
        return {"config": self._c.get_model_config(model_name, model_version)}

    def get_inference_statistics(self, model_name="", model_version="", as_json=True):
        return self._c.get_inference_statistics(model_name, model_version)


@pytest.fixture(scope="module", params=["grpc", "http"])
def client(server, request):
    if request.param == "grpc":
        c = grpcclient.InferenceServerClient(server.url)
        c.module = grpcclient
    else:
        c = HttpClient(server.http_url)
    yield c
    c.close()


def make_input(client, name, arr, dtype):
    i = client.module.InferInput(name, list(arr.shape), dtype)
    i.set_data_from_numpy(np.ascontiguousarray(arr, NP_IN.get(dtype, arr.dtype)))
    return i


def output_datatype(res, name):
    o = res.get_output(name)
    return o["datatype"] if isinstance(o, dict) else o.datatype


def response_field(res, name):
    r = res.get_response()
    return r[name] if isinstance(r, dict) else getattr(r, name)


def attention_call(client, rng, dtype, lens_q, lens_k=None, causal=False, scale=None, hq=32, hkv=8, d=128,
                   lse=True):
    lens_k = lens_q if lens_k is None else lens_k
    q = round_to(rng.standard_normal((sum(lens_q), hq, d)), dtype)
    k = round_to(rng.standard_normal((sum(lens_k), hkv, d)), dtype)
    v = round_to(rng.standard_normal((sum(lens_k), hkv, d)), dtype)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    inputs = [make_input(client, "Q", q, dtype), make_input(client, "K", k, dtype), make_input(client, "V", v, dtype),
              make_input(client, "CU_SEQLENS_Q", cu_q, "INT32"), make_input(client, "CU_SEQLENS_K", cu_k, "INT32")]
    outputs = [client.module.InferRequestedOutput("O")] + ([client.module.InferRequestedOutput("LSE")] if lse else [])
    params = {"causal": causal}
    if scale is not None:
        params["softmax_scale"] = float(scale)
    res = client.infer("attention", inputs, outputs=outputs, parameters=params)
    return res, attention_ref(q, k, v, cu_q, cu_k, causal=causal, scale=scale)


# ---- metadata RPCs --------------------------------------------------------------------

def test_server_live_ready_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    md = client.get_server_metadata(as_json=True)
    assert md["name"], md
    assert md.get("version"), md


@pytest.mark.parametrize("model", DEMO_MODELS)
def test_model_ready_metadata_config(client, model):
    assert client.is_model_ready(model)
    md = client.get_model_metadata(model, as_json=True)
    assert md["name"] == model
    names = {i["name"] for i in md["inputs"]}
    outs = {o["name"] for o in md["outputs"]}
    if model in LINEAR:
        assert names == {"X"} and outs == {"Y"}, md
    else:
        assert {"Q", "K", "V"} <= names and "O" in outs, md
    cfg = client.get_model_config(model, as_json=True)["config"]
    assert cfg["name"] == model
    assert int(cfg.get("max_batch_size", 0)) == 0, cfg   # ragged batching inside the tensors
    assert {i["name"] for i in cfg["input"]} == names


def test_unknown_model_not_ready(client):
    try:
        ready = client.is_model_ready("no_such_model")
    except InferenceServerException:   # NOT_FOUND is an acceptable answer too
        ready = False
    assert not ready


def small_attention_inputs(client, seed=21):
    rng = np.random.default_rng(seed)
    q = round_to(rng.standard_normal((3, 32, 128)), "FP16")
    kv = round_to(rng.standard_normal((3, 8, 128)), "FP16")
    return [make_input(client, "Q", q, "FP16"), make_input(client, "K", kv, "FP16"), make_input(client, "V", kv, "FP16")]


def assert_not_found(call, version):
    with pytest.raises(InferenceServerException) as e:
        call()
    assert e.value.status() in ("StatusCode.NOT_FOUND", "404"), (e.value.status(), e.value.message())
    assert f"'{version}'" in e.value.message(), e.value.message()


@pytest.mark.parametrize("version", ["2", "0", "latest"])
def test_model_version_that_does_not_exist_is_not_found(client, server, version):
    """Each model serves version 1 (and "" means the latest, 1); any other version is NOT_FOUND
    on every RPC that takes one, inference included, instead of being answered as version 1."""
    ins = small_attention_inputs(client)
    assert_not_found(lambda: client.infer("attention", ins, model_version=version), version)
    assert not client.is_model_ready("attention", model_version=version)
    assert_not_found(lambda: client.get_model_metadata("attention", model_version=version), version)
    assert_not_found(lambda: client.get_model_config("attention", model_version=version), version)
    assert_not_found(lambda: client.get_inference_statistics("attention", model_version=version), version)
    # The versions that exist are answered, under their number.
    for v in ("1", ""):
        res = client.infer("attention", ins, model_version=v)
        assert response_field(res, "model_version") == "1", res.get_response()
        assert client.is_model_ready("attention", model_version=v)
        assert client.get_model_metadata("attention", model_version=v, as_json=True)["versions"] == ["1"]
    if client.module is not grpcclient:
        return
    # Streaming (gRPC only): the error answers that request; the stream goes on.
    c = grpcclient.InferenceServerClient(server.url)
    results = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    c.async_stream_infer("attention", ins, model_version=version, request_id="bad")
    result, error = results.get(timeout=60)
    # (A stream's error travels as ModelStreamInferResponse.error_message, which has no status code.)
    assert error is not None and f"has no version '{version}'" in error.message(), error
    c.async_stream_infer("attention", ins, model_version="1", request_id="good")
    result, error = results.get(timeout=60)
    assert error is None and result.get_response().id == "good", error
    c.stop_stream()
    c.close()


def test_statistics_count_inferences(client):
    rng = np.random.default_rng(1)
    before = client.get_inference_statistics("attention", as_json=True)
    for _ in range(3):
        attention_call(client, rng, "FP16", [5], lse=False)
    after = client.get_inference_statistics("attention", as_json=True)
    def count(st):
        ms = [m for m in st.get("model_stats", []) if m["name"] == "attention"]
        assert ms, st
        return int(ms[0].get("inference_stats", {}).get("success", {}).get("count", 0))
    assert count(after) - count(before) >= 3, (before, after)
    everything = client.get_inference_statistics(as_json=True)
    assert {m["name"] for m in everything["model_stats"]} >= set(DEMO_MODELS)


# ---- attention ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["FP16", "BF16", "FP32"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64(client, dtype, causal):
    rng = np.random.default_rng(7)
    # Several sequences per request; lengths not multiples of any tile; for non-causal,
    # query and key lengths differ.
    lens_q = [1, 17, 64, 33]
    lens_k = lens_q if causal else [9, 17, 80, 33]
    res, (o_ref, lse_ref) = attention_call(client, rng, dtype, lens_q, lens_k, causal=causal)
    o = as_f32(res.as_numpy("O"))
    out_dtype = output_datatype(res, "O")
    assert out_dtype == dtype, f"O datatype {out_dtype}, expected {dtype} (same as Q)"
    assert_close(o.reshape(o_ref.shape), o_ref, dtype, f"attention O {dtype} causal={causal}")
    lse = res.as_numpy("LSE")
    assert output_datatype(res, "LSE") == "FP32"
    assert_close(lse.reshape(lse_ref.shape), lse_ref, "FP32", "attention LSE", atol=1e-3, rtol=1e-4)


def test_attention_gqa_and_softmax_scale(client):
    rng = np.random.default_rng(8)
    res, (o_ref, lse_ref) = attention_call(client, rng, "FP16", [20, 3], causal=True, scale=0.05, hq=8, hkv=2, d=64)
    assert_close(as_f32(res.as_numpy("O")).reshape(o_ref.shape), o_ref, "FP16", "attention GQA 8/2 D=64 scale=0.05")
    assert_close(res.as_numpy("LSE").reshape(lse_ref.shape), lse_ref, "FP32", "LSE", atol=1e-3, rtol=1e-4)


def test_attention_without_cu_seqlens_is_one_sequence(client):
    rng = np.random.default_rng(9)
    q = round_to(rng.standard_normal((12, 32, 128)), "FP16")
    k = round_to(rng.standard_normal((12, 8, 128)), "FP16")
    v = round_to(rng.standard_normal((12, 8, 128)), "FP16")
    res = client.infer("attention", [make_input(client, "Q", q, "FP16"), make_input(client, "K", k, "FP16"),
                                     make_input(client, "V", v, "FP16")], parameters={"causal": True})
    o_ref, _ = attention_ref(q, k, v, causal=True)
    assert_close(as_f32(res.as_numpy("O")).reshape(o_ref.shape), o_ref, "FP16", "attention, no CU_SEQLENS")


def one_key_attention(client, v_value, np_dtype):
    """Attention over a single key returns V itself (its softmax weight is exactly 1): O shows the
    BF16 value the server received for V, whatever the client did to it on the way."""
    ins = []
    for name, shape, value in (("Q", (1, 32, 128), 0.0), ("K", (1, 8, 128), 0.0), ("V", (1, 8, 128), v_value)):
        i = client.module.InferInput(name, list(shape), "BF16")
        i.set_data_from_numpy(np.full(shape, value, np_dtype))
        ins.append(i)
    res = client.infer("attention", ins)
    assert output_datatype(res, "O") == "BF16"
    return res.as_numpy("O")


def test_bf16_through_this_tritonclient(client):
    """What docs/protocol.md tells tritonclient users about BF16, checked on the client installed:
    which numpy dtype it takes, what it does to a float32 value between two BF16 values, and what
    BF16 outputs come back as."""
    x = 1 + 3 * 2.0 ** -9                  # float32; the BF16 values around it: 1 and 1 + 2**-7 (nearer)
    nearest, truncated = 1 + 2.0 ** -7, 1.0
    if BF16_NATIVE:                         # tritonclient >= 2.70
        import ml_dtypes
        with pytest.raises(InferenceServerException, match="ml_dtypes.bfloat16"):
            client.module.InferInput("V", [1], "BF16").set_data_from_numpy(np.array([x], np.float32))
        o = one_key_attention(client, x, ml_dtypes.bfloat16)
        assert o.dtype == ml_dtypes.bfloat16, o.dtype
        assert set(o.astype(np.float32).ravel()) == {nearest}, "ml_dtypes rounds to nearest"
    else:                                   # tritonclient <= 2.69
        with pytest.raises(InferenceServerException, match="float32"):
            client.module.InferInput("V", [1], "BF16").set_data_from_numpy(np.array([x], np.float16))
        o = one_key_attention(client, x, np.float32)
        assert o.dtype == np.float32, o.dtype
        assert set(o.ravel()) == {truncated}, "tritonclient truncates float32 to BF16"
        # Rounded first (helpers.round_bf16), the value survives.
        assert set(one_key_attention(client, round_to(np.float32(x), "BF16"), np.float32).ravel()) == {nearest}


# ---- linear layers ---------------------------------------------------------------------------

def model_dir(model):
    hits = [d for d in glob.glob(os.path.join(DEMO_CACHE, "**", model), recursive=True) if os.path.isdir(d)]
    assert hits, f"{model} not found under {DEMO_CACHE}"
    return hits[0]


def linear(client, model, x, dtype):
    res = client.infer(model, [make_input(client, "X", x, dtype)])
    y = as_f32(res.as_numpy("Y"))
    assert output_datatype(res, "Y") == dtype, f"{model}: Y datatype {output_datatype(res, 'Y')}, X {dtype}"
    return y


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
@pytest.mark.parametrize("model", ["up_proj_bf16", "down_proj_bf16"])
def test_bf16_linear_matches_float64(client, model, dtype):
    k, n = LINEAR[model]
    rng = np.random.default_rng(11)
    x = round_to(rng.standard_normal((3, k)), dtype)
    y = linear(client, model, x, dtype)
    assert y.shape == (3, n)
    ref = x.astype(np.float64) @ linear_weight_bf16(model_dir(model), k, n)
    # FP32 accumulation over K, then one rounding to the output dtype.
    scale = np.sqrt(np.mean(ref ** 2))
    tol = {"FP16": 2e-3, "BF16": 1.6e-2}[dtype]
    assert_close(y, ref, dtype, f"{model} {dtype}", atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
@pytest.mark.parametrize("model", ["up_proj_int4", "down_proj_int4", "up_proj_fp8", "down_proj_fp8"])
def test_quantized_linear_matches_dequantized_reference(client, model, dtype):
    """Quantized layers against "dequantize, then plain GEMM" in float64 (the rule of
    CUTLASS example 55). W8A8 (fp8_activation: fp8) also quantizes X, so it gets a
    relative-norm bound instead of an elementwise one."""
    k, n = LINEAR[model]
    d = model_dir(model)
    rng = np.random.default_rng(14)
    x = round_to(rng.standard_normal((3, k)), dtype)
    y = linear(client, model, x, dtype)
    ref = x.astype(np.float64) @ linear_weight_dequant(d, k, n)
    if config_param(d, "fp8_activation", "bf16") == "fp8":
        rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert rel < 0.06, f"{model} W8A8 {dtype}: relative error {rel:.3g}"
    else:
        tol = 1.6e-2   # the dequantized weight may pass through the activation dtype
        assert_close(y, ref, dtype, f"{model} {dtype}", atol=tol * np.sqrt(np.mean(ref ** 2)), rtol=tol)


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
@pytest.mark.parametrize("model", list(LINEAR))
def test_linear_rows_independent_and_linear(client, model, dtype):
    """Every weight format: output rows do not depend on the other rows of the request
    (bitwise), and the layer is linear: Y(2X) == 2 Y(X) up to rounding."""
    k, n = LINEAR[model]
    rng = np.random.default_rng(12)
    x = round_to(rng.standard_normal((4, k)) * 0.5, dtype)
    y = linear(client, model, x, dtype)
    assert y.shape == (4, n) and np.isfinite(y).all()
    y_row = linear(client, model, x[2:3], dtype)
    np.testing.assert_array_equal(y_row[0], y[2], err_msg=f"{model}: row 2 alone differs from row 2 in a 4-row request")
    y2 = linear(client, model, x * 2, dtype)   # exact in FP16/BF16
    rel = np.linalg.norm(y2 - 2 * y) / np.linalg.norm(2 * y)
    assert rel < 2e-2, f"{model}: ||Y(2X) - 2Y(X)|| / ||2Y(X)|| = {rel:.3g}"
    assert np.linalg.norm(y) > 0


# ---- streaming -------------------------------------------------------------------------------

def test_stream_infer_matches_unary(server):
    rng = np.random.default_rng(13)
    c = grpcclient.InferenceServerClient(server.url)
    q = round_to(rng.standard_normal((3, 10, 32, 128)), "FP16")
    k = round_to(rng.standard_normal((3, 10, 8, 128)), "FP16")
    v = round_to(rng.standard_normal((3, 10, 8, 128)), "FP16")
    c.module = grpcclient

    def inputs(i):
        return [make_input(c, "Q", q[i], "FP16"), make_input(c, "K", k[i], "FP16"), make_input(c, "V", v[i], "FP16")]
    results = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    for i in range(3):
        c.async_stream_infer("attention", inputs(i), request_id=str(i), parameters={"causal": True})
    got = {}
    for _ in range(3):
        result, error = results.get(timeout=60)
        assert error is None, error
        got[result.get_response().id] = as_f32(result.as_numpy("O"))
    # An error inside the stream comes back as that request's error; the stream goes on.
    c.async_stream_infer("no_such_model", inputs(0), request_id="bad")
    result, error = results.get(timeout=60)
    assert error is not None and "no_such_model" in str(error)
    c.async_stream_infer("attention", inputs(0), request_id="again", parameters={"causal": True})
    result, error = results.get(timeout=60)
    assert error is None, error
    c.stop_stream()
    assert set(got) == {"0", "1", "2"}
    for i in range(3):
        unary = c.infer("attention", inputs(i), parameters={"causal": True}).as_numpy("O")
        np.testing.assert_array_equal(got[str(i)], unary)
        o_ref, _ = attention_ref(q[i], k[i], v[i], causal=True)
        assert_close(unary.reshape(o_ref.shape), o_ref, "FP16", f"streamed request {i}")
    c.close()


# ---- kv_attention ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
@pytest.mark.parametrize("seq_id", [4242, "chat-7"])
def test_kv_attention_sequence(client, dtype, seq_id):
    """Prefill 19 tokens, then 3 decode steps, the last with sequence_end. Each step's
    output is attention of its new queries over every cached token (causal)."""
    if isinstance(seq_id, int):
        seq_id += 10 * len(dtype) + (dtype == "BF16")
    else:
        seq_id = f"{seq_id}-{dtype}"
    rng = np.random.default_rng(hash(str(seq_id)) % 2**32)
    steps = [19, 1, 1, 1]
    ks, vs = [], []
    for i, n in enumerate(steps):
        q = round_to(rng.standard_normal((n, 32, 128)), dtype)
        k = round_to(rng.standard_normal((n, 8, 128)), dtype)
        v = round_to(rng.standard_normal((n, 8, 128)), dtype)
        ks.append(k)
        vs.append(v)
        res = client.infer("kv_attention", [make_input(client, "Q", q, dtype), make_input(client, "K", k, dtype),
                                            make_input(client, "V", v, dtype)],
                           sequence_id=seq_id, sequence_start=(i == 0), sequence_end=(i == len(steps) - 1))
        o = as_f32(res.as_numpy("O"))
        o_ref, _ = attention_ref(q, np.concatenate(ks), np.concatenate(vs), causal=True)
        assert_close(o.reshape(o_ref.shape), o_ref, dtype, f"kv_attention step {i} ({n} tokens)")
    # Ended: the id can be started again.
    res = client.infer("kv_attention", [make_input(client, "Q", q, dtype), make_input(client, "K", k, dtype), make_input(client, "V", v, dtype)],
                       sequence_id=seq_id, sequence_start=True, sequence_end=True)
    o_ref, _ = attention_ref(q, k, v, causal=True)
    assert_close(as_f32(res.as_numpy("O")).reshape(o_ref.shape), o_ref, dtype, "kv_attention restarted sequence")
