"""``tlora-sim profile``: measure what a co-located LoRA training step costs on this GPU.

For each base model (real decoder-layer shapes, random weights) it writes one CSV row per
measurement to ``OUT/profile_<gpu>.csv`` (appended and flushed row by row, so a run cut short
keeps what it measured):

* ``opt``    AdamW (fused) step over adapter parameter sets: ``params`` elements in ``tensors``
             tensors (bf16), the optimizer term of the cost model.
* ``noattn`` the frozen decoder layer without its attention block (forward + dX) at ``tokens``:
             the base curve (linear layers, norms, SwiGLU, residuals).
* ``attn``   the attention block alone (rotary + causal SDPA, forward + backward) for
             ``batch_sizes`` sequences of ``seq_lens`` tokens.
* ``base``   the full frozen layer (attention included, no adapters): checks that the base curve
             plus the attention block add up.
* ``head``   embedding lookup + final RMSNorm + LM head + fp32 cross-entropy, forward + dX.
* ``mix``    the full decoder layer with a mix of adapters (``ranks``, ``batch_sizes``,
             ``seq_lens``: one entry per adapter) under plan ``alone`` (one adapter, eager torch
             LoRA as PEFT runs it), ``loop`` (mLoRA style), ``fused`` (our Triton kernel),
             ``lorafusion`` (LoRAFusion's own kernels, from ``.ext/lorafusion``; one-adapter mixes
             too, since its policy starts lone jobs under it) or ``grouped`` (ALTO-style grouped
             GEMMs; two or more adapters): forward, backward (dX and adapter gradients) and the
             layer's AdamW step. Mixes a plan cannot run are written with an error starting "not
             runnable" and counted in the summary; ``lorafusion`` without its source is skipped
             (counted too). The row's ``kernel_variant`` names the implementation
             (``lorafusion@<their commit>[stages..]``, ``grouped[torch._grouped_mm,R=..]``).

Timing (profiler/layer.py): CUDA events around each phase, a warm-up, then ``reps`` steps without
host synchronisation between them (a training loop's steady state; eager, as trainers run),
inputs rotated over 3 random sets; the median per phase is recorded with the p10/p90 spread of
the step. Peak memory: one extra step between ``reset_peak_memory_stats`` and
``max_memory_allocated``. Every row carries the GPU name, driver, CUDA, torch and triton
versions, the kernel variant (implementation + hash of ``profiler/kernels`` sources) and the git
commit. ``OUT/e2e_<gpu>.csv`` holds the end-to-end full-model check (profiler/e2e.py).

Run (on the GPU machine, from the repository root)::

    python3 -m tlora_sim.profiler.profile --gpu-name auto --models llama3-8b,qwen3-8b,qwen2.5-32b,llama3-70b \\
        --quick --out OUT --budget-s 540 --e2e
    python3 -m tlora_sim.profiler.profile --device cpu --tiny --out /tmp/p   # a dry run on the CPU

Jobs alone only (issue 43 item 5: one adapter, every ``--lone-ranks`` x ``--lone-tokens``, no
component grids; ``profiler/validation/h200_item5.sh``)::

    python3 -m tlora_sim.profiler.profile --models llama3-8b,qwen3-8b --quick --mixes-only \
        --plans alone,fused,lorafusion --lone-ranks 16,64,128 --lone-tokens 512,1024,2048,4096,8192,16384 \
        --budget-s 170 --out OUT

LoRAFusion's source is never committed: ``profiler/fetch_lorafusion.sh MIRROR`` copies it to
``.ext/lorafusion`` (carry that folder to the GPU machine).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from tlora_sim.profiler.provenance import Writer, log, provenance
from tlora_sim.profiler.grid import MINI_MIXES, MODEL_WEIGHT, PLAN_IMPL, SEQS, STACK_MIXES, T_MAX_FULL, T_MAX_QUICK, order_members, precompile, quick_mixes, spread, token_grid
from tlora_sim.profiler.measure import Profiler
from tlora_sim.profiler.grid import DEFAULT_PLANS, MULTI_ONLY_PLANS, lone_mixes, lorafusion_compile_keys, \
    precompile_lorafusion
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``tlora-sim profile`` (also ``python3 -m tlora_sim.profiler.profile``)."""
    p.add_argument("--gpu-name", default="auto", help="GPU type recorded in the rows (auto: from the device name)")
    p.add_argument("--models", default="llama3-8b,qwen3-8b,qwen2.5-32b,llama3-70b",
                   help="comma-separated catalog models (sim/costmodel/models.py)")
    p.add_argument("--quick", action="store_true", help="the quick grid (under 10 minutes on one GPU)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu: a dry run; use --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests): one tiny model, a few mixes")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="stop starting new measurements after this many seconds (0: 540 with --quick, else none)")
    p.add_argument("--plans", default=DEFAULT_PLANS,
                   help="comma-separated plans to measure: alone, loop, fused, lorafusion (LoRAFusion's kernels; "
                        "skipped, and counted, where their source is absent), grouped (ALTO-style grouped GEMM); "
                        "loop and grouped run on multi-adapter mixes only, alone on one-adapter mixes only")
    p.add_argument("--lorafusion", default=None, metavar="DIR",
                   help="LoRAFusion's source (default: env TLORA_LORAFUSION, else .ext/lorafusion; "
                        "profiler/fetch_lorafusion.sh fills it)")
    p.add_argument("--e2e", action="store_true", help="also run the full-model end-to-end check (profiler/e2e.py)")
    p.add_argument("--e2e-only", action="store_true", help="only the end-to-end check")
    p.add_argument("--no-precompile", action="store_true", help="compile the fused kernels lazily")
    p.add_argument("--random-mixes", type=int, default=0, help="random heterogeneous mixes per model "
                                                              "(0: 20 quick, 60 full, 3 tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random mixes")
    p.add_argument("--minimodel", action="store_true",
                   help="for the first model also time mixes in an 8-layer stack trained as a model (kind model)")
    p.add_argument("--e2e-start", action="store_true", help="also run the end-to-end check at the start")
    p.add_argument("--lone-ranks", default=None, metavar="R,R,..",
                   help="instead of the grid's mixes, one-adapter mixes (jobs alone) of these ranks at every "
                        "--lone-tokens count")
    p.add_argument("--lone-tokens", default="512,1024,2048,4096,8192,16384", metavar="T,T,..",
                   help="tokens per step of the --lone-ranks mixes (sequences of min(T, --lone-seq) tokens)")
    p.add_argument("--lone-seq", type=int, default=2048, help="longest sequence of a --lone-ranks mix (tokens)")
    p.add_argument("--mixes-only", action="store_true",
                   help="skip the optimizer and component grids (base curve, attention, head, full layer): "
                        "mix rows only, to add to an earlier profile of the same GPU type")
    p.add_argument("--stack", action="store_true",
                   help="also time a few mixes with the layer stacked 1x and 3x (the harness's per-call overhead)")


def run(args) -> int:
    """Run a profile; returns the exit status."""
    import torch

    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.profiler.layer import TINY, BaseWeights, shape_of

    t_start = time.time()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("profile: no CUDA device; use --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    lone = None
    if getattr(args, "lone_ranks", None):
        try:
            lone = lone_mixes([int(v) for v in args.lone_ranks.split(",") if v.strip()],
                              [int(v) for v in args.lone_tokens.split(",") if v.strip()], args.lone_seq)
        except ValueError as e:
            print(f"profile: --lone-ranks/--lone-tokens: {e}", file=sys.stderr)
            return 2
        if not lone:
            print("profile: --lone-ranks gives no mix", file=sys.stderr)
            return 2
    budget = args.budget_s or (540.0 if args.quick else 1e9)
    deadline = t_start + budget
    prov = provenance(device, args.gpu_name, mode)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = prov["gpu"]
    w = Writer(out / f"profile_{gpu.lower()}.csv", prov)
    prof = Profiler(device, w, prov, quick=args.quick or args.tiny, tiny=args.tiny)
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    bad = [p for p in plans if p not in PLAN_IMPL]
    if bad:
        print(f"profile: unknown plan(s) {', '.join(bad)}; known: {', '.join(PLAN_IMPL)}", file=sys.stderr)
        return 2
    import os

    if getattr(args, "lorafusion", None):
        os.environ["TLORA_LORAFUSION"] = str(Path(args.lorafusion).resolve())
    lf_info = None
    skipped: dict[str, int] = {}
    if "lorafusion" in plans:
        from tlora_sim.profiler.kernels.lorafusion_ext import lorafusion_available, source_dir, source_sha

        lf_info = {"available": lorafusion_available(), "dir": str(source_dir()), "source_sha": source_sha()}
        log(f"LoRAFusion kernels: {'source ' + lf_info['source_sha'][:12] if lf_info['available'] else 'absent'} "
            f"({lf_info['dir']})" + ("" if lf_info["available"] else "; plan lorafusion skipped"))
    log(f"profile {prov['profile_id']}: {prov['gpu_name']} driver {prov['driver']} torch {prov['torch']} "
        f"triton {prov['triton']} commit {prov['git_commit'][:12]} kernels {prov['kernel_hash']}; mode {mode}, "
        f"budget {budget:.0f} s")
    if args.tiny:
        models = [TINY]
        grids = {"tiny": dict(tokens=[16, 32, 64], seqs=[16, 32], batches=[1, 2], head=[16, 64], t_max=64,
                              mixes=lone or [order_members(m) for m in
                                             ([(4, 1, 16)], [(2, 1, 16), (8, 2, 16)],
                                              [(16, 1, 32), (4, 1, 16), (2, 2, 16)])])}
    else:
        models = [shape_of(get_model(m.strip())) for m in args.models.split(",") if m.strip()]
        grids = {}
        for sh in models:
            t_max = (T_MAX_QUICK if args.quick else T_MAX_FULL).get(sh.name, 16384)
            nr = args.random_mixes or (20 if args.quick else 60)
            grids[sh.name] = dict(tokens=spread(token_grid(t_max)), seqs=list(SEQS),
                                  batches=[1, 2, 4, 8, 16, 32, 64], head=spread(token_grid(min(t_max, 16384))),
                                  t_max=t_max, mixes=lone or quick_mixes(sh.name, t_max, nr, args.seed))
    meta = {"provenance": prov, "args": {k: str(v) for k, v in vars(args).items() if k != "func"}, "lorafusion": lf_info,
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    e2e_done = not (args.e2e or args.e2e_only)
    from tlora_sim.profiler.layer import choose_gqa

    meta["sdpa_gqa"] = choose_gqa(device)
    log(f"SDPA grouped-query attention: {meta['sdpa_gqa']}")
    (out / f"meta_{gpu.lower()}.json").write_text(json.dumps(meta, indent=1))
    try:
        if args.e2e_start:
            _run_e2e(args, device, prov, out, t_start, deadline, tiny=args.tiny)
        if not args.e2e_only:
            meta["ceilings"] = prof.ceilings()
            opt_cfgs = ([(5000, 14), (20000, 56)] if args.tiny else
                        [(P, nt) for nt in (448, 1792, 7168) for P in (4_000_000, 40_000_000, 300_000_000)])
            if not args.mixes_only:
                prof.optimizer(opt_cfgs, deadline)
            if "fused" in plans and prof._cuda() and not args.no_precompile:
                precompile([m for g in grids.values() for m in g["mixes"]], device)
            if "lorafusion" in plans and lf_info["available"] and prof._cuda() and not args.no_precompile:
                precompile_lorafusion([k for sh in models for k in lorafusion_compile_keys(sh.name, grids[sh.name]["mixes"])],
                                      device)
        for i, sh in enumerate(models):
            if args.e2e_only:
                break
            g = grids[sh.name]
            now = time.time()
            left = deadline - now - (0 if e2e_done else 75.0)
            wsum = sum(MODEL_WEIGHT.get(m.name, 1.0) for m in models[i:])
            mdl_deadline = now + max(0.0, left) * MODEL_WEIGHT.get(sh.name, 1.0) / wsum
            log(f"{sh.name}: budget {mdl_deadline - now:.0f} s, {len(g['mixes'])} mixes")
            try:
                base = BaseWeights(sh, device)
            except Exception as e:  # noqa: BLE001
                prof._error(f"{sh.name} weights", e, kind="noattn", model=sh.name)
                continue
            comp_deadline = now + 0.3 * (mdl_deadline - now)
            if not args.mixes_only:
                prof.noattn(base, sh.name, g["tokens"], comp_deadline)
                prof.attn(base, sh.name, g["seqs"], g["batches"], g["t_max"], comp_deadline)
                prof.head(sh, sh.name, g["head"], comp_deadline)
            if not args.tiny and not args.mixes_only:  # the full frozen layer at a few points: does base + attention add up?
                pts = [(2048, 512), (8192, 2048), (16384, 4096)]
                for T, s in pts:
                    if T <= g["t_max"]:
                        prof.noattn(base, sh.name, [T], comp_deadline, attn="sdpa", seq=s)
            n_rows = 0
            for mem in g["mixes"]:
                if time.time() > mdl_deadline:
                    log(f"{sh.name}: budget reached after {n_rows} mix rows")
                    break
                for plan in plans:
                    if (plan == "alone" and len(mem) != 1) or (plan in MULTI_ONLY_PLANS and len(mem) == 1):
                        continue  # one adapter in a loop is a job alone (the same code)
                    if plan == "lorafusion" and not lf_info["available"]:
                        skipped[plan] = skipped.get(plan, 0) + 1
                        continue
                    n_rows += prof.mix(base, sh.name, mem, plan)
            log(f"{sh.name}: {n_rows} mix rows")
            if args.minimodel and i == 0:
                n_mm = 0
                for mem in (g["mixes"][:2] if args.tiny else MINI_MIXES):
                    for plan in ("alone", "fused") if len(mem) == 1 else ("loop", "fused"):
                        n_mm += prof.mix(base, sh.name, order_members(mem), plan, stack=1)
                        n_mm += prof.minimodel(sh, sh.name, order_members(mem), plan, layers=2 if args.tiny else 8)
                log(f"{sh.name}: {n_mm} mini-model rows")
            if args.stack and not args.tiny:
                n_st = 0
                for mem in STACK_MIXES:
                    for plan in ("alone", "fused") if len(mem) == 1 else ("loop", "fused"):
                        for k in (1, 3):
                            if time.time() > mdl_deadline + 20:
                                break
                            n_st += prof.mix(base, sh.name, order_members(mem), plan, stack=k)
                log(f"{sh.name}: {n_st} stack rows")
            del base
            prof._free()
            if not e2e_done and sh.name in ("llama3-8b", "tiny"):
                _run_e2e(args, device, prov, out, t_start, deadline, tiny=args.tiny)
                e2e_done = True
        if not e2e_done:
            _run_e2e(args, device, prov, out, t_start, deadline + 75.0, tiny=args.tiny)
    finally:
        meta["errors"] = prof.errors
        meta["fused_kernel_ok"] = prof.fused_ok
        meta["not_runnable"] = dict(prof.not_runnable)
        meta["skipped"] = dict(skipped)
        meta["rows"] = w.n
        meta["elapsed_s"] = round(time.time() - t_start, 1)
        (out / f"meta_{gpu.lower()}.json").write_text(json.dumps(meta, indent=1))
        w.close()
    log(f"done: {w.n} rows in {time.time() - t_start:.0f} s, {len(prof.errors)} errors -> {out}")
    for what, counts in (("not runnable (rows written with the reason)", prof.not_runnable),
                         ("skipped (no source; no rows)", skipped)):
        if counts:
            log(f"mixes {what}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def _run_e2e(args, device, prov, out, t_start, deadline, tiny):
    from tlora_sim.profiler import e2e

    try:
        e2e.run(device, prov, out, deadline=deadline, tiny=tiny)
    except Exception as ex:  # noqa: BLE001
        log(f"e2e failed: {ex!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tlora_sim.profiler.profile", description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
