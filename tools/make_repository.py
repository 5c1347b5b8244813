#!/usr/bin/env python3
"""Writes a flashq model repository from a Hugging Face checkpoint folder: one linear model
(a folder with a config.pbtxt that names the checkpoint and a tensor prefix) per chosen
decoder layer and projection. The weights stay in the checkpoint; the server reads the
format from its metadata.

  tools/make_repository.py /models/llama-3-8b-gptq models/ --layers 0-3,31 \\
      --projections q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj

Projections are the checkpoint's own (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
down_proj, or qkv_proj / gate_up_proj where it stores them fused), plus qkv_proj and
gate_up_proj made from their parts: one model with N = the sum of the parts' N.
Only the safetensors headers are read (and weight_shape's 16 bytes for compressed-tensors).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_checkpoint as hf  # noqa: E402

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
_MODULE = re.compile(r"^(?P<module>(?:.*\.)?layers\.(?P<layer>\d+)\.(?:[A-Za-z_]+\.)?(?P<proj>[A-Za-z_0-9]+))\."
                     r"(?P<tensor>qweight|weight_packed|weight)$")


def parse_layers(text, available):
    if not text:
        return sorted(available)
    out = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    missing = sorted(out - set(available))
    if missing:
        raise SystemExit(f"layers {missing} are not in the checkpoint (it has {min(available)}..{max(available)})")
    return sorted(out)


def shape_of(tensors, module):
    """(K, N) of one module from the headers, whatever its layout."""
    def entry(name):
        return tensors.get(f"{module}.{name}", (None, None))[1]
    qw, sc = entry("qweight"), entry("scales")
    if qw is not None:
        if sc is None:
            raise SystemExit(f"{module}: qweight without scales")
        if qw["shape"][1] == sc["shape"][1]:  # GPTQ: qweight [K/8, N]
            g_idx = entry("g_idx")
            k = g_idx["shape"][0] if g_idx is not None else 8 * qw["shape"][0]
            return k, qw["shape"][1]
        return qw["shape"][0], 8 * qw["shape"][1]  # AWQ GEMM: qweight [K, N/8]
    wp = entry("weight_packed")
    if wp is not None:
        ws = entry("weight_shape")
        if ws is not None:
            import numpy as np
            path, e = tensors[f"{module}.weight_shape"]
            raw = hf.read_tensor(path, e)
            n, k = np.frombuffer(raw, np.int64 if e["dtype"] == "I64" else np.int32)[:2]
            return int(k), int(n)
        return 8 * wp["shape"][1], wp["shape"][0]
    w = entry("weight")
    return w["shape"][1], w["shape"][0]


def config_text(name, checkpoint, tensor, k, n, dtype, max_batch_tokens):
    def param(key, value):
        return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return (f"# {tensor} of {checkpoint}\n"
            f'name: "{name}"\nbackend: "flashq"\nmax_batch_size: 0\n'
            f'input [ {{ name: "X" data_type: TYPE_{dtype} dims: [ -1, {k} ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_{dtype} dims: [ -1, {n} ] }} ]\n'
            "dynamic_batching {\n  max_queue_delay_microseconds: 0\n  default_queue_policy { max_queue_size: 1024 }\n}\n"
            + param("kind", "linear") + param("checkpoint", checkpoint) + param("tensor", tensor)
            + param("in_features", k) + param("out_features", n) + param("max_batch_tokens", max_batch_tokens))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="Hugging Face checkpoint folder (or one .safetensors file)")
    ap.add_argument("out", help="model repository folder to write into (created if missing)")
    ap.add_argument("--layers", default="", help="decoder layers, e.g. 0-3,31 (default: all)")
    ap.add_argument("--projections", default="",
                    help="comma-separated: the checkpoint's projections and/or qkv_proj, gate_up_proj (default: "
                         "every projection the checkpoint has)")
    ap.add_argument("--name", default="layer{layer}_{proj}", help="model name pattern (default: layer{layer}_{proj})")
    ap.add_argument("--dtype", default="FP16", choices=["FP16", "BF16"], help="declared X/Y datatype")
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument("--relative", action="store_true",
                    help="name the checkpoint relative to each model folder (default: absolute path)")
    args = ap.parse_args(argv)

    ckpt = os.path.abspath(args.checkpoint)
    tensors = hf.checkpoint_tensors(ckpt)
    modules = {}  # (layer, proj) -> module prefix
    for name in tensors:
        m = _MODULE.match(name)
        if m:
            modules.setdefault((int(m["layer"]), m["proj"]), m["module"])
    if not modules:
        raise SystemExit(f"{ckpt}: no decoder-layer projections (names like model.layers.<i>.<...>.<proj>.weight)")
    layers = parse_layers(args.layers, {l for l, _ in modules})
    have = sorted({p for _, p in modules})
    projections = [p.strip() for p in args.projections.split(",") if p.strip()] or have
    for p in projections:
        if p not in have and not (p in FUSED and all(q in have for q in FUSED[p])):
            fusable = [f for f in FUSED if all(q in have for q in FUSED[f])]
            raise SystemExit(f"projection {p} is not in the checkpoint (it has {', '.join(have)}"
                             + (f"; and can fuse {', '.join(fusable)})" if fusable else ")"))

    os.makedirs(args.out, exist_ok=True)
    written = 0
    for layer in layers:
        for proj in projections:
            parts = [proj] if (layer, proj) in modules else FUSED.get(proj, [proj])
            if any((layer, p) not in modules for p in parts):
                raise SystemExit(f"layer {layer} has no {proj}")
            prefixes = [modules[(layer, p)] for p in parts]
            shapes = [shape_of(tensors, m) for m in prefixes]
            k = shapes[0][0]
            if any(s[0] != k for s in shapes):
                raise SystemExit(f"layer {layer} {proj}: parts differ in K: {shapes}")
            n = sum(s[1] for s in shapes)
            name = args.name.format(layer=layer, proj=proj)
            folder = os.path.join(args.out, name)
            os.makedirs(folder, exist_ok=True)
            where = os.path.relpath(ckpt, os.path.abspath(folder)) if args.relative else ckpt
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write(config_text(name, where, ",".join(prefixes), k, n, args.dtype, args.max_batch_tokens))
            written += 1
    print(f"wrote {written} models ({len(layers)} layers x {len(projections)} projections) into {args.out}")


if __name__ == "__main__":
    main()
