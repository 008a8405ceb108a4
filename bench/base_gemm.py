#!/usr/bin/env python3
"""Measure, per GPU and layer shape, whether our GEMM with the LoRA term in its epilogue beats
cuBLAS, and write the table that ``KernelConfig(base_gemm="auto")`` reads.

Two measurements per (layer K x N, tokens M):

Times are GPU times: ``triton.testing.do_bench_cudagraph`` (median of replays of a captured
graph), so host launch costs do not enter.

1. **Base GEMM alone** (no LoRA): cuBLAS (``torch.mm``) against ``lora_gemm.base_gemm`` for each
   tile configuration of ``--configs``, forward (x (M,K) @ W^T) and backward (dY (M,N) @ W).
   The best configuration per (pass, K, N) at the largest M is kept.
2. **The fused layer's step** (forward + backward, 4 adapters of ranks 8, 16, 32, 64, dropout
   0.1, on ``multi_lora_linear``), with each pass's base GEMM on cuBLAS (LoRA term written by
   ``_f2``/``_b2``, then ``addmm_`` with beta = 1) or on our GEMM (LoRA term in its epilogue):
   fwd choice = (triton, cublas) vs (cublas, cublas), bwd choice = (cublas, triton) vs (cublas,
   cublas). Our GEMM is chosen from the smallest M at which it is faster at that M and every
   larger one measured (``min_tokens``); else cuBLAS keeps the shape.

Outputs: ``--csv`` (one row per timing, rewritten after every layer so a run cut short keeps the
layers it finished) and ``--table`` (JSON: {"gpus": {name: {"fwd|K|N": ...}}, plus provenance}); an
existing table keeps its other GPUs' entries (bytes unchanged).

Usage (GPU machine, repository root):
    python3 bench/base_gemm.py --csv $OUT/base_gemm.csv --table profiler/data/base_gemm.json
Re-choosing from such a CSV with another margin (no GPU):
    python3 bench/base_gemm.py --from-csv profiler/data/base_gemm_h100.csv --margin 0 \
        --gpu "NVIDIA H100 80GB HBM3" --table profiler/data/base_gemm.json
The H200 row (issue 43 item 5; the device run is profiler/validation/h200_item5.sh, layers of
llama3-8b and qwen3-8b), with the device run's provenance:
    python3 bench/base_gemm.py --from-csv OUT/base_gemm_h200.csv --margin 0 --gpu "NVIDIA H200" \
        --provenance-from OUT/base_gemm.json --table profiler/data/base_gemm.json
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

LAYERS = {"4096x4096": (4096, 4096), "4096x14336": (4096, 14336),
          "14336x4096": (14336, 4096), "8192x8192": (8192, 8192)}
DEFAULT_LAYERS = ",".join(LAYERS)
# the other linear shapes of llama3-8b and qwen3-8b (k/v projections, qwen3-8b's MLP): not in the
# default list (the H100 runs of record), named with --layers
LAYERS.update({"4096x1024": (4096, 1024), "4096x12288": (4096, 12288), "12288x4096": (12288, 4096)})
# Triton's warp-specialised loop (tl.range(..., warp_specialize=True)) was tried in this sweep on
# an H100 with Triton 3.6 (2026-11-25): with 4 warps the run hung until the call's limit, so it is
# not offered. In the persistent kernel (session 16) it compiles for sm_90 to the same code as
# without (no partitions, same registers; local compile at 4 and 8 warps).
DEFAULT_CONFIGS = [
    {"bm": 128, "bn": 256, "bk": 64, "warps": 8, "stages": 3},
    {"bm": 256, "bn": 128, "bk": 64, "warps": 8, "stages": 3},
    {"bm": 128, "bn": 128, "bk": 64, "warps": 8, "stages": 4},
    {"bm": 128, "bn": 128, "bk": 128, "warps": 8, "stages": 3},
    # the persistent GEMM, LoRA term before the main loop (profiler/KERNELS.md, session 16)
    {"bm": 128, "bn": 256, "bk": 64, "warps": 8, "stages": 3, "persistent": True, "split": 2,
     "lora_first": True},
]
MIX_RANKS = [8, 16, 32, 64]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--csv", default="base_gemm.csv", help="timings CSV (default: %(default)s)")
    ap.add_argument("--table", default=None, help="write/merge the choice table JSON here")
    ap.add_argument("--layers", default=DEFAULT_LAYERS, help=f"comma list of KxN layers of {', '.join(LAYERS)} "
                                                             "(default %(default)s)")
    ap.add_argument("--tokens", default="2048,4096,8192,16384", help="comma list of M")
    ap.add_argument("--configs", default=None, help="JSON list of GemmConfig dicts to sweep")
    ap.add_argument("--margin", type=float, default=0.01,
                    help="our GEMM must be at least this fraction faster (default: %(default)s)")
    ap.add_argument("--from-csv", default=None,
                    help="no GPU: re-choose from a CSV an earlier run wrote (with --gpu, --table)")
    ap.add_argument("--gpu", default=None, help="GPU name of --from-csv's rows")
    ap.add_argument("--dry-run", action="store_true",
                    help="check --layers, --tokens and --configs and print what would be timed (no GPU)")
    ap.add_argument("--provenance-from", default=None, metavar="TABLE",
                    help="with --from-csv: take --gpu's provenance from this table (the device run's "
                         "--table) instead of --table's")
    return ap.parse_args(argv)


def read_rows(path):
    """The rows of a CSV this script wrote (ints and floats restored)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("K", "N", "M"):
            r[k] = int(r[k])
        r["ms"] = float(r["ms"])
        r["ref_ms"] = float(r["ref_ms"]) if r.get("ref_ms") else None
    return rows


def write_csv(path, rows):
    """Write the timing rows (replaces ``path`` atomically)."""
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kind", "pass_", "K", "N", "M", "impl", "config", "ms", "ref_ms"])
        w.writeheader()
        w.writerows(rows)
    os.replace(path + ".tmp", path)


def write_table(path, gpu, entries, prov):
    """Merge ``entries`` for ``gpu`` (and its provenance ``prov``) into the table at ``path``."""
    table = {"gpus": {}}
    if os.path.exists(path):
        with open(path) as f:
            table = json.load(f)
    table.setdefault("gpus", {})[gpu] = entries
    table.setdefault("provenance", {})[gpu] = prov
    with open(path + ".tmp", "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _bench(fn):
    """GPU time (ms): the call replayed from a CUDA graph (no host launch cost), median."""
    import triton
    fn()
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def _commit():
    try:
        return subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001 - provenance only
        return os.environ.get("TLORA_GIT_COMMIT", "unknown")


def base_rows(K, N, M, configs):
    """Timings of the plain GEMM, both passes: cuBLAS and each configuration (failures recorded)."""
    import torch
    from tlora_sim.profiler.kernels.config import GemmConfig
    from tlora_sim.profiler.kernels.lora_gemm import base_gemm
    g = torch.Generator(device="cuda").manual_seed(K * 7 + N * 3 + M)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    W = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    rows = []
    for pas, a, fn_ref in (("fwd", x, lambda: torch.mm(x, W.t())), ("bwd", dy, lambda: torch.mm(dy, W))):
        ref = fn_ref()
        ms = _bench(fn_ref)
        rows.append(dict(kind="base", pass_=pas, K=K, N=N, M=M, impl="cublas", config="", ms=ms))
        for c in configs:
            gc = GemmConfig(**c)
            try:
                out = base_gemm(a, W, gc, pas == "bwd")
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                if not err < 2e-2:
                    raise RuntimeError(f"relative error {err:.3g}")
                t = _bench(lambda: base_gemm(a, W, gc, pas == "bwd"))
            except Exception as e:  # noqa: BLE001 - record, go on
                print(f"  {pas} {K}x{N} M={M} {c}: FAILED {e!r}"[:300], flush=True)
                t = float("nan")
            rows.append(dict(kind="base", pass_=pas, K=K, N=N, M=M, impl="triton",
                             config=json.dumps(c), ms=t))
    return rows


def step_ms(K, N, M, fwd, bwd):
    """GPU time of one fused-layer training step with each pass's GEMM choice (None = cuBLAS)."""
    import torch
    from tlora_sim.profiler.kernels import KernelConfig, build_plan, multi_lora_linear
    from tlora_sim.profiler.kernels.config import GemmConfig
    cfg = KernelConfig(base_gemm="triton" if (fwd or bwd) else "cublas",
                       gemm_fwd=GemmConfig(**fwd) if fwd else None,
                       gemm_bwd=GemmConfig(**bwd) if bwd else None)
    segs = [M // len(MIX_RANKS)] * len(MIX_RANKS)
    plan = build_plan(segs, MIX_RANKS, [2.0] * len(MIX_RANKS), 0.1, K, N, "cuda", cfg)
    if not fwd:
        plan.extra[("gemm", "fwd", "cuda:0")] = None
    if not bwd:
        plan.extra[("gemm", "bwd", "cuda:0")] = None
    g = torch.Generator(device="cuda").manual_seed(M + K)
    x = torch.randn(sum(segs), K, device="cuda", generator=g).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(sum(segs), N, device="cuda", generator=g).to(torch.bfloat16)
    W = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16)
    A = (torch.randn(sum(MIX_RANKS), K, device="cuda", generator=g) / K ** 0.5).to(torch.bfloat16).requires_grad_(True)
    B = (torch.randn(sum(MIX_RANKS), N, device="cuda", generator=g) / 4).to(torch.bfloat16).requires_grad_(True)

    def step():
        y = multi_lora_linear(x, W, A, B, plan, seed=3)
        return torch.autograd.grad(y, [x, A, B], dy)
    return _bench(step)


def _step_or_nan(K, N, M, fwd, bwd):
    """``step_ms``, or NaN (printed) where that configuration fails on this GPU and shape."""
    try:
        return step_ms(K, N, M, fwd, bwd)
    except Exception as e:  # noqa: BLE001 - record, go on (choose() leaves the shape to cuBLAS)
        print(f"  step {K}x{N} M={M} fwd={fwd} bwd={bwd}: FAILED {e!r}"[:300], flush=True)
        return float("nan")


def choose(rows, margin):
    """Per (pass, K, N): the table entry from the step rows (see the module docstring); step rows
    with a failed timing (NaN) are left out, and a shape with none left is not in the table
    (cuBLAS)."""
    out = {}
    keys = sorted({(r["pass_"], r["K"], r["N"]) for r in rows if r["kind"] == "step"})
    for pas, K, N in keys:
        st = {r["M"]: r for r in rows if r["kind"] == "step" and (r["pass_"], r["K"], r["N"]) == (pas, K, N)
              and r["ms"] == r["ms"] and r["ref_ms"] is not None and r["ref_ms"] == r["ref_ms"]}
        if not st:
            continue
        Ms = sorted(st)
        ratio = {M: st[M]["ms"] / st[M]["ref_ms"] for M in Ms}
        wins = [M for M in Ms if ratio[M] <= 1.0 - margin]
        min_tokens = None
        for i, M in enumerate(Ms):
            if all(m in wins for m in Ms[i:]):
                min_tokens = M
                break
        base = [r for r in rows if r["kind"] == "base" and (r["pass_"], r["K"], r["N"]) == (pas, K, N)
                and r["M"] == max(Ms)]
        cub = next(r["ms"] for r in base if r["impl"] == "cublas")
        cfg = json.loads(st[max(Ms)]["config"])
        ours = next((r["ms"] for r in base if r["impl"] == "triton" and json.loads(r["config"]) == cfg), None)
        out[f"{pas}|{K}|{N}"] = {
            "impl": "triton" if min_tokens is not None else "cublas",
            "min_tokens": min_tokens if min_tokens is not None else 0, "config": cfg,
            "step_ratio_by_tokens": {str(M): round(ratio[M], 4) for M in Ms},
            "base_gemm_vs_cublas": round(ours / cub, 4) if ours else None,
            "why": ("faster step from min_tokens on" if min_tokens is not None else
                    "cuBLAS's two-pass step was as fast or faster at the largest measured M"),
        }
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.from_csv:
        if not (args.gpu and args.table):
            raise SystemExit("--from-csv needs --gpu and --table")
        entries = choose(read_rows(args.from_csv), args.margin)
        old = {}
        src = args.provenance_from or args.table
        if os.path.exists(src):
            with open(src) as f:
                old = json.load(f).get("provenance", {}).get(args.gpu, {})
        elif args.provenance_from:
            raise SystemExit(f"{src}: no such table (--provenance-from)")
        prov = dict(old, rechosen=f"python3 bench/base_gemm.py --from-csv {args.from_csv} "
                    f"--margin {args.margin} (" + datetime.date.today().isoformat() + ")")
        write_table(args.table, args.gpu, entries, prov)
        for k, e in entries.items():
            print(f"{k}: {e['impl']} from {e['min_tokens']} tokens; {e['step_ratio_by_tokens']}")
        return
    bad = [lay for lay in args.layers.split(",") if lay not in LAYERS]
    if bad:
        raise SystemExit(f"--layers: unknown {', '.join(bad)} (known: {', '.join(LAYERS)})")
    configs = json.loads(args.configs) if args.configs else DEFAULT_CONFIGS
    Ms = [int(v) for v in args.tokens.split(",")]
    if args.dry_run:
        import triton.testing  # noqa: F401 - what the GPU run imports
        from tlora_sim.profiler.kernels import KernelConfig, build_plan, multi_lora_linear  # noqa: F401
        from tlora_sim.profiler.kernels.config import GemmConfig
        from tlora_sim.profiler.kernels.lora_gemm import base_gemm  # noqa: F401
        for c in configs:
            GemmConfig(**c)
        for layer in args.layers.split(","):
            print(f"{layer} {LAYERS[layer]}: M {Ms}, {len(configs)} configs, steps fwd/bwd vs cuBLAS")
        return
    import torch
    import triton
    rows = []
    gpu = torch.cuda.get_device_name(0)
    for layer in args.layers.split(","):
        K, N = LAYERS[layer]
        best = {}
        for M in Ms:
            rows += base_rows(K, N, M, configs)
        for pas in ("fwd", "bwd"):
            cand = [r for r in rows if r["kind"] == "base" and r["impl"] == "triton" and r["pass_"] == pas
                    and (r["K"], r["N"], r["M"]) == (K, N, max(Ms)) and r["ms"] == r["ms"]]
            best[pas] = json.loads(min(cand, key=lambda r: r["ms"])["config"]) if cand else DEFAULT_CONFIGS[0]
        for M in Ms:
            ref = _step_or_nan(K, N, M, None, None)
            for pas in ("fwd", "bwd"):
                ms = _step_or_nan(K, N, M, best[pas] if pas == "fwd" else None, best[pas] if pas == "bwd" else None)
                rows.append(dict(kind="step", pass_=pas, K=K, N=N, M=M, impl="triton",
                                 config=json.dumps(best[pas]), ms=ms, ref_ms=ref))
            print(f"{layer} M={M}: step cublas {ref:.3f} ms, fwd-ours "
                  f"{rows[-2]['ms']:.3f}, bwd-ours {rows[-1]['ms']:.3f}", flush=True)
        write_csv(args.csv, rows)
    entries = choose(rows, args.margin)
    for k, e in entries.items():
        print(f"{k}: {e['impl']} from {e['min_tokens']} tokens; step ratio {e['step_ratio_by_tokens']}; "
              f"base GEMM ours/cuBLAS {e['base_gemm_vs_cublas']}; {e['config']}")
    if args.table:
        write_table(args.table, gpu, entries, {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": triton.__version__, "commit": _commit(),
            "command": "python3 bench/base_gemm.py " + " ".join(argv if argv is not None else sys.argv[1:])})
        print(f"wrote {args.table}")


if __name__ == "__main__":
    main()
