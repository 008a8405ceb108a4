#!/usr/bin/env python3
"""Per-launch GPU time of the fused multi-LoRA training step (issue 19), next to the frozen base
layer's, from the torch profiler's kernel trace (CUPTI).

For each case (``layer:mix`` of ``bench/kernels.py``) and each ``KernelConfig`` override of
``--configs``: the step's GPU time (CUDA-graph replays, as ``bench/kernels.py`` times it), then one
profiled eager step per input set, repeated ``--steps`` times; each launch of one step is listed in
order with its median duration (us), grid, block, registers per thread and shared memory, and
its time as a multiple of the time one pass over X (M x K bf16) takes at the measured copy
bandwidth (``x_pass``), the unit in which issue 19 counts the step's extra memory passes.

Output: a table per case on stdout and ``--out`` (JSON: every launch of every case).

Usage (GPU machine, repository root, package on PYTHONPATH as bench/kernels_gpu.sh sets it):
    python3 bench/kernel_profile.py --cases 4096x4096:128x2,4096x14336:16x4 \\
        --configs '[{}, {"base_gemm": "triton"}]' --out $OUT/profile.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import kernels as KB  # noqa: E402  (the benchmark's cases, inputs and timers)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--cases", required=True, help="comma list of layer:mix")
    ap.add_argument("--configs", default="[{}]", help="JSON list of KernelConfig overrides")
    ap.add_argument("--impls", default="base,fused", help="base and/or fused")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per input set")
    ap.add_argument("--sets", type=int, default=2, help="input sets (as bench/kernels.py)")
    ap.add_argument("--replays", type=int, default=20, help="graph replays for the step time")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--out", default=None, help="JSON with every launch")
    ap.add_argument("--precompile", type=int, default=8,
                    help="worker processes compiling the fused kernels first (0: off)")
    return ap.parse_args(argv)


def kernel_trace(step, sets, n_steps):
    """[(name, dur_us, grid, block, regs, smem)] per launch of one step: the median over
    ``n_steps`` x len(sets) profiled eager steps, launches matched by their order in the step.
    Raises RuntimeError if the steps launch different numbers of kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for a in sets:
        step(*a)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n_steps):
            for a in sets:
                step(*a)
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    os.unlink(path)
    ks = sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    n = n_steps * len(sets)
    if not ks or len(ks) % n:
        raise RuntimeError(f"{len(ks)} kernels over {n} steps")
    per = len(ks) // n
    out = []
    for j in range(per):
        evs = [ks[i * per + j] for i in range(n)]
        a = evs[0].get("args", {})
        out.append((evs[0]["name"], statistics.median(e["dur"] for e in evs), a.get("grid"),
                    a.get("block"), a.get("registers per thread"), a.get("shared memory")))
    return out


def _short(name: str) -> str:
    return name if len(name) < 48 else name[:45] + "..."


def main(argv=None):
    args = parse_args(argv)
    import gc

    import torch
    from tlora_sim.profiler.kernels.baselines import make_impl
    KB.DEV = "cuda"
    cfgs = json.loads(args.configs)
    rate, bw = KB.measure_ceilings()
    print(f"ceilings: bf16 mm {rate / 1e12:.0f} TFLOP/s, copy {bw / 1e12:.2f} TB/s", flush=True)
    if args.precompile and "fused" in args.impls:
        keys = []
        for case in args.cases.split(","):
            layer, mix = case.split(":")
            K, N = KB._layer(layer)
            ranks, segs = KB.MIXES[mix]
            keys += [(K, N, tuple(ranks), tuple(segs), args.dropout, json.dumps(c, sort_keys=True))
                     for c in cfgs]
        KB.precompile(keys, args.precompile)
    res = {"device": torch.cuda.get_device_name(0), "matrix_tflops": rate / 1e12,
           "copy_tbps": bw / 1e12, "cases": []}
    for case in args.cases.split(","):
        layer, mix = case.split(":")
        K, N, ranks, segs, W, A, B, xy = KB.case_tensors(layer, mix, f"{layer}|{mix}", args.sets)
        M = sum(segs)
        x_pass_us = M * K * 2 / bw * 1e6  # one read of X (bw counts bytes read + written)
        todo = [("base", None)] if "base" in args.impls else []
        if "fused" in args.impls:
            todo += [("fused", c) for c in cfgs]
        base_ms = None
        for name, c in todo:
            kw = {"kernel_config": KB._kcfg(c)} if c is not None else {}
            label = name if c is None else f"fused{json.dumps(c, sort_keys=True)}"
            try:
                impl = make_impl(name, W, A, B, segs, ranks, KB.scales_for(ranks), args.dropout,
                                 **kw)
                sets = [impl.inputs(x, dy) for x, dy in xy]
                ms = KB.time_graph(impl.step, sets, args.replays)
                tr = kernel_trace(impl.step, sets, args.steps)
            except Exception as e:  # noqa: BLE001 - record and go on
                print(f"{layer} {mix} {label}: FAILED {e!r}"[:400], flush=True)
                continue
            finally:
                impl = sets = None
                gc.collect()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            if name == "base":
                base_ms = ms
            tot = sum(t[1] for t in tr)
            print(f"\n{layer} {mix} (M={M}) {label}: graph {ms * 1e3:.1f} us"
                  + (f" = {ms / base_ms:.3f}x base" if base_ms else "")
                  + f"; launches {len(tr)}, sum {tot:.1f} us; X pass {x_pass_us:.1f} us", flush=True)
            for nm, dur, grid, block, regs, smem in tr:
                print(f"  {_short(nm):<48} {dur:8.1f} us {dur / x_pass_us:6.2f} Xp  grid {grid} "
                      f"block {block} regs {regs} smem {smem}", flush=True)
            res["cases"].append({"layer": layer, "mix": mix, "M": M, "K": K, "N": N,
                                 "impl": label, "graph_ms": ms, "x_pass_us": x_pass_us,
                                 "launches": tr})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print("\nstep GPU time / base (graph replays), per case and configuration:")
    labels = list(dict.fromkeys(c["impl"] for c in res["cases"] if c["impl"] != "base"))
    for i, lab in enumerate(labels):
        print(f"  #{i} = {lab}")
    for case in dict.fromkeys((c["layer"], c["mix"]) for c in res["cases"]):
        got = {c["impl"]: c["graph_ms"] for c in res["cases"] if (c["layer"], c["mix"]) == case}
        b = got.get("base")
        print(f"  {case[0]:<11} {case[1]:<8} base {b if b else float('nan'):.3f} ms  " + "  ".join(
            f"#{i} {got[lab] / b:.3f}" if b and lab in got else f"#{i} -" for i, lab in enumerate(labels)))


if __name__ == "__main__":
    main()
