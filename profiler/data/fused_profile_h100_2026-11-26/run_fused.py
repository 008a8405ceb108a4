"""Fused-plan-only profile of the four catalog models (2026-11-26): the mix rows the cost model's
`fused` family is fitted on (step and host time), without the component grids (base curve,
attention, head, optimizer), which the shipped artifact keeps from its earlier profiles.

Per model, two interleaved lists of mixes (so a run cut short by its budget still spans both):
  * the mixes of the earlier --quick profiles (`quick_mixes(model, t_max, 20, seed 0)`, uniform and
    random heterogeneous, up to 16k-32k tokens): the same mixes as profile_h100.csv's fused rows;
  * small, host-bound mixes (seeded): 1-16 adapters, ranks 2-128, 1-3 sequence-length groups,
    at most 4,096 tokens (8,192 for 10-16 adapters of 512).
For llama3-8b it first times MINI_MIXES as one layer and inside an 8-layer model (kind `model`),
the pairs fit.py's `call_overhead` takes the harness's per-call overhead from.

Uses profiler/measure.py's Profiler unchanged (same timing as `tlora-sim profile --quick`).
Run from the repository root with tlora_sim importable:
    python3 profiler/data/fused_profile_h100_2026-11-26/run_fused.py --out OUT --budget-s 300
    TRITON_INTERPRET=1 python3 .../run_fused.py --device cpu --tiny --out /tmp/p   # dry run
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from tlora_sim.profiler.grid import MINI_MIXES, MODEL_WEIGHT, RANKS, T_MAX_QUICK, mix_key, order_members, precompile, quick_mixes
from tlora_sim.profiler.measure import Profiler
from tlora_sim.profiler.provenance import Writer, log, provenance

MODELS = ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b")


def small_mixes(model: str, n_mix: int, seed: int = 26) -> list:
    rng = random.Random(f"{model}-{seed}")
    out, seen = [], set()
    fixed = [[(16, 1, 512)] * n for n in (1, 2, 4, 8, 16)] + [[(16, 1, 1024)] * 2]
    for m in fixed:
        out.append(m)
        seen.add(mix_key(m))
    tries = 0
    while len(out) < n_mix and tries < 10000:
        tries += 1
        n = rng.choice((1, 2, 3, 4, 5, 6, 8, 10, 12, 16))
        cap = 4096 if n < 10 else 8192
        shapes = [(1, 512), (1, 1024), (2, 512), (1, 2048)] if n <= 4 else [(1, 512), (1, 1024)]
        mem = [(rng.choice(RANKS), *rng.choice(shapes)) for _ in range(n)]
        if sum(b * s for _, b, s in mem) > cap or mix_key(mem) in seen:
            continue
        seen.add(mix_key(mem))
        out.append(mem)
    return [order_members(m) for m in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-minimodel", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    deadline = t0 + a.budget_s
    from tlora_sim.profiler.layer import TINY, BaseWeights, shape_of
    from tlora_sim.sim.costmodel.models import get_model

    prov = provenance(a.device, "auto", "tiny" if a.tiny else "quick")
    a.out.mkdir(parents=True, exist_ok=True)
    w = Writer(a.out / f"profile_{prov['gpu'].lower()}.csv", prov)
    prof = Profiler(a.device, w, prov, quick=True, tiny=a.tiny)
    log(f"fused profile {prov['profile_id']}: {prov['gpu_name']} driver {prov['driver']} torch {prov['torch']} "
        f"triton {prov['triton']} commit {prov['git_commit']} kernels {prov['kernel_hash']}, budget {a.budget_s:.0f} s")
    if a.tiny:
        shapes = [TINY]
        lists = {"tiny": [order_members(m) for m in ([(4, 1, 16)], [(2, 1, 16), (8, 2, 16)], [(16, 1, 32), (4, 1, 16)])]}
    else:
        shapes = [shape_of(get_model(m)) for m in a.models.split(",")]
        lists = {}
        for sh in shapes:
            q, s = quick_mixes(sh.name, T_MAX_QUICK[sh.name], 20, 0), small_mixes(sh.name, 24)
            mixed, seen = [], set()
            for i in range(max(len(q), len(s))):
                for lst in (s, q):
                    if i < len(lst) and mix_key(lst[i]) not in seen:
                        seen.add(mix_key(lst[i]))
                        mixed.append(lst[i])
            lists[sh.name] = mixed
    meta = {"provenance": prov, "args": {k: str(v) for k, v in vars(a).items()},
            "mixes_planned": {k: len(v) for k, v in lists.items()}}
    counts = {}
    try:
        meta["ceilings"] = prof.ceilings()
        if prof._cuda():
            precompile([m for v in lists.values() for m in v] + [order_members(m) for m in MINI_MIXES], a.device)
        for i, sh in enumerate(shapes):
            now = time.time()
            wsum = sum(MODEL_WEIGHT.get(x.name, 1.0) for x in shapes[i:])
            mdl_deadline = now + max(0.0, deadline - now) * MODEL_WEIGHT.get(sh.name, 1.0) / wsum
            base = BaseWeights(sh, a.device)
            n_mm = 0
            if i == 0 and not a.no_minimodel:
                for mem in (lists[sh.name][:2] if a.tiny else MINI_MIXES):
                    if time.time() > now + 0.25 * (mdl_deadline - now):
                        break
                    n_mm += prof.mix(base, sh.name, order_members(mem), "fused", stack=1)
                    n_mm += prof.minimodel(sh, sh.name, order_members(mem), "fused", layers=2 if a.tiny else 8)
            n = 0
            for mem in lists[sh.name]:
                if time.time() > mdl_deadline:
                    break
                n += prof.mix(base, sh.name, mem, "fused")
            counts[sh.name] = {"mix": n, "of": len(lists[sh.name]), "minimodel_rows": n_mm}
            log(f"{sh.name}: {n} of {len(lists[sh.name])} mixes, {n_mm} mini-model rows, "
                f"{time.time() - now:.0f} s")
            del base
            prof._free()
    finally:
        meta.update(counts=counts, errors=prof.errors, fused_kernel_ok=prof.fused_ok, rows=w.n,
                    elapsed_s=round(time.time() - t0, 1))
        (a.out / f"meta_{prov['gpu'].lower()}.json").write_text(json.dumps(meta, indent=1))
        w.close()
    log(f"done: {w.n} rows in {time.time() - t0:.0f} s, {len(prof.errors)} errors")


if __name__ == "__main__":
    main()
