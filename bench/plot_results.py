#!/usr/bin/env python3
"""Plots of the recorded results (bench/results/*.json) for the README.

  .venv/bin/python bench/plot_results.py   # redraws every attention-, gemm- and server-e2e-<device>.png
  .venv/bin/python bench/plot_results.py gemm SRC.json DST.png   # one plot, names relative to bench/results
"""
import glob, json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def attention(src, dst):
    a = json.load(open(os.path.join(R, src)))
    fig, (p, d) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = [x for x in a["prefill"] if "sdpa_flash" in x.get("peers", {})]
    names = [x["name"] for x in rows]
    xs = range(len(rows))
    for i, (label, get) in enumerate([
            ("flashq", lambda x: x["tflops"]),
            ("SDPA flash", lambda x: x["peers"]["sdpa_flash"]["tflops"]),
            ("SDPA cuDNN", lambda x: x["peers"].get("sdpa_cudnn", {}).get("tflops", 0))]):
        p.bar([x + 0.27 * (i - 1) for x in xs], [get(x) for x in rows], 0.27, label=label)
    p.set_xticks(list(xs), names, rotation=35, ha="right", fontsize=7)
    p.set_ylabel("TFLOP/s")
    p.set_title(f"prefill, BF16 ({a['device']}, {a['date']}, {a['commit']})", fontsize=9)
    p.legend(fontsize=8)
    dec = [x for x in a["decode"] if x["split"] == 1024][:6]
    labels = [f"B{x['batch']} L{x['len']} p{x['page']}" for x in dec]
    xs = range(len(dec))
    for i, (label, get) in enumerate([
            ("flashq (paged)", lambda x: x["gbps"]),
            ("SDPA flash", lambda x: x["peers"]["sdpa_flash"]["gbps"]),
            ("SDPA cuDNN", lambda x: x["peers"]["sdpa_cudnn"]["gbps"])]):
        d.bar([x + 0.27 * (i - 1) for x in xs], [get(x) for x in dec], 0.27, label=label)
    d.axhline(a["copy_ceiling_gbps"], color="k", ls="--", lw=1, label="copy ceiling")
    d.set_xticks(list(xs), labels, rotation=35, ha="right", fontsize=7)
    d.set_ylabel("GB/s of K+V read")
    d.set_title("decode, 32/8 heads, hd 128", fontsize=9)
    d.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(R, dst), dpi=110)


def gemm(src, dst):
    g = json.load(open(os.path.join(R, src)))
    shapes = sorted({(x["K"], x["N"]) for x in g["records"]})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 4.2), sharey=True)
    series = [("bf16_cublaslt", False, "cuBLASLt BF16 (fast)"), ("bf16_cublaslt", True, "cuBLASLt BF16 (pinned)"),
              ("bf16_ours", True, "BF16, ours (invariant)"), ("w4a16_g128", True, "W4A16 g128 (invariant)"),
              ("w4a16_g128", False, "W4A16 g128 (fast)"), ("w8a16", True, "W8A16"),
              ("w8a8_rowwise_ours", True, "W8A8 row-wise, ours (invariant)"),
              ("torch_scaled_mm_rowwise", False, "torch._scaled_mm row-wise"),
              ("torch_int4pack_g128", False, "torch int4 g128")]
    for ax, (K, N) in zip(axes, shapes):
        for method, inv, label in series:
            pts = sorted((x["M"], x["us"]) for x in g["records"]
                         if x["method"] == method and x["K"] == K and x["N"] == N and x["batch_invariant"] == inv)
            if pts:
                ax.loglog([m for m, _ in pts], [u for _, u in pts], marker="o", ms=3, label=label,
                          ls="--" if method.startswith("torch") or "pinned" in label else "-")
        ax.set_title(f"K={K} N={N}", fontsize=9)
        ax.set_xlabel("M")
    axes[0].set_ylabel("µs")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"linear layers ({g['device']}, {g['date']}, commit {g['commit']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(R, dst), dpi=110)


def server_e2e(src, dst):
    """p99 latency against throughput for each scenario; one line per way of sending tensors."""
    e = json.load(open(os.path.join(R, src)))
    scenarios = sorted({row["scenario"] for run in e["runs"] for row in run["rows"]})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.5 * len(scenarios), 3.8))
    for ax, sc in zip(axes, scenarios):
        for i, run in enumerate(e["runs"]):  # one colour per section on every axis
            pts = sorted((r["throughput_rps"], r["p99_ms"]) for r in run["rows"] if r["scenario"] == sc and not r["errors"])
            if pts:
                label = run["section"].split(" (")[0] + (f", {run['server']}" if run["server"] else "")
                ax.plot([t for t, _ in pts], [l for _, l in pts], marker="o", ms=3, label=label, color=f"C{i}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(sc, fontsize=9)
        ax.set_xlabel("requests/s")
    axes[0].set_ylabel("p99 latency, ms")
    legend = {}  # every section once, whichever scenarios it has rows for
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(l, h)
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=3, fontsize=7)
    fig.suptitle(f"flashq-server end to end ({e['device']}, {e['date']}, commit {e['commit']})", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(os.path.join(R, dst), dpi=110)


if __name__ == "__main__":
    draws = {"attention": attention, "gemm": gemm, "server-e2e": server_e2e}
    if len(sys.argv) == 4:
        draws[sys.argv[1]](sys.argv[2], sys.argv[3])
    else:
        # One current record per suite and device (attention-<device>.json, gemm-<device>.json,
        # server-e2e-<device>.json); each plot takes the record's name.
        for suite, draw in draws.items():
            for src in sorted(glob.glob(os.path.join(R, suite + "-*.json"))):
                name = os.path.basename(src)
                draw(name, name[:-len(".json")] + ".png")
    print("wrote", R)
