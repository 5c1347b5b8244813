#!/usr/bin/env python3
"""Cross-check flashq-bench against Triton's perf_analyzer on the CPU backend.

Starts flashq-server --backend=cpu on free ports, then for each concurrency runs
perf_analyzer and flashq-bench one after the other (alternating, --rounds times)
against the same model and input shape, and checks that flashq-bench's throughput
and p50 latency agree with perf_analyzer's within --tolerance (15%). Both tools
use the same rule: measurement windows until the last 3 agree within 10% on
throughput and p50 latency (perf_analyzer --percentile=50, flashq-bench
--stability-latency=p50). The machine may be shared: the tools alternate and the
medians over --rounds are compared.

  bench/crosscheck_perf_analyzer.py                    # results under build/crosscheck/
  bench/crosscheck_perf_analyzer.py --record           # also bench/results/perf_analyzer_crosscheck-cpu-<N>core.{json,md}

Exit status: 0 agree, 1 disagree or a tool failed, 77 (ctest: skipped) when perf_analyzer or a
binary is missing, or perf_analyzer finds no stable measurement (a machine too busy to judge).
"""
import argparse
import csv
import datetime
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Unmeasurable(RuntimeError):
    pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def log(msg):
    print(msg, flush=True)


def start_server(args, outdir):
    gport, mport = free_port(), free_port()
    while mport == gport:
        mport = free_port()
    logf = open(os.path.join(outdir, "server.log"), "w")
    cmd = [os.path.join(args.build_dir, "bin", "flashq-server"), "--backend=cpu", "--host=127.0.0.1",
           "--grpc-port=%d" % gport, "--metrics-port=%d" % mport, "--http-port=0",
           # shared with the other integration tests: generated once per build tree
           "--demo-cache-dir=" + os.path.join(args.build_dir, "integration", "demo-cache")] + args.server_arg
    log("$ " + " ".join(cmd))
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.time() + args.server_timeout
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError("flashq-server exited with %s; see %s" % (p.returncode, logf.name))
        with open(logf.name) as f:
            if "flashq-server ready" in f.read():
                return p, gport
        time.sleep(0.2)
    p.kill()
    raise RuntimeError("flashq-server not ready after %ss" % args.server_timeout)


def write_input_data(args, outdir):
    """The request perf_analyzer sends: the same shapes and value range as flashq-bench's."""
    import base64
    import random
    import struct
    rng = random.Random(1)
    t, hq, hkv, d = args.tokens, args.heads_q, args.heads_kv, args.head_dim

    def fp16(n):
        return base64.b64encode(struct.pack("<%de" % n, *[rng.uniform(-1, 1) for _ in range(n)])).decode()
    data = {"data": [{
        "Q": {"b64": fp16(t * hq * d), "shape": [t, hq, d]},
        "K": {"b64": fp16(t * hkv * d), "shape": [t, hkv, d]},
        "V": {"b64": fp16(t * hkv * d), "shape": [t, hkv, d]},
        "CU_SEQLENS_Q": {"content": [0, t], "shape": [2]},
        "CU_SEQLENS_K": {"content": [0, t], "shape": [2]},
    }]}
    path = os.path.join(outdir, "pa-input.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def avg_ms(stdout):
    m = re.search(r"Avg latency: (\d+) usec", stdout)
    return float(m.group(1)) / 1e3 if m else None


def run_perf_analyzer(args, port, conc, outdir, rnd, input_json):
    csv_path = os.path.join(outdir, "pa-c%d-r%d.csv" % (conc, rnd))
    cmd = [os.path.join(ROOT, "scripts", "perf_analyzer"), "-i", "grpc", "-u", "127.0.0.1:%d" % port,
           "-m", "attention", "--input-data", input_json, "--request-parameter", "causal:true:bool",
           "--concurrency-range", "%d:%d" % (conc, conc),
           "--measurement-interval", str(int(args.window * 1000)), "--stability-percentage", "10",
           "--percentile", "50", "--max-trials", str(args.max_windows), "-f", csv_path]
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    with open(os.path.join(outdir, "pa-c%d-r%d.log" % (conc, rnd)), "w") as f:
        f.write(r.stdout)
    if r.returncode != 0 and "Failed to obtain stable measurement" in r.stdout:
        return None
    if r.returncode != 0 or not os.path.exists(csv_path):
        raise RuntimeError("perf_analyzer failed (rc %d):\n%s" % (r.returncode, r.stdout[-3000:]))
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"throughput_rps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3, "avg_ms": avg_ms(r.stdout),
            "stable": "Failed to obtain stable measurement" not in r.stdout,
            "server_queue_ms": float(row["Server Queue"]) / 1e3,
            "server_compute_ms": (float(row["Server Compute Input"]) + float(row["Server Compute Infer"]) +
                                  float(row["Server Compute Output"])) / 1e3}


def run_flashq_bench(args, port, conc, outdir, rnd):
    js = os.path.join(outdir, "fb-c%d-r%d.json" % (conc, rnd))
    cmd = [os.path.join(args.build_dir, "bin", "flashq-bench"), "--endpoints=127.0.0.1:%d" % port,
           "--model=attention", "--seq-len=fixed:%d" % args.tokens, "--seqs-per-request=fixed:1",
           "--heads-q=%d" % args.heads_q, "--heads-kv=%d" % args.heads_kv, "--head-dim=%d" % args.head_dim,
           "--dtype=fp16", "--causal", "--concurrency=%d" % conc,
           "--window=%g" % args.window, "--stability=10", "--stability-latency=p50", "--stable-windows=3",
           "--max-time=%g" % (args.window * args.max_windows), "--warmup=%g" % args.window, "--min-requests=1",
           "--json=" + js, "--csv=" + js[:-5] + ".csv", "--output-dir=" + outdir, "--no-plot", "--progress=off"]
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    with open(os.path.join(outdir, "fb-c%d-r%d.log" % (conc, rnd)), "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        raise RuntimeError("flashq-bench failed (rc %d):\n%s" % (r.returncode, r.stdout[-3000:]))
    with open(js) as f:
        p = json.load(f)["scenarios"][0]["points"][0]
    srv = p.get("server") or {}
    return {"throughput_rps": p["throughput_rps"], "p50_ms": p["latency_ms"]["p50"], "p99_ms": p["latency_ms"]["p99"],
            "avg_ms": p["latency_ms"]["mean"], "stable": p["stable"], "errors": p["error_count"],
            "server_queue_ms": srv.get("queue_ms"), "server_compute_ms": srv.get("compute_ms")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tokens", type=int, default=128, help="attention: one causal sequence of this many tokens")
    ap.add_argument("--heads-q", type=int, default=8)
    ap.add_argument("--heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each tool; medians are compared")
    ap.add_argument("--window", type=float, default=3.0, help="measurement window, s (both tools)")
    ap.add_argument("--max-windows", type=int, default=15)
    ap.add_argument("--retries", type=int, default=2, help="reruns of a tool that found no stable measurement")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--server-timeout", type=float, default=300)
    ap.add_argument("--out-dir", default=None, help="default: <build-dir>/crosscheck")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse of the checkout)")
    ap.add_argument("--record", action="store_true", help="write bench/results/perf_analyzer_crosscheck-cpu-<N>core.{json,md} (N: this host's CPUs; replaces the record)")
    args = ap.parse_args()

    for b in ("flashq-server", "flashq-bench"):
        if not os.access(os.path.join(args.build_dir, "bin", b), os.X_OK):
            log("SKIP: %s/bin/%s not built" % (args.build_dir, b))
            return 77
    if subprocess.run([os.path.join(ROOT, "scripts", "perf_analyzer"), "--path"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        log("SKIP: perf_analyzer not found (scripts/setup.sh installs it into .venv)")
        return 77
    outdir = args.out_dir or os.path.join(args.build_dir, "crosscheck")
    os.makedirs(outdir, exist_ok=True)
    commit = args.commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    load_before = os.getloadavg()
    date = datetime.datetime.now(datetime.timezone.utc)

    input_json = write_input_data(args, outdir)
    server, port = start_server(args, outdir)
    results = []
    ok = True
    try:
        def measure(conc):
            pa, fb = [], []
            for rnd in range(args.rounds):
                for attempt in range(args.retries + 1):
                    res = run_perf_analyzer(args, port, conc, outdir, rnd, input_json)
                    if res is not None:
                        break
                    log("  perf_analyzer: no stable measurement (attempt %d)" % (attempt + 1))
                if res is None:
                    # The reference itself cannot measure: the machine is too noisy for a verdict.
                    raise Unmeasurable("perf_analyzer found no stable measurement at c=%d (load average %.1f): "
                                       "the machine is too busy for this check" % (conc, os.getloadavg()[0]))
                pa.append(res)
                log("  perf_analyzer c=%d: %.2f req/s p50 %.2f ms" % (conc, pa[-1]["throughput_rps"], pa[-1]["p50_ms"]))
                for attempt in range(args.retries + 1):
                    res = run_flashq_bench(args, port, conc, outdir, rnd)
                    if res["stable"]:
                        break
                    log("  flashq-bench: no stable measurement (attempt %d)" % (attempt + 1))
                fb.append(res)
                log("  flashq-bench  c=%d: %.2f req/s p50 %.2f ms" % (conc, fb[-1]["throughput_rps"], fb[-1]["p50_ms"]))
            med = lambda runs, k: statistics.median(r[k] for r in runs)
            row = {"concurrency": conc, "perf_analyzer": pa, "flashq_bench": fb}
            passed = all(r["errors"] == 0 for r in fb)
            for k in ("throughput_rps", "p50_ms"):
                a, b = med(pa, k), med(fb, k)
                diff = (b - a) / a if a else float("inf")
                row[k] = {"perf_analyzer": a, "flashq_bench": b, "rel_diff": diff, "pass": abs(diff) <= args.tolerance}
                passed &= row[k]["pass"]
            return row, passed

        for conc in [int(c) for c in args.concurrency.split(",")]:
            # A disagreement counts only when a second, independent set of rounds confirms it:
            # on a shared machine one set can catch a burst of foreign load. Both sets are kept.
            row, passed = measure(conc)
            if not passed:
                log("  c=%d disagrees; measuring again to confirm" % conc)
                first = row
                row, passed = measure(conc)
                row["unconfirmed_first_attempt"] = first
            ok &= passed
            results.append(row)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()

    report = {"date": date.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "host": socket.gethostname(),
              "cpus": os.cpu_count(), "cpu_model": cpu,
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "backend": "cpu", "model": "attention",
              "input": "Q [%d,%d,%d], K/V [%d,%d,%d] FP16, CU_SEQLENS [0,%d], causal" % (
                  args.tokens, args.heads_q, args.head_dim, args.tokens, args.heads_kv, args.head_dim, args.tokens),
              "tolerance": args.tolerance, "rounds": args.rounds, "window_s": args.window,
              "rule": "median over rounds; |flashq-bench - perf_analyzer| / perf_analyzer <= tolerance, "
                      "for throughput and p50; both tools: windows until the last 3 agree within 10% "
                      "(throughput and p50 latency)",
              "pass": ok, "results": results}
    lines = ["# flashq-bench vs perf_analyzer (CPU backend)", "",
             "Date %s, commit %s, host %s (%d CPUs, %s; load average %.1f before, %.1f after). "
             "Model `%s`, input %s; perf_analyzer from tritonclient 2.50.0. "
             "Each tool ran %d time(s) per concurrency, alternating; medians compared; tolerance %d%%." % (
                 report["date"], commit, report["host"], report["cpus"], cpu or "unknown CPU",
                 report["load_average_before"][0], report["load_average_after"][0], "attention", report["input"], args.rounds,
                 round(args.tolerance * 100)), "",
             "| concurrency | perf_analyzer req/s | flashq-bench req/s | diff | perf_analyzer p50 ms | flashq-bench p50 ms | diff | result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, p = r["throughput_rps"], r["p50_ms"]
        lines.append("| %d | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %+.1f%% | %s |" % (
            r["concurrency"], t["perf_analyzer"], t["flashq_bench"], 100 * t["rel_diff"], p["perf_analyzer"],
            p["flashq_bench"], 100 * p["rel_diff"], "pass" if t["pass"] and p["pass"] else "FAIL"))
    lines += ["", "Overall: **%s**." % ("pass" if ok else "FAIL"), "",
              "Reproduce: `bench/crosscheck_perf_analyzer.py --record` (ctest: `ctest -L integration -R perf_analyzer`)."]
    md = "\n".join(lines) + "\n"
    paths = [os.path.join(outdir, "crosscheck.json"), os.path.join(outdir, "crosscheck.md")]
    if args.record:
        base = os.path.join(ROOT, "bench", "results", f"perf_analyzer_crosscheck-cpu-{os.cpu_count()}core")
        paths += [base + ".json", base + ".md"]
    for path in paths:
        with open(path, "w") as f:
            f.write(json.dumps(report, indent=2) + "\n" if path.endswith(".json") else md)
    print(md)
    for path in paths:
        log("wrote " + path)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Unmeasurable as e:
        print("SKIP: %s" % e, file=sys.stderr)
        sys.exit(77)
    except RuntimeError as e:
        print("ERROR: %s" % e, file=sys.stderr)
        sys.exit(1)
