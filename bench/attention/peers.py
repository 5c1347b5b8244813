#!/usr/bin/env python3
"""PyTorch peers for the attention benchmark, run in the same job as attention_bench, and the merge.

Peers: SDPA with the flash backend and with the cuDNN backend ((B, H, L, D) tensors), and
torch.nn.attention.varlen.varlen_attn for the ragged batch (and for paged decode when this torch
version takes a block_table). Timing: triton.testing.do_bench (L2 flush between repetitions,
median), the same method as attention_bench. Prefill TFLOP/s = 4*sum(Lq*Lk)*H*D (halved for
causal, counting the diagonal as attention_bench does); decode GB/s = K+V bytes / time, against
the device-to-device copy ceiling attention_bench measured in the same run.

Usage: peers.py --ours attention_ours.json --out-dir DIR [--commit HASH]
Writes DIR/attention-<device>.json and .md (a new run replaces them; they name the device, date and commit).
"""
import argparse
import datetime
import inspect
import json
import os
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def bench_ms(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def try_bench(fn):
    try:
        return bench_ms(fn), None
    except Exception as e:  # a peer that cannot run this shape is reported, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def sdpa(backend, q, k, v, causal, gqa=False):
    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


def varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def prefill_peers(row):
    h, d, causal, lens = row["heads"], row["head_dim"], row["causal"], row["lens"]
    dev, dt = "cuda", torch.bfloat16
    res, notes = {}, {}
    flops = row["flops"]
    uniform = len(set(lens)) == 1
    if uniform:
        b, l = len(lens), lens[0]
        q, k, v = (torch.randn(b, h, l, d, device=dev, dtype=dt) for _ in range(3))
        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            ms, err = try_bench(sdpa(be, q, k, v, causal))
            res[name] = ms
            if err:
                notes[name] = err
        del q, k, v
    varlen_attn, params = varlen_fn()
    if varlen_attn is not None:
        total = sum(lens)
        q, k, v = (torch.randn(total, h, d, device=dev, dtype=dt) for _ in range(3))
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(torch.tensor(lens, device=dev, dtype=torch.int32), 0)
        kw = {}
        if causal:
            if "is_causal" in params:
                kw["is_causal"] = True
            elif "window_size" in params:
                kw["window_size"] = (-1, 0)
        ms, err = try_bench(lambda: varlen_attn(q, k, v, cu, cu, max(lens), max(lens), **kw))
        res["varlen_attn"] = ms
        if err:
            notes["varlen_attn"] = err
        del q, k, v
    torch.cuda.empty_cache()
    out = {}
    for name, ms in res.items():
        out[name] = None if ms is None else {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    return out, notes


def decode_peers(row):
    b, l, hq, hkv, d = row["batch"], row["len"], row["heads_q"], row["heads_kv"], row["head_dim"]
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
    k = torch.randn(b, hkv, l, d, device=dev, dtype=dt)
    v = torch.randn(b, hkv, l, d, device=dev, dtype=dt)
    res, notes = {}, {}
    for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        ms, err = try_bench(sdpa(be, q, k, v, False, gqa=True))
        if err:  # backend without GQA: expand K/V (reads 4x the bytes; still reported against the true KV bytes)
            ke = k.repeat_interleave(hq // hkv, dim=1)
            ve = v.repeat_interleave(hq // hkv, dim=1)
            ms2, err2 = try_bench(sdpa(be, q, ke, ve, False))
            del ke, ve
            if err2 is None:
                ms = ms2
                notes[name] = "enable_gqa failed (" + err[:100] + "); timed with K/V expanded to Hq heads"
            else:
                notes[name] = err + " | expanded: " + err2
        res[name] = ms
    del q, k, v
    torch.cuda.empty_cache()
    out = {}
    for name, ms in res.items():
        out[name] = None if ms is None else {"ms": ms, "gbps": row["kv_bytes"] / (ms * 1e-3) / 1e9}
    return out, notes


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--commit", default=os.environ.get("FLASHQ_COMMIT", "unknown"))
    args = ap.parse_args()
    ours = json.load(open(args.ours))
    dev_name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", dev_name.lower()).strip("-")
    slug = {"nvidia-h100-80gb-hbm3": "h100", "nvidia-h200": "h200"}.get(slug, slug)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    result = {
        "device": dev_name, "date": date, "commit": args.commit, "torch": torch.__version__,
        "copy_ceiling_gbps": ours["copy_gbps"], "method": "median of CUDA-event-timed runs, L2 flushed before each",
        "prefill": [], "decode": [],
    }
    md = [f"# Attention kernels vs PyTorch peers: {dev_name}, {date}, commit {args.commit}", "",
          f"torch {torch.__version__}. BF16, FP32 accumulation. Medians; L2 flushed before each run. "
          f"Copy ceiling (D2D, read+write) {ours['copy_gbps']:.0f} GB/s.", "",
          "## Prefill (Hq = Hkv = 32), TFLOP/s", "",
          "| shape | ours | ours TMA tails | ours plain wgmma | ours WS+pingpong (cp.async) | ours WS (cp.async) | ours mma.sync (sm80 path) | SDPA flash | SDPA cuDNN | varlen_attn | ours/flash | ours/cuDNN | ours/varlen |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in ours["prefill"]:
        peers, notes = prefill_peers(row)
        entry = dict(row)
        entry["peers"] = peers
        entry["peer_notes"] = notes
        ratios = {}
        for name, pv in peers.items():
            if pv is not None:
                ratios[name] = row["tflops"] / pv["tflops"]
        entry["ratios"] = ratios
        result["prefill"].append(entry)
        g = lambda n: None if peers.get(n) is None else peers[n]["tflops"]
        var = row.get("variant_mma_mt2", {}).get("tflops")
        var_pp = row.get("variant_ws_pingpong", {}).get("tflops")
        var_ws = row.get("variant_ws", {}).get("tflops")
        var_wg = row.get("variant_wgmma", {}).get("tflops")
        var_tt = row.get("variant_tma_tails", {}).get("tflops")
        md.append(f"| {row['name']} | {row['tflops']:.1f} | {fmt(var_tt)} | {fmt(var_wg)} | {fmt(var_pp)} | {fmt(var_ws)} | {fmt(var)} | {fmt(g('sdpa_flash'))} | {fmt(g('sdpa_cudnn'))} | "
                  f"{fmt(g('varlen_attn'))} | {fmt(ratios.get('sdpa_flash'), '.2f')} | "
                  f"{fmt(ratios.get('sdpa_cudnn'), '.2f')} | {fmt(ratios.get('varlen_attn'), '.2f')} |")
        print(md[-1], flush=True)
    md += ["", "## Decode (Hq 32, Hkv 8, hd 128, 1 new token), GB/s of K+V read", "",
           "| B | L | page | split | ours GB/s | % of copy | ours, cp.async loads | SDPA flash | SDPA cuDNN | ours/flash | ours/cuDNN |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    peer_cache = {}
    for row in ours["decode"]:
        key = (row["batch"], row["len"])
        if key not in peer_cache:
            peer_cache[key] = decode_peers(row)
        peers, notes = peer_cache[key]
        entry = dict(row)
        entry["copy_fraction"] = row["gbps"] / ours["copy_gbps"]
        entry["peers"] = peers
        entry["peer_notes"] = notes
        ratios = {n: row["gbps"] / pv["gbps"] for n, pv in peers.items() if pv is not None}
        entry["ratios"] = ratios
        result["decode"].append(entry)
        g = lambda n: None if peers.get(n) is None else peers[n]["gbps"]
        md.append(f"| {row['batch']} | {row['len']} | {row['page']} | {row['split']} | {row['gbps']:.0f} | "
                  f"{100 * entry['copy_fraction']:.0f}% | {fmt(row.get('variant_cpasync', {}).get('gbps'), '.0f')} | {fmt(g('sdpa_flash'), '.0f')} | {fmt(g('sdpa_cudnn'), '.0f')} | "
                  f"{fmt(ratios.get('sdpa_flash'), '.2f')} | {fmt(ratios.get('sdpa_cudnn'), '.2f')} |")
        print(md[-1], flush=True)
    notes = sorted({f"{n}: {t}" for e in result["prefill"] + result["decode"] for n, t in e["peer_notes"].items()})
    if notes:
        md += ["", "Peer notes:", ""] + [f"- {n}" for n in notes]
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, f"attention-{slug}")
    json.dump(result, open(base + ".json", "w"), indent=1)
    open(base + ".md", "w").write("\n".join(md) + "\n")
    print("wrote", base + ".json", base + ".md")


if __name__ == "__main__":
    main()
