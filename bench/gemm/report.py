#!/usr/bin/env python3
"""Merges gemm_bench JSON and torch_peers JSON into bench/results/gemm-<device>.{json,md} (one current record per
device: a new run replaces it; the files name the device, date and commit inside):
times, TFLOP/s, effective weight GB/s vs the copy ceiling measured in the same run, ratios
against cuBLASLt BF16 (our wrapper, heuristic algorithm = its fastest mode), and the bars.
Every bar on a mode-dependent kernel is stated per mode: "inv" is the batch-invariant mode, the
server's default, "fast" the mode with invariance off.

  report.py --ours gemm_ours.json --torch gemm_torch.json --outdir DIR --commit C [--date D]
  report.py --from-record bench/results/gemm-<device>.json --outdir DIR [--name BASE] [--note TEXT]
The second form rebuilds the markdown and the bars from a merged record this script wrote."""
import argparse, datetime, json, os, re, subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours")
    ap.add_argument("--torch")
    ap.add_argument("--from-record", help="a merged record written by this script (replaces --ours/--torch)")
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--name", help="output base name (default gemm-<device>)")
    ap.add_argument("--note", default="", help="a line quoted above the title")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--date", default=None)
    a = ap.parse_args()
    if a.from_record:
        rec = json.load(open(a.from_record))
        ours = dict(device=rec["device"], copy_ceiling_gbs=rec["copy_ceiling_gbs"], checks=rec.get("checks"),
                    records=[r for r in rec["records"] if not r["method"].startswith("torch_")])
        peers = dict(torch=rec.get("torch"), errors=rec.get("peer_errors", []),
                     records=[r for r in rec["records"] if r["method"].startswith("torch_")])
        a.commit = rec.get("commit", "") if a.commit is None else a.commit
        a.date = rec.get("date") if a.date is None else a.date
    else:
        if not (a.ours and a.torch):
            ap.error("--ours and --torch (or --from-record) are required")
        ours = json.load(open(a.ours))
        try:
            peers = json.load(open(a.torch))
        except Exception as e:  # noqa: BLE001
            peers = dict(records=[], errors=[f"torch_peers.json unreadable: {e!r}"])
    a.commit = a.commit or ""
    a.date = a.date or datetime.date.today().isoformat()
    copy = ours["copy_ceiling_gbs"]
    recs = ours["records"] + peers.get("records", [])
    for r in recs:
        r["tflops"] = 2.0 * r["M"] * r["N"] * r["K"] / r["us"] / 1e6
        r["weight_gbs"] = r["weight_bytes"] / r["us"] / 1e3
        r["weight_gbs_vs_copy"] = r["weight_gbs"] / copy
    idx = {(r["method"], r["K"], r["N"], r["M"], r["batch_invariant"]): r for r in recs}

    def us(m, K, N, M, inv=False):
        r = idx.get((m, K, N, M, inv))
        return r["us"] if r else None

    def ratio(num, den):
        return None if (num is None or den is None) else num / den

    device = ours["device"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
    base = os.path.join(a.outdir, a.name or f"gemm-{slug}")
    shapes = sorted({(r["K"], r["N"]) for r in ours["records"]}, key=lambda s: (s[0] * s[1], s))
    Ms = sorted({r["M"] for r in ours["records"]})
    bars = []
    w8a8 = {}  # (scales, mode) -> [(K, N, M, ratio vs torch)]
    lines = ([f"> {a.note}", ""] if a.note else []) + [f"# gemm benchmark: {device}, {a.date}, commit {a.commit}", "",
             f"Copy ceiling (device-to-device, read+write) measured in this run: **{copy:.0f} GB/s**. "
             "Times are medians of 7 replays of a CUDA graph of back-to-back calls rotating over >= 256 MB of weight copies (L2 defeated; no host launch overhead), each measurement after 200 ms idle (so none inherits a throttled clock from the one before), ours and torch alike. "
             "Ratios are speed-ups over our cuBLASLt BF16 wrapper in its fastest (heuristic, non-invariant) mode. "
             "inv = batch-invariant mode (pinned algorithm / M-independent split-K); fast = mode off. "
             "W4A16 uses group 128 (fp16 scales + u8 zeros counted in weight bytes). W8A8 times exclude activation quantization "
             "(as torch._scaled_mm's do); act_quant_fp8 is listed separately.", ""]
    for K, N in shapes:
        lines += [f"## K={K}, N={N}", "",
                  "| M | BF16 LT fast µs | BF16 LT inv µs | torch BF16 µs | W4A16 inv µs | W4A16 fast µs | torch int4 µs | W4 inv / BF16 | W4 fast / BF16 | W4 inv weight GB/s (% copy) | W8A16 µs | W8A16 / BF16 | W8A8 row µs (LT inv/fast) | torch FP8 row µs | W8A8 tensor µs (LT inv/fast) | torch FP8 tensor µs | act quant µs |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for M in Ms:
            bf = us("bf16_cublaslt", K, N, M, False)
            bfi = us("bf16_cublaslt", K, N, M, True)
            w4i = us("w4a16_g128", K, N, M, True)
            w4f = us("w4a16_g128", K, N, M, False)
            w8 = us("w8a16", K, N, M, True)
            r4i, r4f, r8 = ratio(bf, w4i), ratio(bf, w4f), ratio(bf, w8)
            rw_i, rw_f = us("w8a8_rowwise", K, N, M, True), us("w8a8_rowwise", K, N, M, False)
            tw_i, tw_f = us("w8a8_tensorwise", K, N, M, True), us("w8a8_tensorwise", K, N, M, False)
            t_rw, t_tw = us("torch_scaled_mm_rowwise", K, N, M), us("torch_scaled_mm_tensorwise", K, N, M)
            w4r = idx.get(("w4a16_g128", K, N, M, True))
            f = lambda v, d=2: "n/a" if v is None else f"{v:.{d}f}"
            lines.append(f"| {M} | {f(bf)} | {f(bfi)} | {f(us('torch_bf16_matmul', K, N, M))} | {f(w4i)} | {f(w4f)} | "
                         f"{f(us('torch_int4pack_g128', K, N, M))} | {f(r4i)}x | {f(r4f)}x | "
                         f"{f(w4r['weight_gbs'], 0) if w4r else 'n/a'} ({f(100 * w4r['weight_gbs_vs_copy'], 0) if w4r else 'n/a'}%) | "
                         f"{f(w8)} | {f(r8)}x | {f(rw_i)}/{f(rw_f)} | {f(t_rw)} | {f(tw_i)}/{f(tw_f)} | {f(t_tw)} | {f(us('act_quant_fp8_rowwise', K, N, M, True))} |")
            if M <= 16:
                bars.append(("W4A16 inv >= 2.5x BF16 (M<=16)", K, N, M, r4i, 2.5))
                bars.append(("W8A16 >= 1.6x BF16 (M<=16)", K, N, M, r8, 1.6))
            if M == 64:
                bars.append(("W4A16 inv >= 1.3x BF16 (M=64)", K, N, M, r4i, 1.3))
            if M == 4096:
                bars.append(("W4A16 fast >= 0.8x BF16 (M=4096)", K, N, M, r4f, 0.8))
                bars.append(("W4A16 inv at M=4096 (reported, no bar)", K, N, M, r4i, 0.0))
            # W8A8 against torch._scaled_mm in each path on its own. The server's default (batch-invariant) runs our
            # GEMM on sm_90 and cuBLASLt's pinned algorithm elsewhere (reported, no bar); "fast" is invariance off.
            rw_o, tw_o = us("w8a8_rowwise_ours", K, N, M, True), us("w8a8_tensorwise_ours", K, N, M, True)
            for scales, t_ref, paths in (("row-wise", t_rw, (("inv, ours", rw_o, 0.95), ("inv, cuBLASLt", rw_i, 0.0),
                                                             ("fast", rw_f, 0.95))),
                                         ("tensor-wise", t_tw, (("inv, ours", tw_o, 0.95), ("inv, cuBLASLt", tw_i, 0.0),
                                                                ("fast", tw_f, 0.95)))):
                for mode, v, need in paths:
                    r = ratio(t_ref, v)
                    if v is None:
                        continue
                    bars.append((f"W8A8 {scales} {mode} >= 0.95x torch._scaled_mm" if need else
                                 f"W8A8 {scales} {mode} vs torch._scaled_mm (reported, no bar)", K, N, M, r, need))
                    if r is not None:
                        w8a8.setdefault((scales, mode), []).append((K, N, M, r))
        lines.append("")
    # BF16 weights in the batch-invariant mode: our kernel (one fp32 chain per output, any M) against cuBLASLt.
    if any(r["method"] == "bf16_ours" for r in ours["records"]):
        lines += ["## BF16 weights in the batch-invariant mode: our kernel against cuBLASLt", "",
                  "Speed-ups of `bf16_ours` (RunW16Invariant) over our cuBLASLt BF16 wrapper in its fastest mode (LT fast) "
                  "and in its batch-invariant mode (one pinned algorithm, no split-K: the path ours would replace).", "",
                  "| K | N | M | LT fast µs | LT inv µs | ours µs | ours / LT fast | ours / LT inv | ours TFLOP/s | ours weight GB/s (% copy) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for K, N in shapes:
            for M in Ms:
                bf, bfi, bo = us("bf16_cublaslt", K, N, M, False), us("bf16_cublaslt", K, N, M, True), us("bf16_ours", K, N, M, True)
                r = idx.get(("bf16_ours", K, N, M, True))
                f = lambda v, d=2: "n/a" if v is None else f"{v:.{d}f}"
                lines.append(f"| {K} | {N} | {M} | {f(bf)} | {f(bfi)} | {f(bo)} | {f(ratio(bf, bo))}x | {f(ratio(bfi, bo))}x | "
                             f"{f(r['tflops'], 0) if r else 'n/a'} | "
                             f"{f(r['weight_gbs'], 0) if r else 'n/a'} ({f(100 * r['weight_gbs_vs_copy'], 0) if r else 'n/a'}%) |")
                need = 0.95 if M <= 64 else 0.85 if M in (256, 1024) else 0.8 if M == 4096 else None
                if need is not None:
                    bars.append((f"BF16 inv (ours) >= {need}x BF16 LT fast", K, N, M, ratio(bf, bo), need))
        lines.append("")
    lines += ["## W8A8 against torch._scaled_mm, each path on its own", "",
              "Speed-up over torch._scaled_mm in the same run (> 1: ours faster). inv = batch-invariant mode, the "
              "server's default: our invariant GEMM (RunW8A8Invariant) on sm_90, cuBLASLt's pinned algorithm elsewhere "
              "(reported, no bar); fast = invariance off (cuBLASLt's heuristic).", "",
              "| scales | mode | cells >= 0.95x | range | cells below 0.95x (K x N, M: ratio) |", "|---|---|---|---|---|"]
    for (scales, mode), cells in sorted(w8a8.items(), key=lambda kv: (kv[0][0], ["inv, ours", "inv, cuBLASLt", "fast"].index(kv[0][1]))):
        rs = [c[3] for c in cells]
        below = [c for c in cells if c[3] < 0.95]
        lines.append(f"| {scales} | {mode}{' (default on sm_90)' if mode == 'inv, ours' else ''} | "
                     f"{len(cells) - len(below)} of {len(cells)} | {min(rs):.2f}-{max(rs):.2f}x | "
                     + (", ".join(f"{K}x{N} {M}: {r:.2f}" for K, N, M, r in below) or "none") + " |")
    lines += ["", "## Bars", "", "| bar | K | N | M | measured | pass |", "|---|---|---|---|---|---|"]
    for name, K, N, M, v, need in bars:
        ok = "n/a" if v is None else ("yes" if v >= need else "**no**")
        lines.append(f"| {name} | {K} | {N} | {M} | {'n/a' if v is None else f'{v:.2f}x'} | {ok} |")
    lines += ["", "## Correctness checks in the bench (M=4 vs CPU reference, rel. L2 error)", ""]
    for c in ours.get("checks", []):
        lines.append(f"- K={c['K']} N={c['N']}: " + ", ".join(f"{k} {v:.2e}" for k, v in c["rel_err"].items()))
    if peers.get("errors"):
        lines += ["", "## Peer errors", ""] + [f"- {e}" for e in peers["errors"]]
    out = dict(device=device, date=a.date, commit=a.commit, copy_ceiling_gbs=copy, torch=peers.get("torch"),
               checks=ours.get("checks"), records=recs, peer_errors=peers.get("errors", []),
               bars=[dict(bar=b[0], K=b[1], N=b[2], M=b[3], ratio=b[4], need=b[5]) for b in bars])
    json.dump(out, open(base + ".json", "w"), indent=1)
    open(base + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
