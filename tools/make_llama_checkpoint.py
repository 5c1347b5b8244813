#!/usr/bin/env python3
"""Writes a Llama-3-8B-shaped GPTQ checkpoint (the decoder layers' 7 projections, random
weights) as AutoGPTQ writes it, and a model repository with one model per layer and
projection: the load-time test for real checkpoints (32 x 7 = 224 models, ~3.6 GB of INT4).

  tools/make_llama_checkpoint.py /data/llama-3-8b-gptq /data/llama-repo
  flashq-server --model-repository=/data/llama-repo     # "ready in ... s" is the load time

Embeddings, norms and lm_head are left out: the server serves linear layers only. The packed
words are uniform random (every 32-bit word is 8 valid 4-bit values), scales are positive
FP16 of about 1/(8 sqrt(K)), symmetric v1 zero points (7 = 8 - 1), trivial g_idx: a checkpoint
the server must read, unpack, repack and upload in full, written in seconds.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint as hf  # noqa: E402

HIDDEN, INTERMEDIATE, KV = 4096, 14336, 1024
PROJ = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", HIDDEN, KV), ("self_attn.v_proj", HIDDEN, KV),
        ("self_attn.o_proj", HIDDEN, HIDDEN), ("mlp.gate_proj", HIDDEN, INTERMEDIATE),
        ("mlp.up_proj", HIDDEN, INTERMEDIATE), ("mlp.down_proj", INTERMEDIATE, HIDDEN)]


def gptq_module(rng, k, n, group):
    g = k // group
    qweight = rng.integers(0, 2 ** 32, (k // 8, n), dtype=np.uint32).view(np.int32)
    qzeros = np.full((g, n // 8), 0x77777777, np.uint32).view(np.int32)  # v1: zero 8 stored as 7
    scales = (rng.uniform(0.5, 1.5, (g, n)) / (8 * np.sqrt(k))).astype(np.float16)
    g_idx = (np.arange(k) // group).astype(np.int32)
    return {"qweight": hf.T("I32", qweight), "qzeros": hf.T("I32", qzeros), "scales": hf.T("F16", scales),
            "g_idx": hf.T("I32", g_idx)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="folder to write the checkpoint into")
    ap.add_argument("repository", nargs="?", help="also write a model repository here (tools/make_repository.py)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--shard-gb", type=float, default=2.0, help="shard size (save_pretrained's max_shard_size)")
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()

    t0 = time.monotonic()
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.checkpoint, exist_ok=True)
    modules = [(f"model.layers.{l}.{p}", k, n) for l in range(args.layers) for p, k, n in PROJ]
    limit = int(args.shard_gb * (1 << 30))
    g = args.group_size
    per_module = [k * n // 2 + (k // g) * n * 2 + (k // g) * (n // 8) * 4 + 4 * k for _, k, n in modules]
    # Shard boundaries first, so every file name carries the final count (model-0000i-of-0000n).
    shards, cur, size = [], [], 0
    for m, b in zip(modules, per_module):
        if cur and size + b > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(m)
        size += b
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for prefix, k, n in shard:
            for t, v in gptq_module(rng, k, n, args.group_size).items():
                tensors[f"{prefix}.{t}"] = v
        hf.save_file(os.path.join(args.checkpoint, fname), tensors)
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update({name: fname for name in tensors})
        print(f"{fname}: {len(shard)} modules, {sum(t.nbytes for t in tensors.values()) / 1e9:.2f} GB "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
        del tensors
    qc = hf.gptq_config(group=args.group_size, desc_act=False, sym=True, v2=False)
    import json
    with open(os.path.join(args.checkpoint, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(args.checkpoint, "config.json"), "w") as f:
        json.dump(hf.llama_config(HIDDEN, INTERMEDIATE, args.layers, quantization_config=qc), f, indent=2)
    with open(os.path.join(args.checkpoint, "quantize_config.json"), "w") as f:
        json.dump(qc, f, indent=2)
    print(f"{args.checkpoint}: {len(modules)} modules, {total / 1e9:.2f} GB in {len(shards)} shards, "
          f"{time.monotonic() - t0:.1f} s")
    if args.repository:
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_repository.py"),
                        args.checkpoint, args.repository], check=True)


if __name__ == "__main__":
    main()
