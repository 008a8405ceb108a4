#!/usr/bin/env python3
"""bf16 check of the persistent GEMM's tail split on a GPU (profiler/KERNELS.md, "Session 16,
second helper").

``bench/kernels.py --check`` runs 886 tokens, too few for the persistent GEMM to have a full
round of tiles, so it never reaches ``gemm_persist_kernel``'s TAIL_SPLIT path. This runs, per
case, ``--steps`` steps of one plan (the workspace and counters reused, as in training) with the
table's persistent configuration forced on both passes, with the tail split (default) and
without it (``tail_split: false``), and prints each output's relative error against the float64
reference (``reference_forward_backward``), and how many GEMMs of the plan split a tail
(``ws``). Cases: 4096x4096 8+128 (576 tiles on 132 SMs: 48 split in both passes), 4096x14336
16x4 (forward: 20), 4096x4096 ranks 2, 64, 128 over 1000, 2000, 1512 tokens (clipped tiles).

Usage (GPU machine, repository root, package on PYTHONPATH as bench/kernels_gpu.sh sets it):
    python3 bench/kernel_tailcheck.py [--cases 0,2] [--steps 3]
The H100 runs (2026-11-26): profiler/data/kernel_profile_h100_2026-11-26_9_{3,4,5}_*check*.txt.
"""
from __future__ import annotations

import argparse

P = dict(bm=128, bn=256, bk=64, stages=3, warps=8, persistent=True, split=2, lora_first=True)
CASES = [("4096x4096", 4096, 4096, [8, 128], [4096, 512]),
         ("4096x14336", 4096, 14336, [16] * 4, [2048] * 4),
         ("4096x4096", 4096, 4096, [2, 64, 128], [1000, 2000, 1512])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="0,1,2", help="indices into CASES")
    ap.add_argument("--steps", type=int, default=3, help="steps per plan (dropout seeds 3, 4, ..)")
    ap.add_argument("--dropout", type=float, default=0.1)
    args = ap.parse_args(argv)
    import torch
    from tlora_sim.profiler.kernels import (KernelConfig, build_plan, multi_lora_linear,
                                            reference_forward_backward)
    from tlora_sim.profiler.kernels.config import GemmConfig
    dev = "cuda"
    worst = 0.0
    for ci in (int(c) for c in args.cases.split(",")):
        name, K, N, ranks, segs = CASES[ci]
        g = torch.Generator().manual_seed(1)
        M, R = sum(segs), sum(ranks)
        x = torch.randn(M, K, generator=g).to(dev, torch.bfloat16)
        W = (torch.randn(N, K, generator=g) / K ** 0.5).to(dev, torch.bfloat16)
        A = (torch.randn(R, K, generator=g) / K ** 0.5).to(dev, torch.bfloat16)
        B = torch.randn(R, N, generator=g).to(dev, torch.bfloat16)
        dy = torch.randn(M, N, generator=g).to(dev, torch.bfloat16)
        scales = [2.0] * len(ranks)
        seeds = range(3, 3 + args.steps)
        ref = {s: reference_forward_backward(x.double(), W.double(), A.double(), B.double(), segs,
                                             ranks, scales, dy.double(), dropout=args.dropout,
                                             seed=s) for s in seeds}
        for label, on in (("split", True), ("nosplit", False)):
            gc = GemmConfig(**P, tail_split=on)
            plan = build_plan(segs, ranks, scales, args.dropout, K, N, dev,
                              KernelConfig(base_gemm="triton", gemm_fwd=gc, gemm_bwd=gc))
            for s in seeds:
                xx, AA, BB = (t.clone().requires_grad_(True) for t in (x, A, B))
                y = multi_lora_linear(xx, W, AA, BB, plan, seed=s)
                got = (y.detach(), *torch.autograd.grad(y, [xx, AA, BB], dy))
                errs = [float((a.double() - ref[s][k]).norm() / ref[s][k].norm())
                        for a, k in zip(got, ("y", "dx", "dA", "dB"))]
                worst = max(worst, *errs)
                nws = sum(1 for k in plan.extra if isinstance(k, tuple) and k[0] == "gemm_ws")
                print(f"{name} {ranks} {label} seed {s} ws {nws} " + " ".join(
                    f"{k} {e:.2e}" for k, e in zip(("y", "dx", "dA", "dB"), errs)), flush=True)
    print(f"worst relative error {worst:.2e}: {'OK' if worst < 5e-3 else 'FAIL'}")
    return 0 if worst < 5e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
