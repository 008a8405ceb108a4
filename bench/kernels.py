#!/usr/bin/env python3
"""Time every multi-LoRA implementation of ``tlora_sim.profiler.kernels`` on one GPU and write a CSV.

For each (layer K x N, adapter mix) it times a training step (forward + backward, W frozen,
dropout p on the adapter input only) of: base (frozen layer alone, forward + dX), alone (each
job alone), loop (mLoRA style), padded (pad to the largest rank, bmm), peft (if installed) and
fused (ours). Two times per row:

* ``ms``       GPU time: the step captured in a CUDA graph (each replay runs it on ``--sets``
               different fresh random input sets in turn, so nothing is served from L2 across
               steps), median over 3 rounds of ``--replays`` replays, divided by the number of
               sets. The rounds alternate with the eager repeats below (one per round), so that
               both times see the same GPU clocks.
* ``eager_ms`` the step as an eager training loop pays it: wall time of >= ``--eager-ms`` ms of
               steps with one synchronisation at the end, median of 3 repeats, on each implementation's default
               path (for ``fused``: ``MultiLoRALinear``'s plain launch path, the default;
               ``eager_plain_ms`` repeats it). ``eager_graph_ms``: the same loop through
               ``MultiLoRALinear(cuda_graph=True)`` (forward and backward replayed from CUDA
               graphs), ``fused`` only; ``eager_auto_ms``: through ``cuda_graph="auto"`` (graphs
               only for steps under ``graphed.AUTO_MAX_FLOPS``; from 2026-11-26 session 19 on). In
               the CSVs before kernel_bench_h100_2026-11-25-c, ``eager_ms`` of ``fused`` was the
               CUDA-graph path.

``floor_ms`` is the roofline floor: base GEMM FLOPs (4 M K N) at the measured bf16 matrix rate
(the faster of an 8192^3 product and the base layer's own GPU time) plus the fewest LoRA bytes
(one more read of X and of dY, adapters read and their gradients written once) at the measured
copy bandwidth. Columns: layer, ranks, tokens, impl, ms, eager_ms, floor_ms, device, torch,
triton, then extras (ratios to base, TFLOP/s, sizes, versions).

Usage (on the GPU machine, from the repository root):
    python3 bench/kernels.py --out profiler/data/kernel_bench_h100.csv
    python3 bench/kernels.py --quick --check          # a few mixes + a bf16 correctness check
    python3 bench/kernels.py --layers 4096x4096 --impls base,fused,loop
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

LAYERS = {"4096x4096": (4096, 4096), "4096x14336": (4096, 14336),
          "14336x4096": (14336, 4096), "8192x8192": (8192, 8192)}

# name: (ranks, tokens per adapter). The first six are docs/kernel.md's reference table.
MIXES = {
    "16x4": ([16] * 4, [2048] * 4), "8-64": ([8, 16, 32, 64], [2048] * 4),
    "8-128x8": ([8, 16, 32, 64, 128, 16, 8, 32], [1024] * 8),
    "64x8": ([64] * 8, [512] * 8), "8+128": ([8, 128], [4096, 512]),
    "16x16": ([16] * 16, [512] * 16), "2+4big": ([2, 4], [8192, 8192]),
    "small4": ([2, 4, 8, 16], [128] * 4),
    "mixed16": ([2, 4, 8, 16, 32, 64, 128, 2, 4, 8, 16, 32, 64, 128, 16, 16], [256] * 16),
    "odd4": ([32, 8, 128, 16], [1000, 3000, 77, 2048]),
    "128x2": ([128, 128], [2048, 2048]),
    "256x2": ([256, 256], [2048, 2048]),   # not in CASES: rank 256's pipeline stages (A/B)
    "tiny": ([2, 16, 64], [50, 0, 70]),   # for --device cpu dry runs
}
TABLE = ["16x4", "8-64", "8-128x8", "64x8", "8+128", "16x16"]
# (layer, mix) in priority order: the reference table first
CASES = ([("4096x4096", m) for m in TABLE] + [("4096x14336", m) for m in TABLE]
         + [("4096x4096", m) for m in ("2+4big", "small4", "mixed16", "odd4", "128x2")]
         + [("14336x4096", m) for m in TABLE + ["odd4"]]
         + [("8192x8192", m) for m in ("16x4", "8-64", "8-128x8", "8+128", "mixed16")]
         + [("4096x14336", m) for m in ("odd4", "2+4big")])
# calibration cases of --tune and --quick (reference mixes, low and high ranks, both layers)
TUNE_CASES = QUICK = [("4096x4096", "16x4"), ("4096x4096", "8-64"), ("4096x4096", "8-128x8"),
                      ("4096x14336", "8+128")]
ALL_IMPLS = ["base", "alone", "loop", "padded", "peft", "fused", "lorafusion", "grouped"]
COLUMNS = ["layer", "ranks", "tokens", "impl", "ms", "eager_ms", "floor_ms", "device", "torch",
           "triton", "ratio_to_base", "eager_ratio_to_base", "ratio_to_floor", "base_tflops",
           "mix", "n_adapters", "M", "K", "N", "dropout", "lora_flops_pct", "driver", "cuda",
           "date", "kernel_config", "eager_plain_ms", "eager_graph_ms", "eager_auto_ms"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="profiler/data/kernel_bench_gpu.csv",
                    help="CSV to write (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="only a few mixes")
    ap.add_argument("--layers", default=None, help="comma list of layers, e.g. 4096x4096")
    ap.add_argument("--mixes", default=None, help=f"comma list of mixes from {list(MIXES)}")
    ap.add_argument("--impls", default=",".join(ALL_IMPLS), help="comma list (default: all)")
    ap.add_argument("--lorafusion", default=None, metavar="PATH",
                    help="LoRAFusion's source for impl lorafusion (default: env TLORA_LORAFUSION, "
                         "else .ext/lorafusion; profiler/fetch_lorafusion.sh fills it)")
    ap.add_argument("--dropout", type=float, default=0.1, help="adapter-input dropout p")
    ap.add_argument("--sets", type=int, default=3, help="input sets rotated per replay")
    ap.add_argument("--replays", type=int, default=20, help="graph replays timed")
    ap.add_argument("--eager-ms", type=float, default=40.0,
                    help="target wall ms per eager repeat")
    ap.add_argument("--budget-s", type=float, default=520.0,
                    help="stop starting new cases after this many seconds")
    ap.add_argument("--check", action="store_true",
                    help="bf16 correctness of fused vs a float64 reference first")
    ap.add_argument("--configs", default=None,
                    help="JSON list of KernelConfig overrides: time fused once per config")
    ap.add_argument("--tune", default=None,
                    help="JSON list of KernelConfig overrides: each is timed (fused, GPU time) on"
                         " the calibration cases first; the best (geometric mean) runs the rest")
    ap.add_argument("--precompile", type=int, default=8,
                    help="worker processes compiling the fused kernels first (0: off)")
    ap.add_argument("--summary", default=None, help="also write a JSON summary here")
    ap.add_argument("--profile", action="store_true",
                    help="print a per-kernel GPU time breakdown of base and fused on each case")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: dry run of the harness through the Triton interpreter (no timing"
                         " value means anything; layers may be any KxN, e.g. 64x48)")
    return ap.parse_args(argv)


DEV = "cuda"


def layer_shape(name):
    """(K, N) of a layer: a name of ``LAYERS`` or ``KxN`` (e.g. ``4096x14336``, any case)."""
    if name in LAYERS:
        return LAYERS[name]
    k, n = name.lower().split("x")
    return int(k), int(n)


# ------------------------------------------------------------------------------- helpers
def _fmt(v):
    return ",".join(str(x) for x in v) if len(set(v)) > 1 else str(v[0])


def _versions():
    import torch
    import triton
    if DEV == "cpu":
        return {"device": "cpu", "torch": torch.__version__, "triton": triton.__version__,
                "driver": "", "cuda": ""}
    drv = ""
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "driver": drv, "cuda": torch.version.cuda or ""}


def measure_ceilings():
    """bf16 matrix rate (8192^3 product, random data) in FLOP/s and copy bandwidth in B/s."""
    import torch
    if DEV == "cpu":
        return 1e12, 1e11
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(); a @ b; e1.record(); e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    rate = 2 * 8192 ** 3 / statistics.median(ts)
    del a, b
    n = 1 << 29  # 1 GiB of bf16
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(); dst.copy_(src); e1.record(); e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    bw = 2 * 2 * n / statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return rate, bw


def warm_for_capture(step, sets):
    """Run ``step`` twice over every set on a side stream and synchronise (before a capture)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for a in sets:
                step(*a)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def _capture(step, sets):
    """One CUDA graph of ``step`` over every input set in turn (warmed up on a side stream)."""
    import torch
    warm_for_capture(step, sets)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a in sets:
            step(*a)
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_ms(g, replays):
    """Event times (ms) of ``replays`` replays of graph g."""
    import torch
    ev = [(torch.cuda.Event(True), torch.cuda.Event(True)) for _ in range(replays)]
    for e0, e1 in ev:
        e0.record(); g.replay(); e1.record()
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) for e0, e1 in ev]


def time_graph(step, sets, replays):
    if DEV == "cpu":
        t0 = time.perf_counter()
        for a in sets:
            step(*a)
        return (time.perf_counter() - t0) * 1e3 / len(sets)
    g = _capture(step, sets)
    ms = statistics.median(_replay_ms(g, replays)) / len(sets)
    del g
    return ms


def time_graph_and_eager(step, eager_steps, sets, replays, target_ms, rounds=3):
    """(GPU ms, [eager ms of each of ``eager_steps``]) measured interleaved, so that both see
    the same GPU clocks: ``rounds`` rounds of (``replays`` graph replays of ``step``, then one
    eager repeat of each eager step); GPU ms = median replay / sets, eager = median repeat
    (each repeat: wall time of >= ``target_ms`` ms of steps, one synchronisation)."""
    if DEV == "cpu":
        ms = time_graph(step, sets, replays)
        return ms, [time_eager(f, sets, target_ms, ms) for f in eager_steps]
    g = _capture(step, sets)
    for f in eager_steps:
        for a in sets:
            f(*a)
    _sync()
    reps, eager = [], [[] for _ in eager_steps]
    for _ in range(rounds):
        reps += _replay_ms(g, replays)
        est = statistics.median(reps) / len(sets)
        for j, f in enumerate(eager_steps):
            eager[j].append(_eager_repeat(f, sets, target_ms, est))
    del g
    return statistics.median(reps) / len(sets), [statistics.median(e) for e in eager]


def _sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def _eager_repeat(step, sets, target_ms, est_ms):
    """Wall ms per step of one eager repeat: >= target_ms of steps, one synchronisation."""
    iters = 1 if DEV == "cpu" else max(2, int(math.ceil(target_ms / max(est_ms * len(sets), 1e-3))))
    t0 = time.perf_counter()
    for _ in range(iters):
        for a in sets:
            step(*a)
    _sync()
    return (time.perf_counter() - t0) * 1e3 / (iters * len(sets))


def time_eager(step, sets, target_ms, est_ms):
    for a in sets:
        step(*a)
    _sync()
    return statistics.median(_eager_repeat(step, sets, target_ms, est_ms) for _ in range(3))


def make_weights(K, N, ranks, gen):
    import torch
    sum_r = sum(ranks)
    W = (torch.randn(N, K, device=DEV, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
    A = (torch.randn(sum_r, K, device=DEV, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
    B = (torch.randn(sum_r, N, device=DEV, generator=gen) / 4).to(torch.bfloat16)
    return W, A, B


def case_tensors(layer, mix, seed_key, n_sets):
    """The tensors of one (layer, mix) case, drawn from a generator seeded by ``seed_key``:
    (K, N, ranks, segs, W, A, B, [(x, dy)] * n_sets), x (M, K) and dy (M, N) in bf16."""
    import torch
    K, N = layer_shape(layer)
    ranks, segs = MIXES[mix]
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(seed_key.encode()))
    W, A, B = make_weights(K, N, ranks, gen)
    M = sum(segs)
    xy = [(torch.randn(M, K, device=DEV, generator=gen).to(torch.bfloat16),
           torch.randn(M, N, device=DEV, generator=gen).to(torch.bfloat16))
          for _ in range(n_sets)]
    return K, N, ranks, segs, W, A, B, xy


def scales_for(ranks):
    return [2.0 for _ in ranks]  # alpha = 2 r, a common LoRA choice


# ------------------------------------------------------------------------- correctness
def check_correctness(layers):
    """bf16 fused vs float64 reference, p = 0 and p = 0.1 (same mask), odd segment lengths; two
    steps per plan (the larger error of the two, NaN if either is not finite)."""
    import torch
    from tlora_sim.profiler.kernels import build_plan, multi_lora_linear, reference_forward_backward
    out = []
    gen = torch.Generator(device=DEV).manual_seed(1234)
    ranks = [1, 8, 16, 32, 64, 128, 256, 3]
    segs = [37, 0, 300, 129, 64, 255, 100, 1]
    for layer in layers:
        K, N = layer_shape(layer)
        W, A, B = make_weights(K, N, ranks, gen)
        M = sum(segs)
        for p in (0.0, 0.1):
            x = torch.randn(M, K, device=DEV, generator=gen).to(torch.bfloat16)
            dy = torch.randn(M, N, device=DEV, generator=gen).to(torch.bfloat16)
            plan = build_plan(segs, ranks, scales_for(ranks), p, K, N, DEV)
            ref = reference_forward_backward(x, W, A, B, segs, ranks, scales_for(ranks), dy,
                                             dropout=p, seed=77)
            errs = {}
            for _ in range(2):  # twice on one plan: the workspaces kept between steps
                xx, AA, BB = (t.clone().requires_grad_(True) for t in (x, A, B))
                y = multi_lora_linear(xx, W, AA, BB, plan, seed=77)
                gx, gA, gB = torch.autograd.grad(y, [xx, AA, BB], dy)
                for k, v in (("y", y), ("dx", gx), ("dA", gA), ("dB", gB)):
                    e = float((v.detach().double() - ref[k]).norm() / ref[k].norm())
                    prev = errs.get(k, 0.0)
                    ok = bool(torch.isfinite(v).all()) and e == e and prev == prev
                    errs[k] = max(prev, e) if ok else float("nan")
            ok = all(e < 2e-2 for e in errs.values())
            out.append({"layer": layer, "p": p, "ok": ok, **errs})
            print(f"check {layer} p={p}: " + " ".join(f"{k}={v:.2e}" for k, v in errs.items())
                  + ("  OK" if ok else "  FAIL"), flush=True)
    return out


# ------------------------------------------------------------------------- precompile
def _precompile_one(key):
    K, N, ranks, segs, p, cfgj = key
    cfgd = json.loads(cfgj)
    import torch
    from tlora_sim.profiler.kernels import KernelConfig
    from tlora_sim.profiler.kernels.baselines import FusedImpl
    cfg = KernelConfig.from_dict(cfgd)
    gen = torch.Generator(device=DEV).manual_seed(0)
    W, A, B = make_weights(K, N, list(ranks), gen)
    segs = [min(s, 64) for s in segs]
    M = sum(segs)
    impl = FusedImpl(W, A, B, segs, list(ranks), scales_for(ranks), p, kernel_config=cfg)
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    impl.step(*impl.inputs(x, dy))
    torch.cuda.synchronize()
    return True


def precompile(keys, workers):
    import multiprocessing as mp
    keys = list(dict.fromkeys(keys))
    if not keys or workers <= 0:
        return
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(min(workers, len(keys))) as pool:
            pool.map(_precompile_one, keys)
    except Exception as e:  # the main process compiles lazily anyway
        print(f"precompile failed: {e!r}", flush=True)
    print(f"precompiled {len(keys)} fused variants in {time.time() - t0:.1f} s", flush=True)


def profile_step(impl, sets, label):
    """Per-kernel GPU time (us per step) of ``impl`` with torch.profiler, eager steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for a in sets:
        impl.step(*a)
    torch.cuda.synchronize()
    n = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            for a in sets:
                impl.step(*a)
        torch.cuda.synchronize()
    tot = 0.0
    items = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        if t > 0 and e.count > 0:
            items.append((t / (n * len(sets)), e.count // (n * len(sets)), e.key))
    items.sort(reverse=True)
    for t, c, k in items[:12]:
        tot += t
        print(f"    prof {label:<8} {t:9.1f} us x{c:<3} {k[:90]}", flush=True)


def _kcfg(c):
    from tlora_sim.profiler.kernels import KernelConfig
    return KernelConfig.from_dict(c)


def tune(cands, args):
    """GPU time of fused under each candidate config on TUNE_CASES; returns (best, table)."""
    import torch
    from tlora_sim.profiler.kernels.baselines import make_impl
    times = {i: [] for i in range(len(cands))}
    for layer, mix in TUNE_CASES:
        _, _, ranks, segs, W, A, B, xy = case_tensors(layer, mix, f"tune|{layer}|{mix}", args.sets)
        for i, c in enumerate(cands):
            try:
                impl = make_impl("fused", W, A, B, segs, ranks, scales_for(ranks), args.dropout,
                                 kernel_config=_kcfg(c))
                ms = time_graph(impl.step, [impl.inputs(x, dy) for x, dy in xy], args.replays)
            except Exception as e:
                print(f"  tune {i} {layer} {mix}: FAILED {e!r}", flush=True)
                ms = float("inf")
            times[i].append(ms)
            impl = None
            torch.cuda.empty_cache()
        print(f"tune {layer} {mix}: " + " ".join(f"#{i}={t[-1]:.3f}" for i, t in times.items()),
              flush=True)
    geo = {i: math.exp(statistics.fmean(math.log(v) for v in t)) for i, t in times.items()}
    best = min(geo, key=geo.get)
    print("tune geomean ms: " + " ".join(f"#{i}={g:.4f}" for i, g in geo.items())
          + f" -> #{best} {json.dumps(cands[best])}", flush=True)
    return cands[best], {"candidates": cands, "ms": times, "geomean": geo, "best": best}


# ------------------------------------------------------------------------------ cases
def run_case(layer, mix, impls, args, ceil, vers, cfgs):
    import torch
    from tlora_sim.profiler.kernels.baselines import make_impl
    K, N, ranks, segs, W, A, B, sets_xy = case_tensors(layer, mix, f"{layer}|{mix}", args.sets)
    M = sum(segs)
    sc = scales_for(ranks)
    rate, bw = ceil
    sum_r = sum(ranks)
    gemm_ms = 4.0 * M * K * N / rate * 1e3
    bytes_ms = (2 * (M * K + M * N) + 2 * 2 * sum_r * (K + N)) / bw * 1e3
    lora_flops = sum(6.0 * L * r * (K + N) for L, r in zip(segs, ranks))
    rows, base_ms, base_eager = [], None, None
    todo = [(name, None) for name in impls if name != "fused"]
    if "fused" in impls:
        todo += [("fused", c) for c in (cfgs or [None])]
    for name, cfg in todo:
        label = name if cfg is None or len(cfgs or []) <= 1 else f"fused#{cfgs.index(cfg)}"
        kw = {}
        if name == "fused" and cfg is not None:
            kw["kernel_config"] = _kcfg(cfg)
        try:
            impl = make_impl(name, W, A, B, segs, ranks, sc, args.dropout, **kw)
            sets = [impl.inputs(x, dy) for x, dy in sets_xy]
            if args.profile and name in ("base", "fused") and DEV == "cuda":
                profile_step(impl, sets, label)
            eager_fns = [impl.step] + ([impl.eager_step, impl.auto_step] if hasattr(impl, "eager_step") else [])
            ms, ems_all = time_graph_and_eager(impl.step, eager_fns, sets, args.replays,
                                               args.eager_ms)
            ems = ems_all[0]
            graph_ems = ems_all[1] if len(ems_all) > 1 else ""
            auto_ems = ems_all[2] if len(ems_all) > 2 else ""
        except Exception as e:  # record and go on: one failing baseline must not stop the run
            print(f"  {layer} {mix} {label}: FAILED {e!r}", flush=True)
            continue
        finally:
            impl = sets = None
            gc.collect()  # graphed callables hold reference cycles (and their graphs' memory)
            if DEV == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        if name == "base":
            base_ms, base_eager = ms, ems
        rows.append({
            "layer": layer, "ranks": _fmt(ranks), "tokens": _fmt(segs), "impl": label,
            "ms": round(ms, 5), "eager_ms": round(ems, 5), "eager_plain_ms": round(ems, 5),
            "eager_graph_ms": round(graph_ems, 5) if graph_ems != "" else "",
            "eager_auto_ms": round(auto_ems, 5) if auto_ems != "" else "",
            "device": vers["device"], "torch": vers["torch"], "triton": vers["triton"],
            "mix": mix, "n_adapters": len(ranks), "M": M, "K": K, "N": N,
            "dropout": args.dropout, "lora_flops_pct": round(100 * lora_flops / (4 * M * K * N), 3),
            "driver": vers["driver"], "cuda": vers["cuda"],
            "date": datetime.date.today().isoformat(),
            "kernel_config": json.dumps(cfg) if (name == "fused" and cfg) else "",
        })
    floor_ms = min(gemm_ms, base_ms or gemm_ms) + bytes_ms
    for r in rows:
        r["floor_ms"] = round(floor_ms, 5)
        r["ratio_to_base"] = round(r["ms"] / base_ms, 4) if base_ms else ""
        r["eager_ratio_to_base"] = round(r["eager_ms"] / base_eager, 4) if base_eager else ""
        r["ratio_to_floor"] = round(r["ms"] / floor_ms, 4)
        r["base_tflops"] = round(4.0 * M * K * N / (r["ms"] * 1e-3) / 1e12, 1)
    return rows


def write_csv(rows, path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)


def main(argv=None):
    global DEV
    args = parse_args(argv)
    DEV = args.device
    if DEV == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        args.precompile = 0
    import torch
    if DEV == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/kernels.py needs a CUDA GPU (or --device cpu for a dry run)")
    t_start = time.time()
    vers = _versions()
    from tlora_sim.profiler.kernels.baselines import peft_available
    impls = [s for s in args.impls.split(",") if s]
    if "peft" in impls and not peft_available():
        print("peft: not installed here; skipping it", flush=True)
        impls.remove("peft")
    if args.lorafusion:
        os.environ["TLORA_LORAFUSION"] = os.path.abspath(args.lorafusion)
    from tlora_sim.profiler.kernels.lorafusion_ext import lorafusion_available
    lf_absent = "lorafusion" in impls and not lorafusion_available()
    if lf_absent:
        impls.remove("lorafusion")
    cases = QUICK if args.quick else CASES
    if args.layers:
        keep = set(args.layers.split(","))
        cases = [c for c in cases if c[0] in keep]
        if args.mixes:  # explicit layers x mixes
            cases = [(lay, m) for lay in args.layers.split(",") for m in args.mixes.split(",")]
    elif args.mixes:
        keep = set(args.mixes.split(","))
        cases = [c for c in cases if c[1] in keep]
    cfgs = json.loads(args.configs) if args.configs else None
    print(json.dumps(vers), f"peft={'peft' in impls}", flush=True)
    ceil = measure_ceilings()
    print(f"ceilings: bf16 mm {ceil[0] / 1e12:.0f} TFLOP/s, copy {ceil[1] / 1e12:.2f} TB/s",
          flush=True)
    summary = {"versions": vers, "matrix_tflops": ceil[0] / 1e12, "copy_tbps": ceil[1] / 1e12}
    if args.check:
        summary["check"] = check_correctness(sorted({c[0] for c in cases}))
    def _precompile(case_list, cfg_list):
        from tlora_sim.profiler.kernels.config import bucket_of as _bucket
        keys = {}
        for layer, mix in case_list:
            K, N = layer_shape(layer)
            ranks, segs = MIXES[mix]
            bk = frozenset(_bucket(r) for r, L in zip(ranks, segs) if L)
            for c in cfg_list:
                cj = json.dumps(c, sort_keys=True)
                keys.setdefault((K, N, bk, cj), (K, N, tuple(ranks), tuple(segs), args.dropout,
                                                 cj))
        precompile(list(keys.values()), args.precompile)

    if "fused" in impls and args.tune and DEV == "cuda":
        cands = json.loads(args.tune)
        if args.precompile:
            _precompile(TUNE_CASES, cands)
        best, summary["tune"] = tune(cands, args)
        cfgs = [best]
    if "fused" in impls and args.precompile:
        _precompile(cases, cfgs or [{}])
    rows = []
    for layer, mix in cases:
        if time.time() - t_start > args.budget_s:
            print(f"time budget reached: skipping {layer} {mix} and the rest", flush=True)
            break
        t0 = time.time()
        rows += run_case(layer, mix, impls, args, ceil, vers, cfgs)
        write_csv(rows, args.out)
        last = {r["impl"]: r for r in rows if r["layer"] == layer and r["mix"] == mix}
        print(f"{layer} {mix}: " + " ".join(f"{k}={v['ms']:.3f}/{v['eager_ms']:.3f}"
                                           for k, v in last.items())
              + f"  ({time.time() - t0:.1f} s)", flush=True)
    if lf_absent:
        print(f"lorafusion: source absent (see --lorafusion); skipped on {len(cases)} cases", flush=True)
    from bench.kernel_summary import summarize
    text, res = summarize(rows)
    summary.update(res)
    summary["elapsed_s"] = time.time() - t_start
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"wrote {len(rows)} rows to {args.out} in {time.time() - t_start:.0f} s")
    print(text)


if __name__ == "__main__":
    main()
