"""Helpers of the integration, reliability and conformance tests: dtype conversions, float64 references,
raw protobuf requests and Prometheus text parsing."""
import re
import time
import urllib.request

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

# ---- dtypes -------------------------------------------------------------------------

def round_bf16(x):
    """float32 array rounded to the nearest BF16 value (ties to even), as float32.
    tritonclient serializes BF16 by truncating float32; pre-rounded values survive exactly."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def bf16_bits(x):
    """Raw BF16 bytes (uint16 bit patterns) of a float32 array, rounded to nearest."""
    return (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16_bits(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    if dtype == "FP16":
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return round_bf16(np.asarray(x, np.float32))
    return np.asarray(x, np.float32)


def raw_bytes(x, dtype):
    """Row-major raw bytes of x in a KServe dtype."""
    if dtype == "FP16":
        return np.ascontiguousarray(x, np.float16).tobytes()
    if dtype == "BF16":
        return bf16_bits(x).tobytes()
    if dtype == "FP32":
        return np.ascontiguousarray(x, np.float32).tobytes()
    if dtype == "INT32":
        return np.ascontiguousarray(x, np.int32).tobytes()
    raise ValueError(dtype)


def decode_raw(raw, dtype, shape):
    if dtype == "FP16":
        a = np.frombuffer(raw, np.float16).astype(np.float32)
    elif dtype == "BF16":
        a = from_bf16_bits(np.frombuffer(raw, np.uint16))
    elif dtype == "FP32":
        a = np.frombuffer(raw, np.float32)
    else:
        raise ValueError(dtype)
    return a.reshape(shape)


# ---- float64 references -------------------------------------------------------------

def attention_ref(q, k, v, cu_q=None, cu_k=None, causal=False, scale=None):
    """Varlen attention in float64. q [total_q,Hq,D], k/v [total_k,Hkv,D]; GQA maps
    query head h to kv head h // (Hq/Hkv). Causal masks are aligned bottom-right
    (query i of a sequence with Lq queries and Lk keys sees keys j <= i + Lk - Lq),
    as in FlashAttention. Returns O [total_q,Hq,D] and LSE [Hq,total_q] (natural log)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    cu_q = [0, tq] if cu_q is None else list(cu_q)
    cu_k = [0, tk] if cu_k is None else list(cu_k)
    o = np.zeros_like(q)
    lse = np.zeros((hq, tq))
    g = hq // hkv
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        for h in range(hq):
            sc = scale * q[q0:q1, h, :] @ k[k0:k1, h // g, :].T  # (lq, lk)
            if causal:
                mask = np.arange(lk)[None, :] > (np.arange(lq)[:, None] + lk - lq)
                sc = np.where(mask, -np.inf, sc)
            m = sc.max(axis=1, keepdims=True)
            p = np.exp(sc - m)
            l = p.sum(axis=1, keepdims=True)
            o[q0:q1, h, :] = (p / l) @ v[k0:k1, h // g, :]
            lse[h, q0:q1] = (m + np.log(l))[:, 0]
    return o, lse


def assert_close(out, ref, dtype, what, atol=None, rtol=None):
    """|out - ref| <= atol + rtol*|ref|, with the reference rounded through the output
    dtype first (STYLE.md's tolerance rule)."""
    tol = {"FP32": 1e-4, "FP16": 2e-3, "BF16": 1.6e-2}[dtype]
    atol = tol if atol is None else atol
    rtol = tol if rtol is None else rtol
    ref_r = round_to(ref, dtype).astype(np.float64)
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    err = np.abs(out - ref_r)
    bound = atol + rtol * np.abs(ref_r)
    bad = err > bound
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} elements out of tolerance; worst "
                           f"|err|={err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)} "
                           f"(atol={atol}, rtol={rtol})")


# ---- raw protobuf requests ----------------------------------------------------------

def stub(url, max_message_bytes=256 << 20):
    ch = grpc.insecure_channel(url, options=[("grpc.max_send_message_length", max_message_bytes),
                                             ("grpc.max_receive_message_length", max_message_bytes)])
    return ch, service_pb2_grpc.GRPCInferenceServiceStub(ch)


def triton_inputs(client_module, arrays, datatype="FP16"):
    """tritonclient InferInputs of (name, array) pairs; client_module is tritonclient.grpc or .http."""
    inputs = []
    for name, a in arrays:
        i = client_module.InferInput(name, list(a.shape), datatype)
        i.set_data_from_numpy(a)
        inputs.append(i)
    return inputs


def infer_request(model, inputs, params=None, outputs=None, request_id=""):
    """inputs: list of (name, datatype, shape, raw_bytes). params: dict of name -> bool/int/float/str."""
    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, dt, shape, raw in inputs:
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(shape)
        req.raw_input_contents.append(raw)
    for name in outputs or []:
        req.outputs.add().name = name
    for key, val in (params or {}).items():
        p = req.parameters[key]
        if isinstance(val, bool):
            p.bool_param = val
        elif isinstance(val, int):
            p.int64_param = val
        elif isinstance(val, float):
            p.double_param = val
        else:
            p.string_param = str(val)
    return req


def output_array(resp, name):
    for i, o in enumerate(resp.outputs):
        if o.name == name:
            return decode_raw(resp.raw_output_contents[i], o.datatype, list(o.shape)), o.datatype
    raise KeyError(f"output {name} not in response (outputs: {[o.name for o in resp.outputs]})")


def attention_inputs(rng, lens_q, lens_k=None, hq=32, hkv=8, d=128, dtype="FP16", cu=True):
    """Random Q/K/V (already rounded to dtype) and the request inputs for `attention`."""
    lens_k = lens_q if lens_k is None else lens_k
    tq, tk = sum(lens_q), sum(lens_k)
    q = round_to(rng.standard_normal((tq, hq, d)), dtype)
    k = round_to(rng.standard_normal((tk, hkv, d)), dtype)
    v = round_to(rng.standard_normal((tk, hkv, d)), dtype)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    inputs = [("Q", dtype, [tq, hq, d], raw_bytes(q, dtype)),
              ("K", dtype, [tk, hkv, d], raw_bytes(k, dtype)),
              ("V", dtype, [tk, hkv, d], raw_bytes(v, dtype))]
    if cu:
        inputs += [("CU_SEQLENS_Q", "INT32", [len(cu_q)], cu_q.tobytes()),
                   ("CU_SEQLENS_K", "INT32", [len(cu_k)], cu_k.tobytes())]
    return (q, k, v, cu_q, cu_k), inputs


# ---- Prometheus text ----------------------------------------------------------------

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(metrics_url, timeout=10):
    """{(name, frozenset(labels.items())): value} and {name: type} from /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=timeout).read().decode()
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m:
            labels = frozenset(_LABEL.findall(m.group(3) or ""))
            samples[(m.group(1), labels)] = float(m.group(4))
    return samples, types


def metric(samples, name, **labels):
    """Sum of all samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, l), v in samples.items() if n == name and want <= set(l))


def wait_for(cond, timeout=10.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


# ---- demo weights -------------------------------------------------------------------

def read_safetensors(path):
    """{name: (dtype, shape, bytes)} from a safetensors file."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


def linear_tensors(model_dir):
    """The tensors of a linear model, {short name: (dtype, shape, bytes)}, and the quantization
    metadata that applies ({} for none): from the checkpoint its config names (a folder,
    sharded through its index, or a file) under its tensor prefix, else from the model
    folder's own safetensors file with bare names."""
    import glob
    import json
    import os
    ckpt = config_param(model_dir, "checkpoint")
    if ckpt is None:
        files = glob.glob(os.path.join(model_dir, "*.safetensors"))
        assert files, f"no safetensors in {model_dir}"
        return read_safetensors(files[0]), {}
    ckpt = os.path.normpath(os.path.join(model_dir, ckpt))
    prefix = config_param(model_dir, "tensor", "")
    folder = ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt)
    if os.path.isfile(ckpt):
        files = [ckpt]
    elif os.path.exists(os.path.join(ckpt, "model.safetensors.index.json")):
        weight_map = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))["weight_map"]
        files = sorted({os.path.join(ckpt, f) for t, f in weight_map.items() if t.startswith(prefix + ".")})
    else:
        files = glob.glob(os.path.join(ckpt, "*.safetensors"))
    out = {}
    for f in files:
        for name, v in read_safetensors(f).items():
            if name.startswith(prefix + "."):
                out[name[len(prefix) + 1:]] = v
    meta = {}
    if os.path.exists(os.path.join(folder, "config.json")):
        meta = json.load(open(os.path.join(folder, "config.json"))).get("quantization_config") or {}
    if not meta and os.path.exists(os.path.join(folder, "quantize_config.json")):
        meta = dict(json.load(open(os.path.join(folder, "quantize_config.json"))), quant_method="gptq")
    return out, meta


def linear_weight_bf16(model_dir, k, n):
    """The BF16 weight of a linear layer as float64 [K, N], whichever of [N, K] or [K, N]
    the file stores it in."""
    tensors, _ = linear_tensors(model_dir)
    for dt, shape, raw in tensors.values():
        if dt == "BF16" and len(shape) == 2 and sorted(shape) == sorted([k, n]):
            w = from_bf16_bits(np.frombuffer(raw, np.uint16)).reshape(shape).astype(np.float64)
            return w.T if shape == [n, k] else w
    raise AssertionError(f"no BF16 [{n},{k}] or [{k},{n}] tensor for {model_dir}")


def config_param(model_dir, key, default=None):
    """A string parameter of a config.pbtxt (parameters { key: "k" value { string_value: "v" } })."""
    import os
    text = open(os.path.join(model_dir, "config.pbtxt")).read()
    m = re.search(r'key\s*:\s*"' + re.escape(key) + r'"\s*value\s*:?\s*\{\s*string_value\s*:\s*"([^"]*)"', text)
    return m.group(1) if m else default


def _fp8_e4m3_table():
    b = np.arange(256)
    s = np.where(b >> 7, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return s * v


def linear_weight_dequant(model_dir, k, n):
    """The dequantized weight of a linear layer as float64 [K, N], from its checkpoint (or
    safetensors file) and config: bf16, gptq (W[k,n] = (q - z) * s), fp8 (W = fp8 * scale)."""
    t, meta = linear_tensors(model_dir)
    fmt = config_param(model_dir, "weight_format")
    if fmt is None:  # a checkpoint: its metadata and tensors say
        fmt = {"gptq": "gptq", "fp8": "fp8"}.get(meta.get("quant_method"), "bf16")
        if "weight" in t and t["weight"][0] == "F8_E4M3":
            fmt = "fp8"
    if fmt == "bf16":
        return linear_weight_bf16(model_dir, k, n)
    if fmt == "fp8":
        dt, shape, raw = t["weight"]
        assert dt == "F8_E4M3" and shape == [n, k], (dt, shape)
        w = _fp8_e4m3_table()[np.frombuffer(raw, np.uint8)].reshape(n, k)
        scale = np.frombuffer(t["weight_scale"][2], np.float32).astype(np.float64)
        w = w * (scale.reshape(-1, 1) if scale.size == n else scale.reshape(1, 1))
        return w.T
    if fmt == "gptq":
        group = int(config_param(model_dir, "group_size", str(meta.get("group_size", 128))))
        v1 = config_param(model_dir, "gptq_version",
                          "2" if meta.get("checkpoint_format") == "gptq_v2" else "1") == "1"
        qw = np.frombuffer(t["qweight"][2], np.int32).reshape(k // 8, n).view(np.uint32)
        qz = np.frombuffer(t["qzeros"][2], np.int32).reshape(-1, n // 8).view(np.uint32)
        sc = np.frombuffer(t["scales"][2], np.float16).reshape(-1, n).astype(np.float64)
        shifts = (4 * np.arange(8)).astype(np.uint32)
        q = ((qw[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(k, n).astype(np.float64)
        z = ((qz[:, :, None] >> shifts[None, None, :]) & 0xF).reshape(-1, n).astype(np.float64) + (1 if v1 else 0)
        g = (np.frombuffer(t["g_idx"][2], np.int32) if "g_idx" in t else np.arange(k) // group)
        return (q - z[g]) * sc[g]
    raise AssertionError(f"{model_dir}: weight_format {fmt} has no reference here")
