#!/usr/bin/env python3
"""Soak: a mixed workload against one flashq-server process for --duration seconds,
then SIGTERM. Every request is counted against its answer (none lost, none answered
twice, only expected codes), RSS is sampled, and the server must exit 0 with a clean
log (no AddressSanitizer, LeakSanitizer or UBSan report when it is a sanitizer build).

Workload, per client thread, in a loop: attention (1-4 ragged sequences, causal or not),
linear (1-64 rows), kv_attention sessions (prefill, decode steps, end), 5% of requests
cancelled after a random delay, 5% with a deadline shorter than their queue time, and
one ModelStreamInfer per round.

  tests/reliability/soak.py --server build-rel/bin/flashq-server --duration 600 --out result.json
CI runs it for under a minute on the ASan/LSan build (ctest -L reliability).
"""
import argparse
import json
import os
import random
import re
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel  # noqa: E402
from rel import C, Ledger, Server  # noqa: E402

SANITIZER_RE = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|Leak|UndefinedBehavior)")
ALLOWED = {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}


def run(args):
    env = {}
    if args.sanitizer:
        supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan.supp")
        env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0",
               "LSAN_OPTIONS": f"suppressions={supp}:print_suppressions=0",
               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    srv = Server("--max-queue-delay-us=1000", "--kv-cache-blocks=48", name="soak", env=env,
                 binary=args.server).start(timeout=300)
    ledger = Ledger("soak")
    stop = threading.Event()
    rss = [(0.0, srv.rss_mb())]
    t_start = time.monotonic()
    errors = []

    def client(tid):
        rng = np.random.default_rng(100 + tid)
        pr = random.Random(tid)
        ch = rel.channel(srv.url)
        st = rel.stub(ch)
        i = 0
        window = threading.Semaphore(16)  # outstanding requests per client

        def send(req, key, timeout=60.0, cancel_after=None):
            window.acquire()
            ledger.send(key)
            f = st.ModelInfer.future(req, timeout=timeout)

            def done(f):
                ledger.answer(key, rel.future_code(f))
                window.release()
            f.add_done_callback(done)
            if cancel_after is not None:
                time.sleep(cancel_after)
                f.cancel()
            return f

        try:
            while not stop.is_set():
                i += 1
                kind = pr.random()
                key = f"{tid}-{i}"
                timeout = 0.002 if pr.random() < 0.05 else 60.0
                cancel = pr.uniform(0, 0.02) if pr.random() < 0.05 else None
                if kind < 0.35:
                    seqs = pr.randint(1, 4)
                    req = rel.attention_req(rng, tokens=pr.choice([16, 32, 64, 128]) * seqs, seqs=seqs,
                                            causal=pr.random() < 0.5)
                    f = send(req, key, timeout, cancel)
                    if pr.random() < 0.5:
                        rel.future_code(f)  # wait now and then: a mix of closed and open loop
                elif kind < 0.65:
                    send(rel.lin_req(rng, m=pr.randint(1, 64)), key, timeout, cancel)
                elif kind < 0.9:
                    sid = tid * 1_000_000 + i
                    steps = pr.randint(1, 8)
                    for s in range(steps + 1):
                        req = rel.kv_req(rng, sid, n=pr.randint(8, 64) if s == 0 else 1, start=s == 0, end=s == steps)
                        f = send(req, f"{key}-{s}")
                        try:
                            f.result()
                        except Exception:
                            break  # cache full or similar: the session ends here (idle reaping frees it)
                else:
                    reqs = [rel.lin_req(rng, m=pr.randint(1, 8)) for _ in range(pr.randint(1, 16))]
                    keys = [f"{key}-st{k}" for k in range(len(reqs))]
                    for k, r in zip(keys, reqs):
                        r.id = k
                        ledger.send(k)
                    try:
                        for resp in st.ModelStreamInfer(iter(reqs), timeout=60):
                            e = resp.error_message
                            ledger.answer(resp.infer_response.id, "OK" if not e else e.split(":")[0])
                    except Exception as e:  # the stream failed: what is left counts as lost below
                        errors.append(f"stream: {e}")
                time.sleep(pr.uniform(0, 0.005))
        except Exception as e:  # noqa: BLE001
            errors.append(f"client {tid}: {e!r}")
        finally:
            time.sleep(0.5)
            ch.close()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(args.clients)]
    for t in threads:
        t.start()
    next_sample = time.monotonic() + 5
    while time.monotonic() - t_start < args.duration:
        time.sleep(0.2)
        if time.monotonic() >= next_sample:
            rss.append((round(time.monotonic() - t_start, 1), srv.rss_mb()))
            next_sample += 5
            if args.verbose:
                print(f"t={rss[-1][0]}s sent={ledger.sent} answered={ledger.answered} rss={rss[-1][1]:.0f} MB",
                      flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    try:
        rel.wait_for(lambda: not ledger.missing(), 120, what="all answers")
    except AssertionError:
        pass
    rss.append((round(time.monotonic() - t_start, 1), srv.rss_mb()))
    code = srv.stop(timeout=120)
    log = open(srv.log_path, errors="replace").read()
    san = SANITIZER_RE.findall(log)
    warm = [r for t, r in rss if t >= min(60.0, args.duration / 4)]
    result = {
        "duration_s": args.duration, "clients": args.clients, "sanitizer": args.sanitizer,
        **ledger.summary(), "exit_code": code, "sanitizer_reports": len(san),
        "rss_first_mb": round(rss[0][1], 1), "rss_warm_mb": round(warm[0], 1) if warm else None,
        "rss_max_mb": round(max(r for _, r in rss), 1), "rss_end_mb": round(rss[-1][1], 1),
        "rss_growth_after_warmup_mb": round(rss[-1][1] - warm[0], 1) if warm else None,
        "client_errors": errors[:5], "server_log": srv.log_path,
    }
    bad = []
    if ledger.missing():
        bad.append(f"{len(ledger.missing())} requests lost")
    if ledger.double:
        bad.append(f"{ledger.double} answered twice")
    unexpected = {c: n for c, n in ledger.codes.items() if c not in ALLOWED}
    if unexpected:
        bad.append(f"unexpected codes {unexpected}")
    if code != 0:
        bad.append(f"server exit code {code}")
    if san:
        bad.append(f"sanitizer reports in {srv.log_path}")
    if errors:
        bad.append(f"client errors: {errors[:3]}")
    if args.rss_bound_mb and result["rss_growth_after_warmup_mb"] is not None and \
            result["rss_growth_after_warmup_mb"] > args.rss_bound_mb:
        bad.append(f"RSS grew {result['rss_growth_after_warmup_mb']} MB after warm-up (bound {args.rss_bound_mb})")
    result["failures"] = bad
    result["rss_samples"] = rss
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=rel.SERVER_BIN)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sanitizer", action="store_true", help="server is an ASan/LSan/UBSan build")
    ap.add_argument("--rss-bound-mb", type=float, default=64, help="max RSS growth after warm-up (0: no check)")
    ap.add_argument("--out", help="write the JSON result here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.server):
        print(f"soak: {args.server} not built: skipping")
        return 77
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    rel.record("soak", {k: v for k, v in result.items() if k != "rss_samples"})
    if result["failures"]:
        print("SOAK FAILED: " + "; ".join(result["failures"]), file=sys.stderr)
        return 1
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
