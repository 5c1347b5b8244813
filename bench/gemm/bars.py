#!/usr/bin/env python3
"""Compact bar table from gemm_bench JSON files: W4A16 (invariant) and W8A16 time and speed-up
over cuBLASLt BF16 (heuristic mode) per shape and M. Usage: bars.py a.json [b.json ...]"""
import json
import sys

for path in sys.argv[1:]:
    recs = json.load(open(path))["records"]
    t = {(r["method"], r["K"], r["N"], r["M"], r["batch_invariant"]): r["us"] for r in recs}
    print(f"== {path}")
    print("   K     N    M   bf16us   w4us  w4x   w8us  w8x")
    for (m, K, N, M, inv), us in sorted(t.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        if m != "bf16_cublaslt" or inv:
            continue
        w4 = t.get(("w4a16_g128", K, N, M, True), float("nan"))
        w8 = t.get(("w8a16", K, N, M, True), float("nan"))
        print(f"{K:5d} {N:5d} {M:4d} {us:7.2f} {w4:7.2f} {us / w4:4.2f} {w8:7.2f} {us / w8:4.2f}")
