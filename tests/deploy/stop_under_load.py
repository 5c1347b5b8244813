#!/usr/bin/env python3
"""Stops a flashq server under load and accounts for every request it was sent.

    stop_under_load.py GRPC_HOST:PORT -- STOP_COMMAND...      e.g. -- podman stop -t 30 NAME

Clients (tritonclient, one channel each) keep several `attention` requests in flight.
After a few seconds STOP_COMMAND runs (it returns once the server has exited), the clients
stop sending, and every request must have exactly one answer:
- OK, with O bitwise equal to the first answer, which matches a float64 reference (the
  server is batch-invariant, so a result never depends on the batch it ran in);
- or UNAVAILABLE: the request reached the server after it stopped admitting, or found no
  server. CANCELLED is accepted only for requests sent after the stop began (gRPC itself
  shutting down).
Requests in flight when the stop began must be among the OK ones: at least one such
request is required, so the check cannot pass without load. Exit 0 on success.
"""
import collections
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from infer_once import attention_request, check_attention

CLIENTS = 3
IN_FLIGHT = 4  # per client
LOAD_BEFORE_STOP_S = 3.0


def main():
    addr, sep, stop_cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
    assert sep == "--" and stop_cmd, __doc__
    inputs, q, k, v, cu = attention_request(np.random.default_rng(11), [200, 312])
    outputs = [grpcclient.InferRequestedOutput("O")]
    first = grpcclient.InferenceServerClient(url=addr).infer(
        "attention", inputs, outputs=outputs, parameters={"causal": True}, client_timeout=60).as_numpy("O")
    check_attention(first, q, k, v, cu)

    lock = threading.Lock()
    sent = {}                       # key -> send time
    answers = {}                    # key -> (code, answer time)
    double, wrong = [], []
    stop_sending = threading.Event()

    def client(c):
        cl = grpcclient.InferenceServerClient(url=addr)
        slots = threading.Semaphore(IN_FLIGHT)
        refused = threading.Event()  # the server is gone or draining: send more slowly
        i = 0
        while not stop_sending.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            if refused.is_set():
                time.sleep(0.05)
            key = f"{c}-{i}"
            i += 1

            def done(result, error, key=key):
                code = "OK" if error is None else str(error.status()).replace("StatusCode.", "")
                if code == "UNAVAILABLE":
                    refused.set()
                same = error is not None or np.array_equal(result.as_numpy("O"), first)
                with lock:
                    if key in answers:
                        double.append(key)
                    if not same:
                        wrong.append(key)
                    answers[key] = (code, time.monotonic())
                slots.release()

            with lock:
                sent[key] = time.monotonic()
            try:
                cl.async_infer("attention", inputs, done, outputs=outputs, parameters={"causal": True},
                               client_timeout=60)
            except InferenceServerException as e:  # refused before a call existed: that is its answer
                done(None, e)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(LOAD_BEFORE_STOP_S)
    t_stop = time.monotonic()
    stop = subprocess.run(stop_cmd, capture_output=True, text=True)
    stop_s = time.monotonic() - t_stop
    stop_sending.set()
    for t in threads:
        t.join(timeout=10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if len(answers) >= len(sent):
                break
        time.sleep(0.1)

    with lock:
        lost = sorted(set(sent) - set(answers))
        codes = collections.Counter(code for code, _ in answers.values())
        early_bad = collections.Counter(code for key, (code, _) in answers.items()
                                        if sent[key] < t_stop and code not in ("OK", "UNAVAILABLE"))
        other = collections.Counter(code for code, _ in answers.values()
                                    if code not in ("OK", "UNAVAILABLE", "CANCELLED"))
        in_flight_ok = sum(1 for key, (code, t_ans) in answers.items()
                           if code == "OK" and sent[key] < t_stop <= t_ans)
    print(f"stop_under_load: `{' '.join(stop_cmd)}` took {stop_s:.1f} s (exit {stop.returncode}); "
          f"{len(sent)} requests sent, answers {dict(codes)}; {in_flight_ok} in flight at the stop answered OK")
    problems = []
    if stop.returncode != 0:
        problems.append(f"stop command failed: {stop.stdout}{stop.stderr}")
    if lost:
        problems.append(f"{len(lost)} requests got no answer")
    if double:
        problems.append(f"{len(double)} requests answered twice")
    if wrong:
        problems.append(f"{len(wrong)} OK answers differ from the reference result")
    if other:
        problems.append(f"unexpected codes {dict(other)}")
    if early_bad:
        problems.append(f"requests sent before the stop got {dict(early_bad)}")
    if in_flight_ok == 0:
        problems.append("no request was in flight at the stop, so draining was not exercised")
    for p in problems:
        print(f"stop_under_load: FAILED: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
