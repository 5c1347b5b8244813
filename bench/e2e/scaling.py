#!/usr/bin/env python3
"""The scaling table of bench/gpu/e2e.sh: the same scenarios on GPU 0 alone and on every GPU.

usage: scaling.py ONE.json ALL.json GPUS   (gpu_e2e.py's e2e.json of each server)
Prints markdown: per scenario and concurrency, the requests/s (a kv session's prefill and decode
steps alike), p50/p99 (of the decode steps for kv sessions) and GPU busy share of both runs, and their
ratio beside the scaling bar (1.6x on two GPUs, 2.5x on four). Exits non-zero only when a row is
missing or a load run failed, not when a bar is missed.
"""
import json, sys


def main():
    one, every, gpus = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
    bar = {2: 1.6, 4: 2.5}.get(gpus)
    key = lambda r: (r["scenario"], r["concurrency"])
    alone = {key(r): r for r in one}
    f = lambda v, n=2: "-" if v is None else f"{v:,.{n}f}"
    print(f"| scenario | conc | GPU 0: req/s, p50, p99 ms, busy | {gpus} GPUs: req/s, p50, p99 ms, busy (each) "
          f"| ratio | bar |")
    print("|" + "---|" * 6)
    bad = []
    for r in every:
        a = alone.get(key(r))
        if a is None or not a["throughput_rps"] or not r["throughput_rps"]:
            bad.append(f"{r['scenario']} c={r['concurrency']}")
            continue
        ratio = r["throughput_rps"] / a["throughput_rps"]
        busy = " / ".join(f(v) for v in r["gpu_busy_by_gpu"].values())
        met = "-" if bar is None else f"{bar}x: {'yes' if ratio >= bar else '**no**'}"
        print(f"| {r['scenario']} | {r['concurrency']} | {f(a['throughput_rps'], 0)}, {f(a['p50_ms'])}, "
              f"{f(a['p99_ms'])}, {f(a['gpu_busy_fraction'])} | {f(r['throughput_rps'], 0)}, {f(r['p50_ms'])}, "
              f"{f(r['p99_ms'])}, {busy} | {ratio:.2f}x | {met} |")
    bad += [f"{r['scenario']} c={r['concurrency']}" for r in one + every if r["bench_rc"] != 0 or r["errors"]]
    if bad:
        print("missing or failed rows: " + ", ".join(sorted(set(bad))))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
