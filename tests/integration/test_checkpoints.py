"""Linear models served from Hugging Face checkpoint folders, written here the way AutoGPTQ,
GPTQModel, AutoAWQ, LLM Compressor (compressed-tensors) and AutoFP8 write them
(tools/hf_checkpoint.py): sharded files with an index, prefixed tensor names and the
quantization metadata. One server loads every format through config.pbtxt files that name
a folder and a tensor prefix; each model runs through tritonclient and is compared with a
float64 reference built from the integers and scales chosen here. Covers the GPTQ v1/v2
zero-point trap both ways, fused projections, bias, FP8 static and dynamic activation
scales, and a refusal that stops the server at start-up naming the tensor."""
import pathlib
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, TEST_TMP, ServerProcess

sys.path.insert(0, str(ROOT / "tools"))
import hf_checkpoint as hf  # noqa: E402

K, N = 256, 192  # every layer here: X [M, 256] -> Y [M, 192] unless fused
M = 5


def _param(k, v):
    return f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'


def model_config(name, params, k=-1, n=-1):
    """A linear model's config.pbtxt; dims -1 let the checkpoint say K and N."""
    return (f'name: "{name}"\nmax_batch_size: 0\n'
            f'input [ {{ name: "X" data_type: TYPE_FP16 dims: [ -1, {k} ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP16 dims: [ -1, {n} ] }} ]\n'
            + _param("kind", "linear") + "".join(_param(a, b) for a, b in params.items()))


def prefix(layer, proj):
    group = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return f"model.layers.{layer}.{group}.{proj}"


# ---- references ------------------------------------------------------------------------------

_E4M3 = hf.fp8_e4m3_table()
_E4M3_POS = np.unique(_E4M3[(~np.isnan(_E4M3)) & (_E4M3 >= 0)])


def e4m3_round(v):
    """Round to the nearest E4M3 value, saturating at 448 (ties are measure-zero here)."""
    a = np.minimum(np.abs(v), 448.0)
    i = np.clip(np.searchsorted(_E4M3_POS, a), 1, len(_E4M3_POS) - 1)
    lo, hi = _E4M3_POS[i - 1], _E4M3_POS[i]
    return np.sign(v) * np.where(a - lo <= hi - a, lo, hi)


def reference(x, case):
    """float64 Y for x [M, K] (already FP16-exact)."""
    x = x.astype(np.float64)
    act = case.get("act")
    if act == "static":
        s = case["input_scale"]
        x = e4m3_round(x / s) * s
    elif act == "dynamic":
        s = (np.abs(x).max(axis=1, keepdims=True).astype(np.float32) / np.float32(448)).astype(np.float64)
        x = e4m3_round(x / s) * s
    y = x @ case["w"].T
    if case.get("bias") is not None:
        y = y + case["bias"]
    return y


# ---- the repository --------------------------------------------------------------------------

def _bias(rng, n):
    return rng.uniform(-0.5, 0.5, n).astype(np.float16)


def build(root):
    """Writes the checkpoint folders under root/hf and one model folder per case.
    Returns {model: case} with case["w"] float64 [N, K] and optional bias / act."""
    rng = np.random.default_rng(4242)
    hf_root = root / "hf"
    cases = {}

    def add(name, ckpt, tensor, case, **params):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        p = {"checkpoint": f"../hf/{ckpt}", "tensor": tensor, **params}
        n, k = case["w"].shape
        (d / "config.pbtxt").write_text(model_config(name, p, k, n))
        cases[name] = case

    # GPTQ v1 (AutoGPTQ), symmetric, act-order, group 64, sharded in three files: the trap's
    # first half (v1 metadata, v1 zeros), and a fused q,k,v with bias (Qwen-style).
    tensors, layers = {}, {}
    for layer in range(2):
        for proj, n in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64), ("up_proj", N)):
            lay = hf.random_int4(rng, K, n, 64, sym=True, act_order=True)
            if proj in ("k_proj", "v_proj"):
                # One act-order per layer input: GPTQ's Hessian is shared by q, k and v.
                g_idx = layers[(layer, "q_proj")]["g_idx"]
                lay["g_idx"] = g_idx
                lay["w"] = (lay["q"] - lay["zeros"][:, g_idx]) * lay["scales"][:, g_idx]
            layers[(layer, proj)] = lay
            for t, v in hf.gptq_tensors(lay, v1=True).items():
                tensors[f"{prefix(layer, proj)}.{t}"] = v
            if proj in ("q_proj", "k_proj", "v_proj"):
                b = _bias(rng, n)
                lay["bias"] = b.astype(np.float64)
                tensors[f"{prefix(layer, proj)}.bias"] = hf.T("F16", b)
    qc = hf.gptq_config(group=64, desc_act=True, sym=True, v2=False)
    hf.save_folder(hf_root / "gptq-v1", tensors, shards=3, config=hf.llama_config(K, N, 2, quantization_config=qc),
                   quantize_config=qc)
    for layer in range(2):
        lay = layers[(layer, "up_proj")]
        add(f"gptq_v1_sym_act_order_l{layer}", "gptq-v1", prefix(layer, "up_proj"), {"w": lay["w"]})
    parts = [layers[(1, p)] for p in ("q_proj", "k_proj", "v_proj")]
    add("gptq_qkv_proj_bias", "gptq-v1", ",".join(prefix(1, p) for p in ("q_proj", "k_proj", "v_proj")),
        {"w": np.concatenate([p["w"] for p in parts]), "bias": np.concatenate([p["bias"] for p in parts])})

    # The trap's second half: metadata says "gptq" (v1) but the symmetric zeros are stored as
    # 8 (v2), as some GPTQModel versions write them. Detection must load them as v2.
    lay = hf.random_int4(rng, K, N, 128, sym=True)
    qc = hf.gptq_config(group=128, sym=True, v2=False)
    hf.save_folder(hf_root / "gptq-v2-zeros-v1-metadata",
                   {f"{prefix(0, 'down_proj')}.{t}": v for t, v in hf.gptq_tensors(lay, v1=False).items()},
                   config=hf.llama_config(K, N, 1, quantization_config=qc), quantize_config=qc)
    add("gptq_trap_v2_zeros_gptq_metadata", "gptq-v2-zeros-v1-metadata", prefix(0, "down_proj"), {"w": lay["w"]})

    # GPTQModel gptq_v2, asymmetric (zeros 1..15), group 128; and v1 asymmetric, group 32;
    # and channelwise (group_size -1), each from quantize_config.json alone.
    for name, group, v2 in (("gptq_v2_asym", 128, True), ("gptq_v1_asym_g32", 32, False), ("gptq_v2_channelwise", -1, True)):
        lay = hf.random_int4(rng, K, N, group, sym=False)
        qc = hf.gptq_config(group=group, sym=False, v2=v2)
        hf.save_folder(hf_root / name, {f"{prefix(0, 'o_proj')}.{t}": v
                                        for t, v in hf.gptq_tensors(lay, v1=not v2).items()},
                       quantize_config=qc)
        add(name, name, prefix(0, "o_proj"), {"w": lay["w"]})

    # AutoAWQ GEMM, group 64, metadata in config.json only.
    lay = hf.random_int4(rng, K, N, 64, sym=False)
    hf.save_folder(hf_root / "awq", {f"{prefix(0, 'gate_proj')}.{t}": v for t, v in hf.awq_tensors(lay).items()},
                   config=hf.llama_config(K, N, 1, quantization_config=hf.awq_config(64)))
    add("awq_gemm", "awq", prefix(0, "gate_proj"), {"w": lay["w"]})

    # compressed-tensors pack-quantized: symmetric uint4b8 (group 128, BF16 scales), asymmetric
    # with act-order (group 64, F16 scales), channelwise.
    for name, group, sym, act_order, sdt in (("ct_w4a16_sym", 128, True, False, "BF16"),
                                             ("ct_w4a16_asym_act_order", 64, False, True, "F16"),
                                             ("ct_w4a16_channel", -1, True, False, "BF16")):
        lay = hf.with_scale_dtype(hf.random_int4(rng, K, N, group, sym=sym, act_order=act_order), sdt)
        cfg = hf.ct_int4_config(group=group, sym=sym, actorder="group" if act_order else None)
        hf.save_folder(hf_root / name, {f"{prefix(0, 'up_proj')}.{t}": v for t, v in
                                        hf.pack_quantized_tensors(lay, sym, act_order, sdt).items()},
                       shards=2, config=hf.llama_config(K, N, 1, quantization_config=cfg, dtype="bfloat16"))
        add(name, name, prefix(0, "up_proj"), {"w": lay["w"]})

    # compressed-tensors FP8_DYNAMIC: per-channel BF16 scales [N, 1], dynamic per-token
    # activations (W8A8); and static per-tensor activation scales with a [1] input_scale.
    t, w = hf.random_fp8(rng, K, N, per_channel=True, scale_dtype="BF16", channel_shape_2d=True)
    hf.save_folder(hf_root / "ct-fp8-dynamic", {f"{prefix(0, 'up_proj')}.{a}": b for a, b in t.items()},
                   config=hf.llama_config(K, N, 1, quantization_config=hf.ct_fp8_config("channel", "dynamic")))
    add("ct_fp8_dynamic", "ct-fp8-dynamic", prefix(0, "up_proj"), {"w": w, "act": "dynamic"})
    t, w = hf.random_fp8(rng, K, N, per_channel=False)
    t["weight_scale"] = hf.T("F32", t["weight_scale"].array.reshape(1))
    t["input_scale"] = hf.T("F32", np.array([0.05], np.float32))
    hf.save_folder(hf_root / "ct-fp8-static", {f"{prefix(0, 'up_proj')}.{a}": b for a, b in t.items()},
                   config=hf.llama_config(K, N, 1, quantization_config=hf.ct_fp8_config("tensor", "static")))
    add("ct_fp8_static", "ct-fp8-static", prefix(0, "up_proj"), {"w": w, "act": "static", "input_scale": 0.05})

    # AutoFP8 / vLLM "fp8", static: scalar weight_scale and input_scale per projection. gate and
    # up fused into gate_up_proj (different weight and input scales), and down alone served as
    # W8A16 through the fp8_activation parameter (an override the server logs).
    tensors, ws, scales = {}, {}, {"gate_proj": 0.04, "up_proj": 0.06, "down_proj": 0.05}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        t, ws[proj] = hf.random_fp8(rng, K, N, per_channel=False)
        t["input_scale"] = hf.T("F32", np.array(scales[proj], np.float32), [])
        tensors.update({f"{prefix(0, proj)}.{a}": b for a, b in t.items()})
    hf.save_folder(hf_root / "fp8-static", tensors, shards=2,
                   config=hf.llama_config(K, N, 1, quantization_config=hf.fp8_config("static")))
    add("fp8_gate_up_proj_static", "fp8-static", f"{prefix(0, 'gate_proj')},{prefix(0, 'up_proj')}",
        {"w": np.concatenate([ws["gate_proj"], ws["up_proj"]]), "act": "static", "input_scale": 0.06})
    add("fp8_down_proj_w8a16", "fp8-static", prefix(0, "down_proj"), {"w": ws["down_proj"]}, fp8_activation="bf16")

    # A dense BF16 folder (no quantization_config), one file named directly.
    wd = rng.standard_normal((N, K)) / np.sqrt(K)
    bits = hf.bf16_bits(wd)
    hf.save_folder(hf_root / "dense", {f"{prefix(0, 'o_proj')}.weight": hf.T("BF16", bits)},
                   config=hf.llama_config(K, N, 1, dtype="bfloat16"))
    d = root / "dense_single_file"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(model_config("dense_single_file", {
        "checkpoint": "../hf/dense/model.safetensors", "tensor": prefix(0, "o_proj")}, K, N))
    cases["dense_single_file"] = {"w": hf.from_bf16_bits(bits).astype(np.float64)}
    return cases


@pytest.fixture(scope="module")
def repo():
    root = pathlib.Path(TEST_TMP) / "checkpoints-repo"
    import shutil
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root, build(root)


@pytest.fixture(scope="module")
def ckpt_server(start_server, repo):
    root, _ = repo
    return start_server(f"--model-repository={root}", name="checkpoints")


def run(url, model, x):
    c = grpcclient.InferenceServerClient(url)
    try:
        i = grpcclient.InferInput("X", list(x.shape), "FP16")
        i.set_data_from_numpy(x.astype(np.float16))
        return c.infer(model, [i], client_timeout=60).as_numpy("Y").astype(np.float64)
    finally:
        c.close()


MODELS = ["gptq_v1_sym_act_order_l0", "gptq_v1_sym_act_order_l1", "gptq_qkv_proj_bias",
          "gptq_trap_v2_zeros_gptq_metadata", "gptq_v2_asym", "gptq_v1_asym_g32", "gptq_v2_channelwise", "awq_gemm",
          "ct_w4a16_sym", "ct_w4a16_asym_act_order", "ct_w4a16_channel", "ct_fp8_dynamic", "ct_fp8_static",
          "fp8_gate_up_proj_static", "fp8_down_proj_w8a16", "dense_single_file"]


@pytest.mark.parametrize("model", MODELS)
def test_checkpoint_round_trip(ckpt_server, repo, model):
    _, cases = repo
    case = cases[model]
    rng = np.random.default_rng(7 + MODELS.index(model))
    x = rng.standard_normal((M, case["w"].shape[1])).astype(np.float16)
    y = run(ckpt_server.url, model, x)
    ref = reference(x, case)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    # FP32 accumulation over K, one FP16 rounding (bias adds one more): relative to the rms. BF16
    # weights run as a BF16 GEMM on the CUDA backend, which rounds X to BF16 on the way: bf16's
    # half unit, twice (the conformance test's bound for the same path).
    tol = 1.6e-2 if model == "dense_single_file" else 4e-3
    err = np.abs(y - ref)
    bound = tol * np.sqrt(np.mean(ref ** 2)) + tol * np.abs(ref)
    assert (err <= bound).all(), (f"{model}: {(err > bound).sum()} of {err.size} out of tolerance, "
                                  f"worst {err.max():.3g} (rms {np.sqrt(np.mean(ref ** 2)):.3g})")


def test_v2_zeros_under_gptq_metadata_are_detected_and_logged(ckpt_server):
    log = open(ckpt_server.log_path, errors="replace").read()
    lines = [l for l in log.splitlines() if "gptq_trap_v2_zeros_gptq_metadata" in l and "gptq_v2" in l]
    assert lines, f"no note about the v2 zero points:\n{log[-3000:]}"
    assert "stored as 8" in lines[0], lines[0]
    # The v1 checkpoint with v1 zeros loads without any such note.
    assert not [l for l in log.splitlines() if "gptq_v1_sym_act_order_l0:" in l and "zero points" in l]


def test_fp8_activation_override_is_logged(ckpt_server):
    log = open(ckpt_server.log_path, errors="replace").read()
    assert any("fp8_down_proj_w8a16" in l and "overrides" in l and "W8A16" in l for l in log.splitlines()), log[-3000:]


def test_refused_checkpoint_stops_start_naming_the_tensor(tmp_dir):
    """A checkpoint missing a tensor the metadata needs (act-order's g_idx) stops the server
    before it reports ready, with a message naming the tensor."""
    rng = np.random.default_rng(5)
    lay = hf.random_int4(rng, K, N, 64, sym=True, act_order=True)
    qc = hf.gptq_config(group=64, desc_act=True, sym=True)
    hf.save_folder(tmp_dir / "hf", {f"{prefix(3, 'up_proj')}.{t}": v
                                    for t, v in hf.gptq_tensors(lay, v1=True, with_g_idx=False).items()},
                   quantize_config=qc)
    (tmp_dir / "m").mkdir()
    (tmp_dir / "m" / "config.pbtxt").write_text(model_config("m", {"checkpoint": "../hf", "tensor": prefix(3, "up_proj")}))
    s = ServerProcess([f"--model-repository={tmp_dir}"], name="refused-checkpoint")
    with pytest.raises(AssertionError) as e:
        s.start(timeout=60)
    s.stop()
    assert "model.layers.3.mlp.up_proj.g_idx" in str(e.value), str(e.value)
    assert "desc_act" in str(e.value), str(e.value)


def test_make_repository_writes_servable_configs(start_server, repo, tmp_dir):
    """tools/make_repository.py: one model per chosen layer and projection, fused ones from
    their parts; the server loads them and they compute what the checkpoint holds."""
    import subprocess
    root, cases = repo
    out = tmp_dir / "generated"
    r = subprocess.run([sys.executable, str(ROOT / "tools/make_repository.py"), str(root / "hf" / "gptq-v1"), str(out),
                        "--layers", "1", "--projections", "qkv_proj,up_proj", "--relative"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["layer1_qkv_proj", "layer1_up_proj"]
    assert 'dims: [ -1, 256 ]' in (out / "layer1_qkv_proj" / "config.pbtxt").read_text()
    s = start_server(f"--model-repository={out}", name="generated-repo")
    for model, case in (("layer1_qkv_proj", cases["gptq_qkv_proj_bias"]), ("layer1_up_proj", cases["gptq_v1_sym_act_order_l1"])):
        x = np.random.default_rng(3).standard_normal((M, K)).astype(np.float16)
        y, ref = run(s.url, model, x), reference(x, case)
        assert np.abs(y - ref).max() <= 4e-3 * (np.sqrt(np.mean(ref ** 2)) + np.abs(ref).max()), model
    bad = subprocess.run([sys.executable, str(ROOT / "tools/make_repository.py"), str(root / "hf" / "awq"), str(out),
                          "--projections", "q_proj"], capture_output=True, text=True)
    assert bad.returncode != 0 and "q_proj is not in the checkpoint" in bad.stderr, bad.stderr
