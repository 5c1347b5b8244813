#!/usr/bin/env python3
"""flashq-bench --spawn-server end to end, judged on what the run did, not on what it
printed: flashq-bench must exit 0, the server must stop cleanly on SIGTERM, and the
JSON report must hold every requested scenario with requests measured and no errors
(warm-up included).

    bench_smoke.py FLASHQ_BENCH OUTPUT_DIR SCENARIOS [flashq-bench arguments...]
"""
import json
import pathlib
import shutil
import subprocess
import sys


def run(bench, out_dir, scenarios, extra):
    """Runs flashq-bench; returns (problems, the JSON report or None, flashq-bench's pid)."""
    shutil.rmtree(out_dir, ignore_errors=True)  # a stale report must not pass for this run's
    cmd = [bench, "--spawn-server", "--scenarios=" + ",".join(scenarios), f"--output-dir={out_dir}", "--name=smoke",
           "--progress=off", *extra]
    print("bench_smoke:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stdout, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
    print(stdout, flush=True)
    problems = []
    if proc.returncode != 0:
        problems.append(f"flashq-bench exited {proc.returncode}")
    if "server: stopped with SIGTERM (exited with status 0)" not in stdout:
        problems.append("the spawned server did not stop with exit status 0 on SIGTERM")
    report = out_dir / "smoke.json"
    if not report.exists():
        problems.append(f"no report at {report}")
        return problems, None, proc.pid
    data = json.loads(report.read_text())
    got = {s["name"]: s for s in data["scenarios"]}
    for name in scenarios:
        s = got.get(name)
        if s is None:
            problems.append(f"{name}: missing from the report")
            continue
        if s.get("error"):
            problems.append(f"{name}: {s['error']}")
        if not s.get("points"):
            problems.append(f"{name}: no load points")
        for p in s.get("points", []):
            what = f"{name} {p.get('label')}"
            if p.get("error_count", 0) or p.get("warmup_errors", 0):
                problems.append(f"{what}: {p.get('error_count')} errors, {p.get('warmup_errors')} in warm-up: "
                                f"{p.get('errors')}")
            if not p.get("requests", 0) > 0:
                problems.append(f"{what}: no requests measured")
    return problems, data, proc.pid


def main():
    bench, out_dir, scenarios, extra = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
    problems, _, _ = run(bench, out_dir, scenarios, extra)
    if problems:
        print("bench_smoke: FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"bench_smoke: passed ({len(scenarios)} scenarios, no errors, server exit 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
