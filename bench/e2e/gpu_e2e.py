#!/usr/bin/env python3
"""End-to-end figures of a running flashq-server (the load scenarios of its GPU run), stdlib only.

For each scenario and concurrency, runs flashq-bench for one closed-loop load point
and reads /metrics before and after it:
  GPU busy fraction = delta(flashq_kernel_seconds_sum) / (wall time of the point x GPUs),
                      and per GPU from the gpu label
  server overhead   = mean server-side total latency - mean GPU kernel time per batch
Writes e2e JSON + a markdown table to --out-dir.
"""
import argparse, json, os, re, subprocess, sys, time, urllib.request

SCENARIOS = {
    "a_kv_decode": ["--model=kv_attention", "--prefill-len=fixed:2048", "--decode-steps=fixed:256",
                    "--heads-q=32", "--heads-kv=8", "--head-dim=128"],
    "b_attention_ragged": ["--model=attention", "--seq-len=uniform:64:2048", "--seqs-per-request=fixed:1",
                           "--heads-q=32", "--heads-kv=8", "--head-dim=128", "--dtype=bf16"],
    "c_linear_w4a16": ["--model=up_proj_int4", "--m=fixed:1"],
    "d_linear_bf16": ["--model=up_proj_bf16", "--m=fixed:1"],
}


def scrape(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        vals[name] = float(value)
    return vals


def total(vals, prefix, must=()):
    return sum(v for k, v in vals.items() if k.startswith(prefix) and all(m in k for m in must))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--max-time", default="6")
    ap.add_argument("--bench-args", default="", help="extra flashq-bench flags, e.g. --shared-memory=system")
    a = ap.parse_args()
    rows = []
    for name in a.scenarios.split(","):
        model = [x for x in SCENARIOS[name] if x.startswith("--model=")][0][8:]
        for c in a.concurrency.split(","):
            before, t0 = scrape(a.metrics), time.time()
            tag = f"{name}-c{c}"
            cmd = [a.bench, f"--endpoints={a.endpoint}", f"--concurrency={c}", f"--max-time={a.max_time}",
                   "--window=1", "--warmup=1", "--no-plot", f"--output-dir={a.out_dir}", f"--name={tag}",
                   "--progress=off", "--request-timeout=120"] + SCENARIOS[name] + a.bench_args.split()
            r = subprocess.run(cmd, capture_output=True, text=True)
            wall, after = time.time() - t0, scrape(a.metrics)
            sys.stdout.write(r.stdout[-1500:])
            d = lambda p, *m: total(after, p, m) - total(before, p, m)
            kernel_s = d("flashq_kernel_seconds_sum")
            kernel_n = d("flashq_kernel_seconds_count")
            gpus = sorted({m.group(1) for k in after if k.startswith("flashq_kernel_seconds_sum")
                           for m in [re.search(r'gpu="(\d+)"', k)] if m}) or ["0"]
            busy_by_gpu = {g: d("flashq_kernel_seconds_sum", f'gpu="{g}"') / wall for g in gpus} if wall > 0 else {}
            srv_sum = d("flashq_request_duration_seconds_sum", f'model="{model}"', 'stage="total"')
            srv_n = d("flashq_request_duration_seconds_count", f'model="{model}"', 'stage="total"')
            point = {}
            try:
                res = json.load(open(os.path.join(a.out_dir, tag + ".json")))
                point = res["scenarios"][0]["points"][0]
            except Exception as e:  # keep going; the row says what failed
                point = {"error": f"{e}; rc={r.returncode}; {r.stderr[-400:]}"}
            # kv sessions: report the decode steps (one new token over the cached context).
            lat = (point.get("latency_ms_by_kind") or {}).get("decode") or point.get("latency_ms", {})
            row = {
                "scenario": name, "concurrency": int(c), "throughput_rps": point.get("throughput_rps"),
                "units_per_s": point.get("units_per_s"), "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"),
                "errors": point.get("error_count"), "stable": point.get("stable"),
                "avg_batch_requests": (point.get("server") or {}).get("avg_batch_requests"),
                "gpu_busy_fraction": kernel_s / (wall * len(gpus)) if wall > 0 else None,
                "gpu_busy_by_gpu": busy_by_gpu,
                "server_mean_ms": 1e3 * srv_sum / srv_n if srv_n else None,
                "gpu_ms_per_batch": 1e3 * kernel_s / kernel_n if kernel_n else None,
                "bench_rc": r.returncode, "wall_s": wall,
            }
            if row["server_mean_ms"] is not None and row["gpu_ms_per_batch"] is not None:
                row["server_overhead_ms"] = row["server_mean_ms"] - row["gpu_ms_per_batch"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(rows, open(os.path.join(a.out_dir, "e2e.json"), "w"), indent=1)
    hdr = ("| scenario | conc | req/s | p50 ms | p99 ms | avg batch | GPU busy | GPU busy by GPU | server ms | "
           "GPU ms/batch | overhead ms | errors |")
    lines = [hdr, "|" + "---|" * 12]
    f = lambda v, n=2: "-" if v is None else (f"{v:.{n}f}" if isinstance(v, float) else str(v))
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['concurrency']} | {f(r['throughput_rps'],1)} | {f(r['p50_ms'])} | "
                     f"{f(r['p99_ms'])} | {f(r['avg_batch_requests'],1)} | {f(r['gpu_busy_fraction'])} | "
                     f"{' / '.join(f(v) for v in r['gpu_busy_by_gpu'].values())} | "
                     f"{f(r['server_mean_ms'])} | {f(r['gpu_ms_per_batch'],3)} | {f(r.get('server_overhead_ms'))} | {r['errors']} |")
    open(os.path.join(a.out_dir, "e2e.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    # The tables are written either way; a load run that failed or saw errors fails the script.
    bad = [f"{r['scenario']} c={r['concurrency']}" for r in rows if r["bench_rc"] != 0 or r["errors"] != 0]
    if bad:
        print("FAILED load runs (flashq-bench exit status or errors): " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
