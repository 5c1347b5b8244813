#!/usr/bin/env python3
"""Time vs M per shape from a merged gemm results JSON (report.py output).
Usage: plot.py bench/results/gemm-<device>-<date>.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

g = json.load(open(sys.argv[1]))
shapes = sorted({(x["K"], x["N"]) for x in g["records"]})
fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.8), sharey=True)
series = [("bf16_cublaslt", False, "cuBLASLt BF16"), ("w4a16_g128", True, "W4A16 g128 (invariant)"),
          ("w4a16_g128", False, "W4A16 g128 (fast)"), ("w8a16", True, "W8A16"),
          ("torch_int4pack_g128", False, "torch int4 g128")]
for ax, (K, N) in zip(axes, shapes):
    for method, inv, label in series:
        pts = sorted((x["M"], x["us"]) for x in g["records"]
                     if x["method"] == method and x["K"] == K and x["N"] == N and x["batch_invariant"] == inv)
        if pts:
            ax.loglog([m for m, _ in pts], [u for _, u in pts], marker="o", ms=3, label=label)
    ax.set_title(f"K={K} N={N}", fontsize=9)
    ax.set_xlabel("M")
axes[0].set_ylabel("µs")
axes[0].legend(fontsize=7)
fig.suptitle(f"linear layers ({g['device']}, {g['date']}, commit {g['commit']})", fontsize=9)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
