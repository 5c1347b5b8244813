"""Hugging Face checkpoint folders written the way the quantization tools write them, with
numpy and the `safetensors` package (the same serializer transformers uses).

Each packer follows its tool's published format definition:
  AutoGPTQ / GPTQModel (QuantLinear.pack): qweight int32 [ceil(K/8), N], input channel k in
    nibble k % 8 of row k // 8 (low nibble first); qzeros int32 [G, N/8], column n in nibble
    n % 8 of word n // 8, holding zero - 1 for checkpoint_format "gptq" (v1) and the zero
    itself for "gptq_v2"; scales float16 [G, N]; g_idx int32 [K] (the group of each input
    channel; act-order permutes it).
  AutoAWQ (WQLinear_GEMM.from_linear): qweight int32 [K, N/8], output columns 8c..8c+7 of
    row k in word c, nibble i holding column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]; qzeros int32
    [G, N/8] in the same order (zero stored as is); scales float16 [G, N].
  compressed-tensors pack-quantized (pack_to_int32, num_bits 4): signed int4 values
    stored + 8, eight per int32, element i of a run in nibble i % 8; weight_packed int32
    [N, ceil(K/8)] runs along K, weight_zero_point int32 [ceil(N/8), G] along N (asymmetric
    only); weight_scale [N, G] in the model's dtype; weight_shape int64 [2];
    weight_g_idx int32 [K] with act-order.
  FP8 (AutoFP8 / vLLM "fp8", compressed-tensors float-quantized): weight float8_e4m3fn
    [N, K], weight_scale float32 [] (per tensor) or [N, 1] (per channel), input_scale [] or
    [1] for static activation scales.
Sharded folders follow transformers' save_pretrained: model-0000i-of-0000n.safetensors and
model.safetensors.index.json {"metadata": {"total_size": bytes}, "weight_map": {...}}.

Quantized values here are integers the caller chose (q in 0..15, zeros in 0..15), so a
float64 reference of the dequantized weight is exact: W[n, k] = (q - zero) * scale.
"""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file

# safetensors dtype -> the name the serializer takes (torch's names).
_SPEC_DTYPE = {"I32": "int32", "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
               "F8_E4M3": "float8_e4m3fn", "U8": "uint8", "I8": "int8"}
_ITEMSIZE = {"I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "I8": 1}

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


class T:
    """A tensor to write: its safetensors dtype, shape and an array holding its bytes (BF16 as
    uint16 bit patterns, F8_E4M3 as uint8 codes)."""

    def __init__(self, dtype, array, shape=None):
        self.dtype = dtype
        self.array = np.ascontiguousarray(array)
        self.shape = list(self.array.shape if shape is None else shape)
        assert self.array.nbytes == _ITEMSIZE[dtype] * int(np.prod(self.shape, dtype=np.int64)), (dtype, self.shape)

    @property
    def nbytes(self):
        return self.array.nbytes


def save_file(path, tensors, metadata=None):
    """tensors: {name: T}. Written by the safetensors serializer, as torch's save_file does."""
    specs = {name: TensorSpec(dtype=_SPEC_DTYPE[t.dtype], shape=t.shape, data_ptr=t.array.ctypes.data,
                              data_len=t.nbytes) for name, t in tensors.items()}
    serialize_file(specs, str(path), metadata=metadata or {"format": "pt"})


def save_folder(folder, tensors, shards=1, config=None, quantize_config=None, extra_files=None):
    """A checkpoint folder: model.safetensors (shards == 1) or `shards` files plus the index.
    Tensors are split across shards in name order, as save_pretrained fills them."""
    os.makedirs(folder, exist_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file(os.path.join(folder, "model.safetensors"), tensors)
    else:
        total = sum(t.nbytes for t in tensors.values())
        per = -(-total // shards)
        groups, cur, size = [], [], 0
        for n in names:
            cur.append(n)
            size += tensors[n].nbytes
            if size >= per and len(groups) < shards - 1:
                groups.append(cur)
                cur, size = [], 0
        groups.append(cur)
        while len(groups) < shards:
            groups.append([])
        weight_map = {}
        for i, g in enumerate(groups):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file(os.path.join(folder, fname), {n: tensors[n] for n in g})
            weight_map.update({n: fname for n in g})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    if quantize_config is not None:
        with open(os.path.join(folder, "quantize_config.json"), "w") as f:
            json.dump(quantize_config, f, indent=2)
    for name, text in (extra_files or {}).items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)


# ---- bit helpers -------------------------------------------------------------------------

def bf16_bits(x):
    """uint16 BF16 bit patterns of float values, rounded to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(u16):
    return (np.asarray(u16, np.uint16).astype(np.uint32) << 16).view(np.float32)


def fp8_e4m3_table():
    """float64 value of every E4M3 (fn) code; 0x7f / 0xff are NaN."""
    b = np.arange(256)
    s = np.where(b >> 7, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    return s * np.where((e == 15) & (m == 7), np.nan, v)


def pack_rows(values, axis):
    """Packs 4-bit values (0..15) eight to an int32 along `axis`, element i of each run of
    eight in nibble i (low first), padding the axis to a multiple of 8 with zeros."""
    v = np.moveaxis(np.asarray(values, np.uint32), axis, -1)
    pad = -v.shape[-1] % 8
    if pad:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,), np.uint32)], axis=-1)
    v = v.reshape(v.shape[:-1] + (-1, 8))
    words = np.zeros(v.shape[:-1], np.uint32)
    for i in range(8):
        words |= v[..., i] << np.uint32(4 * i)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis)).view(np.int32)


# ---- random int4 layers ---------------------------------------------------------------------

def random_int4(rng, k, n, group, sym, act_order=False):
    """q [N, K] in 0..15, zeros [N, G], scales [N, G] (float16-exact), g_idx [K]; W float64
    [N, K] = (q - zeros[:, g_idx]) * scales[:, g_idx]. group -1: channelwise."""
    gs = k if group == -1 else group
    g = -(-k // gs)
    q = rng.integers(0, 16, (n, k))
    zeros = np.full((n, g), 8) if sym else rng.integers(1, 16, (n, g))
    scales = (rng.uniform(0.5, 1.5, (n, g)) / (8 * np.sqrt(k))).astype(np.float16).astype(np.float64)
    g_idx = np.arange(k) // gs
    if act_order:
        g_idx = np.argsort(rng.permutation(k)) // gs  # a permutation: every group keeps gs channels
    w = (q - zeros[:, g_idx]) * scales[:, g_idx]
    return dict(q=q, zeros=zeros, scales=scales, g_idx=g_idx.astype(np.int32), w=w, group=gs)


def with_scale_dtype(layer, dtype):
    """The layer with its scales rounded to what `dtype` stores (BF16 keeps 8 bits), W to match."""
    if dtype == "BF16":
        layer = dict(layer)
        layer["scales"] = from_bf16_bits(bf16_bits(layer["scales"])).astype(np.float64)
        g = layer["g_idx"]
        layer["w"] = (layer["q"] - layer["zeros"][:, g]) * layer["scales"][:, g]
    return layer


def gptq_tensors(layer, v1, with_g_idx=True):
    """AutoGPTQ's pack (v1: zeros stored minus one) or GPTQModel's gptq_v2."""
    q, zeros, scales = layer["q"], layer["zeros"], layer["scales"]
    stored = (zeros - 1) if v1 else zeros
    assert stored.min() >= 0 and stored.max() <= 15, "v1 cannot store a zero point of 0"
    out = {"qweight": T("I32", pack_rows(q.T, axis=0)),                # [ceil(K/8), N]
           "qzeros": T("I32", pack_rows(stored.T, axis=1)),            # [G, N/8]
           "scales": T("F16", scales.T.astype(np.float16))}            # [G, N]
    if with_g_idx:
        out["g_idx"] = T("I32", layer["g_idx"])
    return out


def awq_tensors(layer):
    q, zeros, scales = layer["q"], layer["zeros"], layer["scales"]

    def interleave(a):  # [rows, N] -> nibble i of word c holds column 8c + AWQ_ORDER[i]
        return a.reshape(a.shape[0], -1, 8)[..., AWQ_ORDER].reshape(a.shape)
    return {"qweight": T("I32", pack_rows(interleave(q.T), axis=1)),     # [K, N/8]
            "qzeros": T("I32", pack_rows(interleave(zeros.T), axis=1)),  # [G, N/8]
            "scales": T("F16", scales.T.astype(np.float16))}             # [G, N]


def pack_quantized_tensors(layer, sym, act_order=False, scale_dtype="BF16"):
    """compressed-tensors pack-quantized: stored nibble = signed value + 8, i.e. q itself for
    weights and the zero point for zeros (signed zero point = zero - 8)."""
    q, zeros, scales = layer["q"], layer["zeros"], layer["scales"]
    n, k = q.shape
    sc = bf16_bits(scales) if scale_dtype == "BF16" else scales.astype(np.float16 if scale_dtype == "F16" else np.float32)
    out = {"weight_packed": T("I32", pack_rows(q, axis=1)),           # [N, ceil(K/8)]
           "weight_scale": T(scale_dtype, sc),                        # [N, G]
           "weight_shape": T("I64", np.array([n, k], np.int64))}
    if not sym:
        out["weight_zero_point"] = T("I32", pack_rows(zeros, axis=0))  # [ceil(N/8), G]
    if act_order:
        out["weight_g_idx"] = T("I32", layer["g_idx"])
    return out


def random_fp8(rng, k, n, per_channel, scale_dtype="F32", channel_shape_2d=False):
    """E4M3 codes with |value| <= 15 (no NaN, no saturation), a scale per tensor or channel.
    W float64 [N, K]."""
    codes = (rng.integers(0, 0x58, (n, k)) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)
    scale = rng.uniform(0.5, 1.5, n if per_channel else 1) / (4 * np.sqrt(k))
    if scale_dtype == "BF16":
        bits = bf16_bits(scale)
        scale = from_bf16_bits(bits).astype(np.float64)
        stored = bits
    else:
        scale = scale.astype(np.float32).astype(np.float64)
        stored = scale.astype(np.float32)
    shape = ([n, 1] if channel_shape_2d else [n]) if per_channel else []
    w = fp8_e4m3_table()[codes] * scale.reshape(-1, 1)
    return {"weight": T("F8_E4M3", codes), "weight_scale": T(scale_dtype, stored.reshape(shape), shape)}, w


# ---- metadata ---------------------------------------------------------------------------------

def llama_config(hidden, intermediate, layers, heads=32, kv_heads=8, quantization_config=None, dtype="float16"):
    """config.json of a Llama-shaped model, as transformers writes it."""
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
         "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
         "num_key_value_heads": kv_heads, "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": dtype,
         "vocab_size": 128256, "transformers_version": "4.46.0"}
    if quantization_config is not None:
        c["quantization_config"] = quantization_config
    return c


def gptq_config(group=128, desc_act=False, sym=True, v2=False):
    """quantize_config.json of AutoGPTQ (v1) / GPTQModel (gptq_v2); the same object goes into
    config.json's quantization_config."""
    return {"bits": 4, "group_size": group, "damp_percent": 0.01, "desc_act": desc_act, "static_groups": False,
            "sym": sym, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
            "quant_method": "gptq", "checkpoint_format": "gptq_v2" if v2 else "gptq"}


def awq_config(group=128):
    return {"quant_method": "awq", "zero_point": True, "group_size": group, "bits": 4, "version": "gemm",
            "modules_to_not_convert": None}


def ct_int4_config(group=128, sym=True, actorder=None):
    """compressed-tensors W4A16 (group, or channel when group is -1) as LLM Compressor saves it."""
    weights = {"num_bits": 4, "type": "int", "symmetric": sym, "dynamic": False, "observer": "minmax",
               "observer_kwargs": {}, "block_structure": None, "actorder": actorder,
               "strategy": "channel" if group == -1 else "group", "group_size": None if group == -1 else group}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ["lm_head"], "kv_cache_scheme": None, "version": "0.9.1",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "pack-quantized"}}}


def ct_fp8_config(strategy="channel", activations="dynamic"):
    """compressed-tensors float-quantized: FP8_DYNAMIC (per-channel weights, dynamic per-token
    activations), static per-tensor activations, or weight-only (activations None)."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy,
               "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax"}
    acts = None
    if activations == "dynamic":
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
    elif activations == "static":
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "version": "0.9.1",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": "float-quantized"}}}


def fp8_config(activation_scheme="static", weight_block_size=None):
    """vLLM's Fp8Config as AutoFP8 (and DeepSeek-V3, with weight_block_size) write it."""
    c = {"quant_method": "fp8", "activation_scheme": activation_scheme, "ignored_layers": ["lm_head"]}
    if weight_block_size is not None:
        c["weight_block_size"] = weight_block_size
        c["fmt"] = "e4m3"
    return c


# ---- reading (the repository writer) ----------------------------------------------------------

def read_header(path):
    """{name: {"dtype", "shape", "data_offsets"}} of a safetensors file, without its data."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def checkpoint_tensors(folder):
    """{tensor name: (file path, header entry)} of a checkpoint folder or file."""
    if os.path.isfile(folder):
        return {n: (folder, e) for n, e in read_header(folder).items()}
    index = os.path.join(folder, "model.safetensors.index.json")
    files = []
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = [f for f in sorted(os.listdir(folder)) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        p = os.path.join(folder, f)
        out.update({n: (p, e) for n, e in read_header(p).items()})
    return out


def read_tensor(path, entry):
    """The raw bytes of one tensor."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        a, b = entry["data_offsets"]
        f.seek(8 + n + a)
        return f.read(b - a)
