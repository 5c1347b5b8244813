#!/usr/bin/env python3
"""Latency-throughput plot of a flashq-bench JSON file.

usage: plot.py RESULTS.json OUT.png

One panel per scenario: x = throughput (requests/s), y = latency (ms, log scale);
p50 and p99 curves through the load points, each point labelled with its load
(c=N or the request rate). flashq-bench calls this after a run when the Python it
finds has matplotlib.
"""
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        res = json.load(f)
    scenarios = [s for s in res.get("scenarios", []) if s.get("points")]
    if not scenarios:
        print("plot.py: no measured points in " + argv[1], file=sys.stderr)
        return 1
    n = len(scenarios)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for i, sc in enumerate(scenarios):
        ax = axes[i // cols][i % cols]
        pts = [p for p in sc["points"] if p.get("requests", 0) > 0]
        x = [p["throughput_rps"] for p in pts]
        for key, style, label in (("p50", "o-", "p50"), ("p90", "^:", "p90"), ("p99", "s--", "p99")):
            ax.plot(x, [p["latency_ms"][key] for p in pts], style, label=label)
        kinds = None
        for p in pts:
            if p.get("latency_ms_by_kind"):
                kinds = p["latency_ms_by_kind"]
                break
        if kinds and "decode" in kinds:
            ax.plot(x, [p["latency_ms_by_kind"]["decode"]["p50"] for p in pts], "d-.", label="decode p50")
        for p in pts:
            ax.annotate(p["label"], (p["throughput_rps"], p["latency_ms"]["p50"]), textcoords="offset points",
                        xytext=(4, -12), fontsize=8)
        srv = [p["server"]["compute_ms"] for p in pts if p.get("server")]
        if len(srv) == len(pts) and pts:
            ax.plot(x, srv, "x:", color="gray", label="server compute (mean)")
        ax.set_title(sc["name"] + "\n" + "\n".join(textwrap.wrap(sc.get("description", ""), 70)), fontsize=8)
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("flashq-bench  %s  commit %s  %s" % (res.get("date", ""), res.get("commit", ""),
                                                      ",".join(res.get("endpoints", []))), fontsize=9)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
