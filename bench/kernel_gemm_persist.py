#!/usr/bin/env python3
"""The persistent TMA GEMM (``profiler/kernels/lora_gemm_persist.py``) against cuBLAS and the per-tile
GEMM (``lora_gemm_kernel``), alone (issue 19; profiler/KERNELS.md, session 16).

Two tables, GPU time of CUDA-graph replays (``triton.testing.do_bench_cudagraph``, median, us):

1. ``plain``: the frozen layer's GEMM without LoRA, both passes (forward x (M,K) @ W^T, backward
   dY (M,N) @ W), for each layer of ``--layers`` and M of ``--tokens``: cuBLAS (``torch.mm``),
   the per-tile GEMM with ``base_gemm.json``'s tiles, and each persistent configuration of
   ``--configs``; relative error against cuBLAS checked (< 2e-2, bf16) before timing.
2. ``lora``: the GEMM with the LoRA term of a benchmark mix (``bench/kernels.py``'s MIXES; P/Q
   random, dropout ``--dropout``), per-tile against each persistent configuration, checked
   against the per-tile kernel's output.

Usage (GPU machine, repository root, package on PYTHONPATH as bench/kernels_gpu.sh sets it):
    python3 bench/kernel_gemm_persist.py --out $OUT/persist.csv
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

LAYERS = {"4096x4096": (4096, 4096), "4096x14336": (4096, 14336), "14336x4096": (14336, 4096)}
TILE = {"fwd": {"bm": 256, "bn": 128, "bk": 64, "stages": 3, "warps": 8},
        "bwd": {"bm": 128, "bn": 256, "bk": 64, "stages": 3, "warps": 8}}
CONFIGS = {
    "p3s2f": {"bm": 128, "bn": 256, "bk": 64, "stages": 3, "split": 2, "flatten": True},
    "p4s2f": {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "split": 2, "flatten": True},
    "p3s4": {"bm": 128, "bn": 256, "bk": 64, "stages": 3, "split": 4, "flatten": False},
    "p4s4": {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "split": 4, "flatten": False},
    "p4s4f": {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "split": 4, "flatten": True},
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="persist.csv", help="CSV of every timing")
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--configs", default=None, help="JSON {name: GemmConfig fields} (persistent)")
    ap.add_argument("--mixes", default="4096x4096:128x2,4096x4096:16x4,4096x14336:64x8")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--parts", default="plain,lora")
    return ap.parse_args(argv)


def _bench(fn) -> float:
    import triton
    fn()
    return 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def plain_rows(K, N, M, configs):
    """Timings (us) of the plain GEMM, both passes: cuBLAS, the per-tile kernel, each config."""
    import torch
    from tlora_sim.profiler.kernels.config import GemmConfig
    from tlora_sim.profiler.kernels.lora_gemm import base_gemm
    g = torch.Generator(device="cuda").manual_seed(K + N + M)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    W = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    rows = []
    for pas, a in (("fwd", x), ("bwd", dy)):
        bwd = pas == "bwd"
        ref = torch.mm(x, W.t()) if not bwd else torch.mm(dy, W)
        cub = _bench(lambda: torch.mm(x, W.t())) if not bwd else _bench(lambda: torch.mm(dy, W))
        rows.append(dict(part="plain", pass_=pas, K=K, N=N, M=M, impl="cublas", us=cub, err=0.0))
        for name, c in [("tile", TILE[pas])] + list(configs.items()):
            gc = GemmConfig(**c) if name == "tile" else GemmConfig(persistent=True, **c)
            try:
                err = _rel(base_gemm(a, W, gc, bwd), ref)
                if not err < 2e-2:
                    raise RuntimeError(f"relative error {err:.3g}")
                t = _bench(lambda: base_gemm(a, W, gc, bwd))
            except Exception as e:  # noqa: BLE001 - record, go on
                print(f"  {pas} {K}x{N} M={M} {name}: FAILED {e!r}"[:300], flush=True)
                t, err = float("nan"), float("nan")
            rows.append(dict(part="plain", pass_=pas, K=K, N=N, M=M, impl=name, us=t, err=err))
        print(f"{pas} {K}x{N} M={M}: " + "  ".join(
            f"{r['impl']} {r['us']:.1f} ({r['us'] / cub:.3f})" for r in rows[-1 - len(configs) - 1:]),
            flush=True)
    return rows


def lora_rows(layer, mix, p, configs):
    """Timings (us) of the GEMM with the LoRA term of ``mix``: per-tile kernel and each config."""
    import torch
    from bench.kernels import MIXES
    from tlora_sim.profiler.kernels import KernelConfig, build_plan
    from tlora_sim.profiler.kernels.config import GemmConfig, mix_seed
    from tlora_sim.profiler.kernels.lora_gemm import gemm_lora_backward, gemm_lora_forward
    K, N = LAYERS[layer]
    ranks, segs = MIXES[mix]
    M = sum(segs)
    plan = build_plan(segs, ranks, [2.0] * len(ranks), p, K, N, "cuda", KernelConfig())
    g = torch.Generator(device="cuda").manual_seed(M + K + N)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    W = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    R = sum(ranks)
    A = (torch.randn(R, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    B = (torch.randn(R, N, device="cuda", generator=g) / 4).to(torch.bfloat16)
    lo = (torch.randn(max(plan.p_size, 1), device="cuda", generator=g) / 4).to(torch.bfloat16)
    seed = mix_seed(5)
    rows = []
    for pas in ("fwd", "bwd"):
        out = torch.empty(M, N if pas == "fwd" else K, device="cuda", dtype=torch.bfloat16)

        def run(gc):
            if pas == "fwd":
                gemm_lora_forward(x, W, lo, B, None, plan, gc, out, "tf32")
            else:
                gemm_lora_backward(dy, W, lo, A, plan, gc, seed, p > 0, out, "tf32")
            return out
        ref = run(GemmConfig(**TILE[pas])).clone()
        res = []
        for name, c in [("tile", TILE[pas])] + list(configs.items()):
            gc = GemmConfig(**c) if name == "tile" else GemmConfig(persistent=True, **c)
            try:
                err = _rel(run(gc), ref)
                if not err < 1e-2:
                    raise RuntimeError(f"relative error {err:.3g} against the per-tile kernel")
                t = _bench(lambda: run(gc))
            except Exception as e:  # noqa: BLE001
                print(f"  lora {pas} {layer} {mix} {name}: FAILED {e!r}"[:300], flush=True)
                t, err = float("nan"), float("nan")
            res.append(dict(part="lora", pass_=pas, K=K, N=N, M=M, impl=f"{name}|{mix}", us=t,
                            err=err))
        rows += res
        print(f"lora {pas} {layer} {mix} (M={M}): " + "  ".join(
            f"{r['impl'].split('|')[0]} {r['us']:.1f}" for r in res), flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    import torch
    configs = json.loads(args.configs) if args.configs else CONFIGS
    print(torch.cuda.get_device_name(0), flush=True)
    rows = []
    parts = args.parts.split(",")
    try:
        if "plain" in parts:
            for layer in args.layers.split(","):
                for M in (int(v) for v in args.tokens.split(",")):
                    rows += plain_rows(*LAYERS[layer], M, configs)
        if "lora" in parts:
            for case in args.mixes.split(","):
                layer, mix = case.split(":")
                rows += lora_rows(layer, mix, args.dropout, configs)
    finally:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["part", "pass_", "K", "N", "M", "impl", "us", "err"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
