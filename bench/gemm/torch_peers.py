#!/usr/bin/env python3
"""torch peers for bench/gemm, timed the same way as gemm_bench (a CUDA graph of
back-to-back calls rotating over weight copies totalling >= 256 MB, median of 7 replays, after 200 ms idle):
  torch_bf16_matmul     x @ w.T (bf16)
  torch_int4pack_g128   torch._weight_int4pack_mm (W4, group 128, tinygemm layout)
  torch_scaled_mm_tensorwise / torch_scaled_mm_rowwise   torch._scaled_mm FP8 E4M3 -> bf16
Writes JSON with one record per (method, K, N, M); failures are recorded, not hidden."""
import argparse, json, math, sys, time, traceback

import torch

L2_DEFEAT = 256 << 20
COOLDOWN_S = 0.2  # gemm_bench.cu kCooldownMs


def time_us(fn, est_us):
    """Median of 7 replays of a CUDA graph of `iters` calls (no Python launch overhead in
    the numbers, as in gemm_bench); falls back to eager batches if capture fails."""
    iters = max(5, min(200, int(2000.0 / max(est_us, 1.0))))
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(iters):
                fn(i)
        run, mode = g.replay, "graph"
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()
        run, mode = (lambda: [fn(i) for i in range(iters)]), "eager"
    run()
    torch.cuda.synchronize()
    time.sleep(COOLDOWN_S)  # as gemm_bench's kCooldownMs: each measurement starts from a cool GPU
    ts = []
    for _ in range(7):
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(1000.0 * a.elapsed_time(b) / iters)
    ts.sort()
    return ts[len(ts) // 2], mode


def estimate_us(fn):
    fn(0)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn(1)
    fn(2)
    b.record()
    b.synchronize()
    return 500.0 * a.elapsed_time(b)


def copies(n_bytes):
    return max(2, math.ceil(L2_DEFEAT / n_bytes))


def profile_scaled_mm(K, N, M):
    f8, dev = torch.float8_e4m3fn, torch.device("cuda")
    w = torch.randn(N, K, device=dev) * 0.02
    sw = (w.abs().amax() / 448).reshape(())
    w8 = (w / sw).to(f8).t()
    x = torch.randn(M, K, device=dev)
    sx = (x.abs().amax() / 448).reshape(())
    x8 = (x / sx).to(f8)
    run = lambda: torch._scaled_mm(x8, w8, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    run()  # the heuristic's choice and its first-call costs stay outside the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    run()
    run()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="torch_peers.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", nargs=3, type=int, metavar=("K", "N", "M"),
                    help="two tensor-wise torch._scaled_mm calls in an NVTX range 'prof', for ncu --nvtx-include prof/")
    args = ap.parse_args()
    if args.profile:
        profile_scaled_mm(*args.profile)
        return
    shapes = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192)]
    ms = [1, 4, 16, 32, 64, 128, 256, 1024, 4096]
    if args.quick:
        shapes, ms = [(4096, 4096), (8192, 8192)], [1, 16, 32, 64, 128]
    dev = torch.device("cuda")
    recs, errors = [], []
    torch.manual_seed(0)
    for K, N in shapes:
        w = torch.randn(N, K, device=dev, dtype=torch.float32) * 0.02
        wb = [w.to(torch.bfloat16) for _ in range(copies(N * K * 2))]
        # int4 tinygemm layout, group 128
        g = 128
        wg = w.reshape(N, K // g, g)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
        w_u8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
        int4 = None
        try:
            packed = torch._convert_weight_to_int4pack(w_u8, 8)
            zeros = lo + 8 * scale  # tinygemm: w = (q - 8) * scale + zero
            sz = torch.stack([scale.reshape(N, K // g).t(), zeros.reshape(N, K // g).t()], dim=-1).to(torch.bfloat16).contiguous()
            int4 = [(packed.clone(), sz) for _ in range(copies(N * K // 2))]
        except Exception as e:  # noqa: BLE001
            errors.append(f"int4pack K={K} N={N}: {e!r}")
        # fp8
        f8 = torch.float8_e4m3fn
        amax_t = w.abs().amax().clamp(min=1e-12)
        w8_t = (w / (amax_t / 448)).to(f8)
        amax_c = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        w8_c = (w / (amax_c / 448)).to(f8)
        n8 = copies(N * K)
        w8t = [w8_t.clone().t() for _ in range(n8)]  # [K, N] column-major view, as _scaled_mm wants
        w8c = [w8_c.clone().t() for _ in range(n8)]
        sw_t = (amax_t / 448).float().reshape(())
        sw_c = (amax_c / 448).float().reshape(1, N)
        for M in ms:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            xa = x.float().abs()
            x8_t = (x.float() / (xa.amax() / 448)).to(f8)
            sx_t = (xa.amax() / 448).reshape(())
            sx_r = (xa.amax(dim=1, keepdim=True).clamp(min=1e-12) / 448)
            x8_r = (x.float() / sx_r).to(f8)
            cases = {
                "torch_bf16_matmul": (lambda i: torch.matmul(x, wb[i % len(wb)].t()), N * K * 2),
                "torch_scaled_mm_tensorwise": (lambda i: torch._scaled_mm(x8_t, w8t[i % n8], scale_a=sx_t, scale_b=sw_t, out_dtype=torch.bfloat16), N * K),
                "torch_scaled_mm_rowwise": (lambda i: torch._scaled_mm(x8_r, w8c[i % n8], scale_a=sx_r, scale_b=sw_c, out_dtype=torch.bfloat16), N * K),
            }
            if int4 is not None:
                cases["torch_int4pack_g128"] = (lambda i: torch._weight_int4pack_mm(x, int4[i % len(int4)][0], g, int4[i % len(int4)][1]), N * K / 2 + N * (K // g) * 4)
            for name, (fn, wbytes) in cases.items():
                try:
                    us, mode = time_us(fn, estimate_us(fn))
                    recs.append(dict(method=name, K=K, N=N, M=M, batch_invariant=False, us=round(us, 3), weight_bytes=wbytes, timing=mode))
                    print(f"{name:28s} K={K:5d} N={N:5d} M={M:5d} {us:9.2f} us  {2*M*N*K/us/1e6:7.1f} TFLOP/s", flush=True)
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{name} K={K} N={N} M={M}: {str(e).splitlines()[0][:200]}")
                    print("ERROR", errors[-1], flush=True)
        del wb, int4, w8t, w8c
        torch.cuda.empty_cache()
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, records=recs, errors=errors), open(args.out, "w"), indent=0)


if __name__ == "__main__":
    main()
