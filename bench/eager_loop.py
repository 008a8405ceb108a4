#!/usr/bin/env python3
"""Inside an eager training loop of ``MultiLoRALinear`` (its default, plain launch path): how long
the host spends per step, against the step's GPU time (issue 19, "eager within 15% of GPU time";
profiler/KERNELS.md, "Session 18 (lead)").

``bench/kernel_host.py`` times one step's host work with the GPU idle before it; a loop differs
(launches queue behind running kernels, Python's garbage collector runs between steps). Per case
(``bench/kernels.py``'s layer and mix names) this prints, for the frozen base layer (``base``) and
the fused layer's plain path (``plain``), over ``--steps`` steps of one loop with one final
synchronisation:

* ``gpu_ms``    the step captured in a CUDA graph (``bench/kernels.py``'s ``ms``);
* ``wall_ms``   wall time per step of the loop (``bench/kernels.py``'s ``eager_ms``);
* ``host_ms``   median host time per step inside the loop (perf_counter between step returns);
  ``host_p90_ms`` its 90th percentile;
* ``stream_ms`` median GPU time per step inside the loop (CUDA events between steps);
* each of these with Python's garbage collector on and off (column ``gc``; off: ``gc.disable()``
  around the loop), ``--rounds`` loops each (column ``round``).

Usage (GPU machine, repository root, package importable as in bench/kernels_gpu.sh):
    python3 bench/eager_loop.py --cases 4096x4096:64x8,4096x4096:mixed16 --out $OUT
Writes ``OUT/eager_loop.json`` and prints one line per (case, path, gc).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="4096x4096:128x2,4096x4096:64x8,4096x4096:mixed16",
                    help="comma list of LAYER:MIX (bench/kernels.py's names; default: %(default)s)")
    ap.add_argument("--steps", type=int, default=200, help="steps per loop")
    ap.add_argument("--rounds", type=int, default=3, help="loops per (case, path, gc)")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--out", required=True, help="folder for eager_loop.json")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    import torch

    import bench.kernels as KB
    from bench.kernel_host import eager_loop
    from tlora_sim.profiler.kernels.baselines import make_impl
    args = parse_args(argv)
    KB.DEV = "cuda"
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for spec in args.cases.split(","):
        layer, mix = spec.split(":")
        K, N, ranks, segs, W, A, B, xy = KB.case_tensors(layer, mix, f"{layer}|{mix}", 3)
        sc = KB.scales_for(ranks)
        for path in ("base", "plain"):
            impl = make_impl("fused" if path == "plain" else "base", W, A, B, segs, ranks, sc,
                             args.dropout)
            sets = [impl.inputs(x, dy) for x, dy in xy]
            gpu = KB.time_graph(impl.step, sets, 20)
            for gc_on in (True, False):
                for r in range(args.rounds):
                    got = eager_loop(impl.step, sets, args.steps, gc_on)
                    row = {"layer": layer, "mix": mix, "path": path, "gc": gc_on, "round": r,
                           "gpu_ms": gpu, **got, "device": torch.cuda.get_device_name(),
                           "torch": torch.__version__}
                    rows.append(row)
                    print(f"{layer} {mix} {path:<5} gc={'on ' if gc_on else 'off'} r{r}: gpu {gpu:.3f} "
                          f"wall {got['wall_ms']:.3f} host {got['host_ms']:.3f} (p90 "
                          f"{got['host_p90_ms']:.3f}) stream {got['stream_ms']:.3f}", flush=True)
            impl = sets = None
            gc.collect()
            torch.cuda.synchronize()
    with open(os.path.join(args.out, "eager_loop.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
