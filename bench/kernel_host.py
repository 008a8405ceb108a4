#!/usr/bin/env python3
"""Where the host time of one eager training step of ``MultiLoRALinear`` goes (issue 19, "no host
overhead"; profiler/KERNELS.md, "Host overhead").

For each (layer, mix) case it times, on one GPU, a step (forward + ``torch.autograd.grad``, W
frozen, dropout 0.1) of the frozen base layer (``base``), the fused layer on its plain launch path
(``plain``) and on its CUDA-graph path (``graph``):

* ``gpu_ms``   the step captured in one CUDA graph (``bench/kernels.py``'s ``ms``);
* ``host_ms``  host time of one step: wall time from the call to its return with the GPU idle
               before it (synchronised before each step), median over ``--steps`` steps;
* ``wall_ms``  an eager loop of ``--steps`` steps with one synchronisation at the end, per step
               (``bench/kernels.py``'s ``eager_ms`` / ``eager_plain_ms``);
* ``stream_ms`` GPU time of one step inside that eager loop: CUDA events recorded between steps,
               median (equal to ``gpu_ms`` unless launches leave the GPU idle).

Then, for the plain path of each case, ``cProfile`` of ``--steps`` steps (top functions by own and
by cumulative time) and the torch profiler's CPU-side operator table; and the host cost of single
launches: Triton's normal launch of ``_f1`` through ``config.launch``, the bare ``kernel[grid](...)``,
the direct launch of ``fastlaunch.BoundLaunch``, a one-argument Triton kernel, ``torch.empty`` and
a small ``addmm_``. ``--dump-triton`` writes the source of the installed Triton's launch path.

Usage (GPU machine, repository root, package on PYTHONPATH as in bench/kernels_gpu.sh):
    python3 bench/kernel_host.py --out $OUT --steps 100
    python3 bench/kernel_host.py --cases 4096x4096:16x4,4096x4096:small4 --out $OUT --dump-triton
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEFAULT_CASES = "4096x4096:16x4,4096x4096:small4,4096x4096:8-128x8,4096x14336:8-64"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma list of LAYER:MIX "
                    "(bench/kernels.py's names; default: %(default)s)")
    ap.add_argument("--steps", type=int, default=100, help="steps per measurement")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--paths", default="base,plain,graph", help="which of base, plain, graph")
    ap.add_argument("--no-profile", action="store_true", help="skip cProfile / torch.profiler")
    ap.add_argument("--launches", type=int, default=500,
                    help="launches per single-launch timing (0: skip those timings)")
    ap.add_argument("--only-launches", action="store_true",
                    help="only the single-launch timings (on each case's plan)")
    ap.add_argument("--gap", action="store_true",
                    help="also: one graph per step replayed from a Python loop (wall, stream) and "
                         "the one-graph GPU time over 100 replays, for base and plain")
    ap.add_argument("--dump-triton", action="store_true",
                    help="write the installed Triton's launch-path source to OUT/triton_src.txt")
    ap.add_argument("--out", required=True, help="folder for kernel_host.json / kernel_host.txt")
    return ap.parse_args(argv)


def _sync():
    import torch
    torch.cuda.synchronize()


def host_times(step, sets, n):
    """Per-step host time (ms) with the GPU idle before each step: median and mean."""
    for a in sets:
        step(*a)
    _sync()
    ts = []
    for i in range(n):
        a = sets[i % len(sets)]
        _sync()
        t0 = time.perf_counter()
        step(*a)
        ts.append((time.perf_counter() - t0) * 1e3)
    _sync()
    return statistics.median(ts), statistics.fmean(ts)


def eager_loop(step, sets, n, gc_on: bool = True) -> dict:
    """One eager loop of ``n`` steps with one final synchronisation (``gc_on`` False: Python's
    garbage collector disabled around it): ``wall_ms`` per step, median and 90th-percentile host
    time per step inside the loop (``host_ms``, ``host_p90_ms``: perf_counter between step
    returns) and median GPU time per step (``stream_ms``: CUDA events between steps)."""
    import gc

    import torch
    for a in sets:
        step(*a)
    _sync()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ts = [0.0] * (n + 1)
    if not gc_on:
        gc.disable()
    try:
        t0 = ts[0] = time.perf_counter()
        ev[0].record()
        for i in range(n):
            step(*sets[i % len(sets)])
            ev[i + 1].record()
            ts[i + 1] = time.perf_counter()
        _sync()
        wall = (time.perf_counter() - t0) * 1e3 / n
    finally:
        gc.enable()
    host = sorted((ts[i + 1] - ts[i]) * 1e3 for i in range(n))
    stream = statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(n))
    return {"wall_ms": wall, "host_ms": statistics.median(host), "host_p90_ms": host[int(0.9 * n)],
            "stream_ms": stream}


def wall_and_stream(step, sets, n):
    """(wall ms per step of an eager loop with one final sync, median GPU ms per step in it)."""
    got = eager_loop(step, sets, n)
    return got["wall_ms"], got["stream_ms"]


def single_graphs(step, sets, n):
    """(wall ms, median stream ms) per step of a Python loop replaying one CUDA graph per step
    (one graph per input set): the eager loop without the host's launch path."""
    import torch

    from bench.kernels import warm_for_capture
    warm_for_capture(step, sets)
    gs = []
    for a in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(*a)
        gs.append(g)
    return wall_and_stream(lambda i: gs[i].replay(), [(i,) for i in range(len(gs))], n)


def parts_ms(mod, x, dy, n):
    """Host ms (median, GPU idle before each call) of the pieces of a plain step of ``mod``
    (a MultiLoRALinear) on x, dy: the forward program alone, the backward program alone (no
    autograd), and an autograd step of a trivial custom Function on the same tensors (what
    the autograd engine costs any custom layer)."""
    import torch

    from tlora_sim.profiler.kernels.config import mix_seed
    from tlora_sim.profiler.kernels.program import backward_program, forward_program

    plan = mod.plan_for(mod.seg_lens, x.device)
    W, A, B = mod.weight, mod.lora_A.detach(), mod.lora_B.detach()
    x = x.detach()
    seed = mix_seed(3)
    fp = forward_program(plan, x, A, B, None, seed, plan.has_dropout, True)
    bp = backward_program(plan, x, dy, A, B, seed, plan.has_dropout, True)
    y, psave, gbuf = fp.run(plan, x, W, None, A, B, seed)
    out = {"fwd_program_ms": host_times(lambda: fp.run(plan, x, W, None, A, B, seed), [()],
                                        n)[0],
           "bwd_program_ms": host_times(lambda: bp.run(plan, dy, x, W, A, B, psave, gbuf, seed,
                                                       True, True), [()], n)[0]}

    class _Id(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g

    xr = x.clone().requires_grad_(True)
    out["engine_floor_ms"] = host_times(
        lambda: torch.autograd.grad(_Id.apply(xr), [xr], dy[:, : x.shape[1]]), [()], n)[0]
    return out


def launch_counts(mod) -> dict:
    """Direct and normal launches so far of every bound launch in ``mod``'s cached programs:
    {"<program> <kernel>": [direct, normal]} (a normal launch after the first means the
    direct path was refused, e.g. a changed alignment)."""
    from tlora_sim.profiler.kernels.fastlaunch import BoundLaunch
    out = {}
    for plan in mod.plans().values():
        for key, prog in plan.extra.items():
            if not isinstance(key, tuple) or not str(key[0]).endswith("prog"):
                continue
            for name, v in vars(prog).items():
                bl = v[0] if isinstance(v, tuple) and v and isinstance(v[0], BoundLaunch) else v
                if isinstance(bl, BoundLaunch):
                    k = f"{key[0]} {name}"
                    c = out.setdefault(k, [0, 0])
                    c[0] += bl.n_direct
                    c[1] += bl.n_normal
    return out


def profile_text(step, sets, n, top=35):
    """cProfile of n steps (synchronised after each, so that the queue never blocks a launch):
    the top functions by own time and by cumulative time."""
    for a in sets:
        step(*a)
    _sync()
    pr = cProfile.Profile()
    pr.enable()
    for i in range(n):
        step(*sets[i % len(sets)])
        _sync()
    pr.disable()
    out = []
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        ps = pstats.Stats(pr, stream=s).strip_dirs().sort_stats(key)
        ps.print_stats(top)
        out.append(f"--- cProfile, {n} steps, sorted by {key}\n" + s.getvalue())
    return "\n".join(out)


def torch_profile_text(step, sets, n, top=25):
    """The torch profiler's CPU-side operator table over n steps (self CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    for a in sets:
        step(*a)
    _sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(n):
            step(*sets[i % len(sets)])
        _sync()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def per_launch_us(fn, n, sync_every=50):
    """Host microseconds per call of fn (the GPU synchronised every ``sync_every`` calls, outside
    the timed region)."""
    fn()
    _sync()
    tot, done = 0.0, 0
    while done < n:
        k = min(sync_every, n - done)
        _sync()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        tot += time.perf_counter() - t0
        done += k
    _sync()
    return tot / n * 1e6


def launch_micro(mod, x, n):
    """Host us per launch of _f1 for ``mod``'s plan on x: config.launch, bare kernel[grid],
    BoundLaunch (direct), a one-argument kernel; torch.empty and addmm_ for scale."""
    import torch
    import triton
    import triton.language as tl

    from tlora_sim.profiler.kernels import lora_kernels as K_
    from tlora_sim.profiler.kernels.config import launch, mix_seed, stages_for
    from tlora_sim.profiler.kernels.fastlaunch import BoundLaunch

    @triton.jit
    def _one(X):
        tl.store(X + tl.program_id(0), 1.0)

    plan = mod.plan_for(mod.seg_lens, x.device)
    cfg = plan.cfg
    Kf = x.shape[1]
    pacc = torch.zeros(max(plan.p_size, 1), dtype=torch.float32, device=x.device)
    psave = torch.empty(max(plan.p_size, 1), dtype=x.dtype, device=x.device)
    cnt = torch.zeros(max(plan.n_tiles, 1), dtype=torch.int32, device=x.device)
    A = mod.lora_A.detach()
    seed = mix_seed(5)
    grid = (plan.n_tiles * plan.ksplit,)
    static = dict(Pacc=pacc, Cnt=cnt, tiles=plan.tiles, meta_i=plan.meta_i, meta_f=plan.meta_f,
                  K=Kf, sxm=x.stride(0), sam=A.stride(0), ksplit=plan.ksplit, kb_per=plan.kb_per,
                  BUCKETS=plan.buckets, **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=True, PREC="tf32",
                  SEED_PTR=False)
    opts = dict(num_warps=cfg.warps_f1)

    def via_launch():
        launch(K_.f1_kernel, grid, "f1", plan.buckets, cfg, x, A, pacc, psave, cnt, plan.tiles,
               plan.meta_i, plan.meta_f, Kf, x.stride(0), A.stride(0), plan.ksplit,
               plan.kb_per, seed,
               BUCKETS=plan.buckets, **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=True, PREC="tf32",
               SEED_PTR=False, num_warps=cfg.warps_f1)

    st = stages_for("f1", plan.buckets, cfg)

    def bare():
        K_.f1_kernel[grid](x, A, pacc, psave, cnt, plan.tiles, plan.meta_i, plan.meta_f, Kf,
                            x.stride(0), A.stride(0), plan.ksplit, plan.kb_per, seed, BUCKETS=plan.buckets,
                            **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=True, PREC="tf32",
                            SEED_PTR=False, num_warps=cfg.warps_f1, num_stages=st)

    bl = BoundLaunch(K_.f1_kernel, grid, "f1", plan.buckets, cfg,
                     ("X", "A", "Psave", "seed"), static, opts)
    out = {}
    out["config_launch_us"] = per_launch_us(via_launch, n)
    out["bare_kernel_grid_us"] = per_launch_us(bare, n)
    out["bound_launch_us"] = per_launch_us(lambda: bl(x, A, psave, seed), n)
    out["bound_launch_direct_calls"] = bl.n_direct
    out["bound_launch_normal_calls"] = bl.n_normal
    buf = torch.zeros(1024, device=x.device)
    out["one_arg_kernel_us"] = per_launch_us(lambda: _one[(1,)](buf), n)
    out["torch_empty_us"] = per_launch_us(lambda: torch.empty(x.shape[0], 4096, device=x.device,
                                                              dtype=x.dtype), n)
    a = torch.randn(64, 64, device=x.device, dtype=x.dtype)
    c = torch.zeros(64, 64, device=x.device, dtype=x.dtype)
    out["addmm_64_us"] = per_launch_us(lambda: c.addmm_(a, a), n)
    return out


def dump_triton(path):
    """The installed Triton's launch path (JITFunction.run, the binder, CompiledKernel, the CUDA
    launcher, knobs.runtime) as source text, for the direct launch's call form."""
    import inspect

    import triton
    from triton.runtime import jit
    parts = [f"triton {triton.__version__} at {os.path.dirname(triton.__file__)}"]
    objs = [("JITFunction.run", getattr(jit.JITFunction, "run", None)),
            ("create_function_from_signature", getattr(jit, "create_function_from_signature", None)),
            ("KernelParam", getattr(jit, "KernelParam", None))]
    try:
        from triton.compiler import compiler as cc
        objs.append(("CompiledKernel", getattr(cc, "CompiledKernel", None)))
    except Exception as e:  # noqa: BLE001
        parts.append(f"compiler import failed: {e!r}")
    try:
        from triton.backends.nvidia import driver as nd
        for name in ("CudaLauncher", "wrap_handle_tensordesc", "make_tensordesc_arg", "CudaDriver"):
            objs.append((f"nvidia.driver.{name}", getattr(nd, name, None)))
    except Exception as e:  # noqa: BLE001
        parts.append(f"nvidia driver import failed: {e!r}")
    try:
        from triton import knobs
        objs.append(("knobs.runtime class", type(knobs.runtime)))
    except Exception as e:  # noqa: BLE001
        parts.append(f"knobs import failed: {e!r}")
    for name, o in objs:
        if o is None:
            parts.append(f"===== {name}: absent")
            continue
        try:
            parts.append(f"===== {name}\n" + inspect.getsource(o))
        except Exception as e:  # noqa: BLE001
            parts.append(f"===== {name}: no source ({e!r})")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def run_case(layer, mix, args, report):
    import torch

    import bench.kernels as KB
    from tlora_sim.profiler.kernels.baselines import make_impl
    KB.DEV = "cuda"
    K, N, ranks, segs, W, A, B, xy = KB.case_tensors(layer, mix, f"{layer}|{mix}", 3)
    sc = KB.scales_for(ranks)
    res = {"layer": layer, "mix": mix, "tokens": sum(segs), "paths": {}}
    paths = [p for p in args.paths.split(",") if p]
    fused = make_impl("fused", W, A, B, segs, ranks, sc, args.dropout)
    base = make_impl("base", W, A, B, segs, ranks, sc, args.dropout)
    fsets = [fused.inputs(x, dy) for x, dy in xy]
    bsets = [base.inputs(x, dy) for x, dy in xy]
    steps = {"base": (base.step, bsets), "plain": (fused.step, fsets),
             "graph": (fused.eager_step, fsets)}
    if args.only_launches:
        paths = []
    for p in paths:
        step, sets = steps[p]
        gpu = KB.time_graph(step if p != "graph" else fused.step, sets, 20)
        hmed, hmean = host_times(step, sets, args.steps)
        wall, stream = wall_and_stream(step, sets, args.steps)
        res["paths"][p] = {"gpu_ms": gpu, "host_ms": hmed, "host_mean_ms": hmean,
                           "wall_ms": wall, "stream_ms": stream, "wall_over_gpu": wall / gpu}
        print(f"{layer} {mix} {p:<6} gpu {gpu:.3f} host {hmed:.3f} (mean {hmean:.3f}) wall "
              f"{wall:.3f} stream {stream:.3f} wall/gpu {wall / gpu:.2f}", flush=True)
        if args.gap and p in ("base", "plain"):
            gw, gs = single_graphs(step, sets, args.steps)
            g100 = KB.time_graph(step, sets, 100)
            res["paths"][p].update(graph1_wall_ms=gw, graph1_stream_ms=gs, gpu100_ms=g100)
            print(f"{layer} {mix} {p:<6} one graph per step: wall {gw:.3f} stream {gs:.3f}; "
                  f"gpu over 100 replays {g100:.3f}", flush=True)
    x, dy = fsets[0]
    mod = fused.mod
    if "plain" in paths:  # forward and backward host time separately

        def fwd_only():
            return mod(x)
        fh, _ = host_times(fwd_only, [()], args.steps)
        res["paths"]["plain"]["host_fwd_ms"] = fh
        print(f"{layer} {mix} plain forward-only host {fh:.3f} ms", flush=True)
        res["launch_counts"] = launch_counts(mod)
        print(f"{layer} {mix} plain launches (direct, normal): {res['launch_counts']}", flush=True)
        res["parts"] = parts_ms(mod, x, dy, args.steps)
        print(f"{layer} {mix} plain parts (host ms): "
              + json.dumps({k: round(v, 4) for k, v in res["parts"].items()}), flush=True)
        if not args.no_profile:
            report.append(f"########## {layer} {mix}: plain path\n"
                          + profile_text(fused.step, fsets, args.steps))
            report.append(f"--- torch.profiler CPU, {args.steps} steps\n"
                          + torch_profile_text(fused.step, fsets, args.steps))
    if args.launches > 0 and (args.only_launches or "plain" in paths):
        mod(x)  # compiles the plan's kernels
        res["launch_us"] = launch_micro(mod, x.detach(), args.launches)
        print(f"{layer} {mix} single launches (host us): "
              + json.dumps({k: round(v, 2) for k, v in res["launch_us"].items()}), flush=True)
    fused = base = fsets = bsets = mod = x = dy = None
    import gc
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return res


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import torch
    import triton
    if not torch.cuda.is_available():
        sys.exit("bench/kernel_host.py needs a CUDA GPU")
    if args.dump_triton:
        dump_triton(os.path.join(args.out, "triton_src.txt"))
    commit = os.environ.get("TLORA_GIT_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=ROOT).stdout.strip()
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "commit": commit, "argv": sys.argv,
            "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(meta), flush=True)
    report, results = [json.dumps(meta)], []
    for c in args.cases.split(","):
        layer, mix = c.split(":")
        results.append(run_case(layer, mix, args, report))
    tag = "_launches" if args.only_launches else ""
    with open(os.path.join(args.out, f"kernel_host{tag}.json"), "w") as f:
        json.dump({"meta": meta, "cases": results}, f, indent=1)
    with open(os.path.join(args.out, f"kernel_host{tag}.txt"), "w") as f:
        f.write("\n\n".join(report))
    print("host ms per step (median) / wall / gpu:")
    for r in results:
        print(f"  {r['layer']:<11}{r['mix']:<9}" + "  ".join(
            f"{p} {v['host_ms']:.3f}/{v['wall_ms']:.3f}/{v['gpu_ms']:.3f}"
            for p, v in r["paths"].items()))


if __name__ == "__main__":
    main()
