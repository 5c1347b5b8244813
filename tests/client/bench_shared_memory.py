#!/usr/bin/env python3
"""flashq-bench --spawn-server --shared-memory=system end to end. On top of
bench_smoke.py's checks (exit 0, clean server stop, every scenario measured with no
errors): the report says system shared memory with slots made for every scenario, the
server's ModelStatistics counted the measured requests, the kv scenario reports its
prefill and decode percentiles apart (JSON and CSV), and no /dev/shm object of the run
is left behind.

    bench_shared_memory.py FLASHQ_BENCH OUTPUT_DIR SCENARIOS [flashq-bench arguments...]
"""
import csv
import os
import pathlib
import sys

import bench_smoke


def main():
    bench, out_dir, scenarios, extra = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
    problems, report, pid = bench_smoke.run(bench, out_dir, scenarios, extra)
    if report is not None:
        if report.get("shared_memory") != "system":
            problems.append(f"report says shared_memory={report.get('shared_memory')!r}")
        for s in report["scenarios"]:
            if not s.get("shared_memory_slots", 0) > 0:
                problems.append(f"{s['name']}: no shared-memory slots")
            for p in s.get("points", []):
                what = f"{s['name']} {p.get('label')}"
                server = p.get("server") or {}
                # ModelStatistics deltas over the same windows; requests completing at a window's
                # edge may count in the next window on one side and this one on the other.
                if not server.get("requests", 0) >= 0.8 * p.get("requests", 0) > 0:
                    problems.append(f"{what}: the server counted {server.get('requests')} requests, "
                                    f"flashq-bench {p.get('requests')}")
                if s["model"] == "kv_attention":
                    kinds = p.get("latency_ms_by_kind") or {}
                    for kind in ("prefill", "decode"):
                        k = kinds.get(kind) or {}
                        if not (k.get("count", 0) > 0 and all(isinstance(k.get(q), (int, float)) for q in ("p50", "p90", "p99"))):
                            problems.append(f"{what}: no {kind} count and p50/p90/p99 in latency_ms_by_kind: {k}")
                        if not (p.get("throughput_rps_by_kind") or {}).get(kind, 0) > 0:
                            problems.append(f"{what}: no {kind} in throughput_rps_by_kind")
                    if kinds and kinds["prefill"].get("count", 0) + kinds["decode"].get("count", 0) != p["requests"]:
                        problems.append(f"{what}: prefill + decode counts are not the requests")
        with open(out_dir / "smoke.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        kv_rows = [r for r in rows if r["model"] == "kv_attention"]
        if "kv_decode" in scenarios and not kv_rows:
            problems.append("no kv_attention row in the CSV")
        for r in kv_rows:
            for col in ("prefill_requests", "prefill_p50_ms", "prefill_p90_ms", "prefill_p99_ms", "decode_requests",
                        "decode_p50_ms", "decode_p90_ms", "decode_p99_ms"):
                if not r.get(col):
                    problems.append(f"CSV kv row: no {col}")
    prefix = f"flashq-bench-{pid}-"
    left = sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    if left:
        problems.append(f"/dev/shm objects left behind: {left}")
    if problems:
        print("bench_shared_memory: FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"bench_shared_memory: passed ({len(scenarios)} scenarios through system shared memory, no errors, "
          f"server counts match, nothing left in /dev/shm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
