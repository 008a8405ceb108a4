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

``--smem FILE`` instead compiles (no GPU needed, no launch; torch only for the comparison) every
single-bucket variant of f1, f2, b1 and b2 for sm_90 at 1-4 pipeline stages under the tile
configurations of tests/gpu/test_kernel_smem.py, the base GEMM with the LoRA epilogue at four
tile shapes and 2-4 stages, and the persistent GEMM (``PGEMM_TILES``, session 16) at split 1/2/4
in three loop modes and 3-4 stages, and writes the shared memory (bytes) Triton reports
(``CompiledKernel.metadata.shared``) as JSON, printing each variant where the model
(``config.smem_bytes``, ``GemmConfig.smem_bytes``) is below it; ``--precompile`` worker
processes compile in parallel. The H100 image's run (Triton 3.6.0, 15 workers, 119 s, 470
variants) is pinned in profiler/data/kernel_profile_h100_2026-11-26_8_smem.json:
    python3 bench/kernel_profile.py --smem $OUT/smem_h100.json --precompile 15
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

if "--smem" not in sys.argv:  # the sweep needs neither torch nor a GPU
    from bench import kernels as KB  # noqa: E402  (the benchmark's cases, inputs and timers)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--cases", help="comma list of layer:mix")
    ap.add_argument("--smem", default=None, help="JSON out: compiled shared memory sweep")
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


# tile configurations of tests/gpu/test_kernel_smem.py (CONFIGS and SWEPT): (bms, bk, bn, cms)
SMEM_CONFIGS = {"shipped": ((64, 64, 128, 64, 64), 128, 128, (1, 1, 1, 1, 1)),
                "bm128": ((128,) * 5, 128, 128, (1, 1, 1, 1, 1)),
                "bk64-bn256": ((64, 64, 128, 64, 64), 64, 256, (1, 1, 1, 1, 1)),
                "cm2": ((64, 64, 128, 64, 64), 128, 128, (1, 1, 2, 2, 2))}
# lora_gemm tiles (bm, bn, bk, warps): base_gemm.json's backward and forward, and 128 x 128
GEMM_TILES = ((128, 256, 64, 8), (256, 128, 64, 8), (128, 128, 64, 8), (128, 128, 64, 4))
# the persistent GEMM (lora_gemm_persist, session 16): tiles; each at split 1/2/4, three loop modes
# (LoRA first, LoRA after the loop, flattened loop), stages 3-4, with and without a TMA store
PGEMM_TILES = ((128, 256, 64, 8),)
_PTR_F32 = {"Pacc", "meta_f", "G", "GB", "GA", "WSP"}
_PTR_I32 = {"Cnt", "tiles", "meta_i", "chunks", "TCNT"}


def _smem_variants(kern, bms, bk, bn, cms):
    """Constexpr sets of ``kern`` for one tile configuration: every flag that changes what a loop
    loads (dropout, the Q atomics, the dX write, bias, zeroing), so the sweep takes the largest."""
    bm = {f"BM{i}": b for i, b in enumerate(bms)}
    cm = {f"CM{i}": c for i, c in enumerate(cms)}
    if kern == "f1":
        return [dict(**bm, BK=bk, DROPOUT=d, PREC="tf32", SEED_PTR=False) for d in (False, True)]
    if kern == "f2":
        return [dict(**bm, BN=bn, HAS_BIAS=hb, ZERO_G=z, PREC="tf32", WRITE_Y=True)
                for hb in (False, True) for z in (False, True)]
    if kern == "b1":
        return [dict(**bm, **cm, BN=bn, Q_ATOMIC=q, PREC="tf32") for q in (False, True)]
    return [dict(**bm, **cm, BK=bk, DROPOUT=d, WRITE_DX=w, PREC="tf32", SEED_PTR=False)
            for d in (False, True) for w in (False, True)]


def _smem_one(job):
    """(job, shared bytes): compile ``{kern}_kernel`` for sm_90 with one rank bucket; pointers
    16-byte aligned and sizes/strides divisible by 16 (as a 4096-wide launch specialises them:
    the most pipelining, so the largest need)."""
    kern, cfg_name, bucket, stages, consts = job
    import importlib.util
    import types

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kdir = os.path.join(ROOT, "profiler", "kernels")
    pkg = types.ModuleType("_smem_pk")   # the two kernel files alone (no torch), as a package
    pkg.__path__ = [kdir]
    sys.modules["_smem_pk"] = pkg
    mods = {}
    for m in ("lora_kernels", "lora_gemm_kernel", "lora_gemm_persist"):
        spec = importlib.util.spec_from_file_location(f"_smem_pk.{m}", os.path.join(kdir, m + ".py"))
        mods[m] = importlib.util.module_from_spec(spec)
        sys.modules[f"_smem_pk.{m}"] = mods[m]
        spec.loader.exec_module(mods[m])
    consts = dict(consts, BUCKETS=1 << bucket)
    warps = consts.pop("num_warps", 8)
    if kern in ("gemm", "gemmp"):
        fn = (mods["lora_gemm_kernel"].gemm_lora_kernel if kern == "gemm"
              else mods["lora_gemm_persist"].gemm_persist_kernel)
        bm, bn, bk = consts["BM"], consts["BN"], consts["BK"]
        wblk = [bk, bn] if consts["BWD"] else [bn, bk]
        tys = {"XIN": f"tensordesc<bf16[{bm},{bk}]>", "W": f"tensordesc<bf16[{wblk[0]},{wblk[1]}]>",
               "mtiles": "*i32", "meta_i": "*i32", "meta_f": "*fp32"}
        if kern == "gemmp":
            tys["ODESC"] = f"tensordesc<bf16[{bm},{bn // consts['SPLIT']}]>"
    else:
        fn = getattr(mods["lora_kernels"], f"{kern}_kernel")
        tys = {}
    names = list(fn.arg_names)
    sig = {n: ("constexpr" if n in consts else tys[n] if n in tys else "*fp32" if n in _PTR_F32
               else "*i32" if n in _PTR_I32
               else "*bf16" if (n[0].isupper() and n not in ("K", "N", "M", "NOUT", "KRED"))
               or n == "bias" else "i32")
           for n in names}
    nodiv = {"ksplit", "kb_per", "seed", "g_numel", "ngroups", "nb_per", "nsplit", "n_q", "n_nb",
             "n_kb", "n_mt", "XIN", "W", "ODESC"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n] != "constexpr" and n not in nodiv}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={(names.index(n),): v for n, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    return job, int(k.metadata.shared)


def gemm_config_of(kern: str, name: str):
    """The ``GemmConfig`` of a swept GEMM row: "gemm" names "128x256x64w8" (bm x bn x bk, warps),
    "gemmp" (persistent) "128x256x64w8s2fl" (then split, "f" flattened, "l" LoRA first)."""
    from tlora_sim.profiler.kernels.config import GemmConfig
    bm, bn, rest = name.split("x")
    bk, rest = rest.split("w")
    if kern == "gemm":
        return GemmConfig(bm=int(bm), bn=int(bn), bk=int(bk), warps=int(rest))
    w, tail = rest.split("s")
    return GemmConfig(bm=int(bm), bn=int(bn), bk=int(bk), warps=int(w), persistent=True,
                      split=int(tail.rstrip("fl")), flatten="f" in tail, lora_first="l" in tail)


def smem_sweep(out_path, procs):
    """Compile every (kernel, config, bucket, stages 1-4, flag set) of ``SMEM_CONFIGS`` for sm_90
    and write {"triton": version, "rows": [[kernel, config, bucket, stages, max shared bytes]]}
    to ``out_path`` (the maximum over the flag sets); prints the rows where the model
    (``config.smem_bytes``, if importable) is below the compiled need."""
    import multiprocessing as mp

    import triton
    jobs = [(kern, cn, b, st, v) for cn, (bms, bk, bn, cms) in SMEM_CONFIGS.items()
            for kern in ("f1", "f2", "b1", "b2") for b in range(5) for st in (1, 2, 3, 4)
            for v in _smem_variants(kern, bms, bk, bn, cms)]
    jobs += [("gemm", f"{bm}x{bn}x{bk}w{w}", b, st,
              dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, BWD=bwd, LORA=True, HAS_BIAS=not bwd,
                   DROPOUT=bwd, SEED_PTR=False, EVEN_K=True, EVEN_N=True, USE_TMA=True,
                   PREC="tf32", num_warps=w))
             for bm, bn, bk, w in GEMM_TILES for b in range(5) for st in (2, 3, 4)
             for bwd in (True, False)]
    jobs += [("gemmp", f"{bm}x{bn}x{bk}w{w}s{sp}{'f' if fl else ''}{'l' if lf else ''}", b, st,
              dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, NUM_SMS=132, BWD=bwd, LORA=True,
                   HAS_BIAS=not bwd, DROPOUT=bwd, SEED_PTR=False, UNIFORM=False, TMA_STORE=ts,
                   SPLIT=sp, FLATTEN=fl, LORA_FIRST=lf, WS=False, PREC="tf32",
                   TAIL_SPLIT=lf and not fl, num_warps=w))
             for bm, bn, bk, w in PGEMM_TILES for sp in (1, 2, 4)
             for fl, lf in ((False, True), (False, False), (True, False))
             for b in range(5) for st in (3, 4) for bwd in (True, False) for ts in (True, False)]
    uniq = {}   # configurations that give a kernel the same constexprs compile once
    for j in jobs:
        uniq.setdefault((j[0], j[2], j[3], tuple(sorted(j[4].items()))), []).append(j)
    best = {}
    with mp.get_context("spawn").Pool(procs) as pool:
        for job, shared in pool.imap_unordered(_smem_one, [v[0] for v in uniq.values()]):
            for kern, cn, b, st, _ in uniq[(job[0], job[2], job[3], tuple(sorted(job[4].items())))]:
                best[(kern, cn, b, st)] = max(best.get((kern, cn, b, st), 0), shared)
    rows = [[*k, best[k]] for k in sorted(best)]
    with open(out_path, "w") as f:   # one row per line
        f.write(json.dumps({"triton": triton.__version__, "target": "sm_90",
                            "columns": ["kernel", "config", "bucket", "stages", "shared_bytes"],
                            "rows": []})[:-2] + "\n" + ",\n".join(json.dumps(r) for r in rows)
                + "\n]}\n")
    try:
        from tlora_sim.profiler.kernels.config import KernelConfig, smem_bytes
    except Exception:  # noqa: BLE001 - the model needs torch; the sweep does not
        return 0
    under = 0
    for kern, cn, b, st, shared in rows:
        if kern in ("gemm", "gemmp"):
            model = gemm_config_of(kern, cn).smem_bytes(st)
        else:
            bms, bk, bn, cms = SMEM_CONFIGS[cn]
            model = smem_bytes(kern, b, KernelConfig(bms=bms, bk=bk, bn=bn, cms=cms), st)
        if model < shared:
            under += 1
            print(f"under: {kern} {cn} bucket {b} stages {st}: compiled {shared} model {model}")
    print(f"{len(rows)} compiled variants, {under} above the model")
    return 0


def _short(name: str) -> str:
    return name if len(name) < 48 else name[:45] + "..."


def main(argv=None):
    args = parse_args(argv)
    if args.smem:
        return smem_sweep(args.smem, max(1, args.precompile))
    if not args.cases:
        raise SystemExit("--cases is required (or --smem)")
    import gc

    import torch
    from tlora_sim.profiler.kernels import KernelConfig
    from tlora_sim.profiler.kernels.baselines import make_impl
    KB.DEV = "cuda"
    cfgs = json.loads(args.configs)
    rate, bw = KB.measure_ceilings()
    print(f"ceilings: bf16 mm {rate / 1e12:.0f} TFLOP/s, copy {bw / 1e12:.2f} TB/s", flush=True)
    if args.precompile and "fused" in args.impls:
        keys = []
        for case in args.cases.split(","):
            layer, mix = case.split(":")
            K, N = KB.layer_shape(layer)
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
            kw = {"kernel_config": KernelConfig.from_dict(c)} if c is not None else {}
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
