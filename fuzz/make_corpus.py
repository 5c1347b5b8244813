#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/request_fuzzer.cc: serialized ModelInferRequest
messages as real clients send them (tritonclient's protobuf classes), for the fuzzer's
small models: attention (head dims 8/16), kv_attention (4/2 heads, D=8), lin (K=16).
Valid requests of every shape family plus a few typical mistakes.

    .venv/bin/python fuzz/make_corpus.py fuzz/corpus
"""
import hashlib
import pathlib
import sys

import numpy as np
from tritonclient.grpc import service_pb2

rng = np.random.default_rng(7)


def tensor(req, name, arr, dtype, raw=True):
    t = req.inputs.add()
    t.name = name
    t.datatype = dtype
    t.shape.extend(arr.shape)
    if dtype == "FP16":
        b = arr.astype(np.float16).tobytes()
    elif dtype == "BF16":
        b = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    elif dtype == "FP32":
        if not raw:
            t.contents.fp32_contents.extend(arr.astype(np.float32).ravel().tolist())
            return
        b = arr.astype(np.float32).tobytes()
    elif dtype == "INT32":
        if not raw:
            t.contents.int_contents.extend(arr.astype(np.int32).ravel().tolist())
            return
        b = arr.astype(np.int32).tobytes()
    req.raw_input_contents.append(b)


def attention(tq, tk, hq, hkv, d, dtype="FP16", cu_q=None, cu_k=None, causal=None, scale=None, lse=False, rid=""):
    r = service_pb2.ModelInferRequest(model_name="attention", id=rid)
    tensor(r, "Q", rng.standard_normal((tq, hq, d)), dtype)
    tensor(r, "K", rng.standard_normal((tk, hkv, d)), dtype)
    tensor(r, "V", rng.standard_normal((tk, hkv, d)), dtype)
    if cu_q is not None:
        tensor(r, "CU_SEQLENS_Q", np.array(cu_q), "INT32")
    if cu_k is not None:
        tensor(r, "CU_SEQLENS_K", np.array(cu_k), "INT32")
    if causal is not None:
        r.parameters["causal"].bool_param = causal
    if scale is not None:
        r.parameters["softmax_scale"].double_param = scale
    if lse:
        r.outputs.add().name = "O"
        r.outputs.add().name = "LSE"
    return r


def kv(n, seq, start=False, end=False, dtype="FP16", string_id=False):
    r = service_pb2.ModelInferRequest(model_name="kv_attention")
    tensor(r, "Q", rng.standard_normal((n, 4, 8)), dtype)
    tensor(r, "K", rng.standard_normal((n, 2, 8)), dtype)
    tensor(r, "V", rng.standard_normal((n, 2, 8)), dtype)
    if string_id:
        r.parameters["sequence_id"].string_param = str(seq)
    else:
        r.parameters["sequence_id"].uint64_param = seq
    if start:
        r.parameters["sequence_start"].bool_param = True
    if end:
        r.parameters["sequence_end"].bool_param = True
    return r


def lin(m, dtype="FP16", k=16):
    r = service_pb2.ModelInferRequest(model_name="lin")
    tensor(r, "X", rng.standard_normal((m, k)), dtype)
    return r


def seeds():
    yield "attn_single", attention(5, 5, 2, 1, 8)
    yield "attn_causal_lse", attention(7, 9, 4, 2, 16, causal=True, lse=True)
    yield "attn_ragged", attention(6, 10, 2, 2, 8, cu_q=[0, 2, 6], cu_k=[0, 3, 10], causal=True)
    yield "attn_cu_q_only", attention(6, 6, 2, 1, 8, cu_q=[0, 1, 3, 6])
    yield "attn_bf16_scale", attention(3, 4, 2, 2, 8, dtype="BF16", scale=0.5)
    yield "attn_fp32", attention(2, 3, 2, 1, 16, dtype="FP32")
    yield "attn_bad_headdim", attention(2, 2, 2, 1, 12)
    yield "attn_bad_cu", attention(4, 4, 2, 1, 8, cu_q=[0, 3, 2, 4], cu_k=[0, 1, 2, 4])
    yield "attn_many_seqs", attention(10, 10, 1, 1, 8, cu_q=list(range(11)), cu_k=list(range(11)))
    yield "kv_start", kv(3, 11, start=True)
    yield "kv_decode", kv(1, 11)
    yield "kv_start_end", kv(2, 12, start=True, end=True, string_id=True)
    yield "kv_bf16", kv(4, 13, start=True, dtype="BF16")
    yield "kv_end_no_start", kv(1, 14, end=True)
    yield "lin_m1", lin(1)
    yield "lin_m4_bf16", lin(4, "BF16")
    yield "lin_fp32", lin(3, "FP32")
    yield "lin_bad_k", lin(2, k=15)
    r = attention(2, 2, 2, 1, 8)
    r.model_name = "nope"
    yield "unknown_model", r
    # typed contents instead of raw bytes (what JSON-ish clients send)
    r = service_pb2.ModelInferRequest(model_name="lin")
    tensor(r, "X", rng.standard_normal((2, 16)), "FP32", raw=False)
    yield "lin_typed", r


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, req in seeds():
        data = req.SerializeToString()
        (out / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}").write_bytes(data)
    print(f"wrote {len(list(out.iterdir()))} seeds to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "corpus")
