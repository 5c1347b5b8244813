#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/request_fuzzer.cc: serialized ModelInferRequest
messages as real clients send them (tritonclient's protobuf classes), for the fuzzer's
small models: attention (head dims 8/16), kv_attention (4/2 heads, D=8), lin (K=16).
Valid requests of every shape family, a few typical mistakes, and shapes at the int32 /
int64 edges with empty or short payloads. Also writes the fuzz gate's self-test input
(fuzz/selftest/: a request that the harness aborts on when FLASHQ_FUZZ_PLANTED_CRASH
is set), which must never be part of the corpus.

    .venv/bin/python fuzz/make_corpus.py fuzz/corpus fuzz/selftest
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


def shaped(req, name, dtype, shape, raw=b""):
    """An input with any shape and exactly the given raw bytes (no check that they match)."""
    t = req.inputs.add()
    t.name = name
    t.datatype = dtype
    t.shape.extend(shape)
    req.raw_input_contents.append(raw)
    return req


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
    # Shapes at the int32 / int64 edges. A dim of 0 makes the tensor empty, so 0 bytes
    # match any other dims: only the model's own checks stand between them and compute.
    i32_min, u32_max, i64_max = 2**31, 2**32 - 1, 2**63 - 1
    def att(q_shape, kv_shape, dtype="FP16"):
        r = service_pb2.ModelInferRequest(model_name="attention")
        for name, shape in (("Q", q_shape), ("K", kv_shape), ("V", kv_shape)):
            shaped(r, name, dtype, shape)
        return r
    # num_heads 2^31 and 2^32-1 narrow to INT_MIN and -1: INT_MIN % -1 traps.
    yield "attn_heads_int_min_empty", att([0, i32_min, 64], [0, u32_max, 64])
    yield "attn_heads_int_max_empty", att([0, 2**31 - 1, 16], [0, 1, 16])
    yield "attn_heads_u32_max_empty", att([0, u32_max, 8], [0, u32_max, 8])
    yield "attn_empty", att([0, 2, 8], [0, 1, 8])
    yield "attn_empty_q", shaped(shaped(shaped(service_pb2.ModelInferRequest(model_name="attention"), "Q", "FP16", [0, 2, 8]),
                                        "K", "FP16", [1, 1, 8], b"\x00\x3c" * 8), "V", "FP16", [1, 1, 8], b"\x00\x3c" * 8)
    yield "attn_tokens_i64_max", att([i64_max, 2, 8], [i64_max, 1, 8])
    yield "attn_headdim_i64_max_empty", att([0, 2, i64_max], [0, 1, i64_max])
    r = attention(4, 4, 2, 1, 8, cu_q=[0, 2**31 - 1], cu_k=[0, 4])
    yield "attn_cu_int_max", r
    r = service_pb2.ModelInferRequest(model_name="kv_attention")
    for name, shape in (("Q", [0, 4, 8]), ("K", [0, 2, 8]), ("V", [0, 2, 8])):
        shaped(r, name, "FP16", shape)
    r.parameters["sequence_id"].uint64_param = 21
    r.parameters["sequence_start"].bool_param = True
    yield "kv_empty_start", r
    r = service_pb2.ModelInferRequest(model_name="kv_attention")
    for name, shape in (("Q", [u32_max, 4, 8]), ("K", [u32_max, 2, 8]), ("V", [u32_max, 2, 8])):
        shaped(r, name, "FP16", shape, b"\x00\x3c" * 4)
    r.parameters["sequence_id"].uint64_param = 22
    r.parameters["sequence_start"].bool_param = True
    yield "kv_tokens_u32_max", r
    yield "lin_rows_zero", shaped(service_pb2.ModelInferRequest(model_name="lin"), "X", "FP16", [0, 16])
    yield "lin_rows_overflow", shaped(service_pb2.ModelInferRequest(model_name="lin"), "X", "FP16", [2**62, 16],
                                      b"\x00\x3c" * 16)
    yield "lin_rows_i32_min", shaped(service_pb2.ModelInferRequest(model_name="lin"), "X", "FP16", [i32_min, 16])


def selftest_seeds():
    """The planted crash: an ordinary `lin` request whose id the harness aborts on when
    FLASHQ_FUZZ_PLANTED_CRASH is set."""
    r = lin(2)
    r.id = "flashq-fuzz-planted-crash"
    yield "planted_crash", r


def write(out, items):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, req in items:
        data = req.SerializeToString()
        (out / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}").write_bytes(data)
    print(f"wrote {len(list(out.iterdir()))} seeds to {out}")


def main(corpus, selftest):
    write(corpus, seeds())
    write(selftest, selftest_seeds())


if __name__ == "__main__":
    here = pathlib.Path(__file__).parent
    main(sys.argv[1] if len(sys.argv) > 1 else here / "corpus", sys.argv[2] if len(sys.argv) > 2 else here / "selftest")
