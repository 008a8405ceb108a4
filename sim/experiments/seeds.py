"""Several seeds of one comparison, with means and 95% confidence intervals.

A seed redraws everything random in a replay (``ReplayConfig.seed``: the LoRA attributes, the
sweep expansion and its loss curves, and, in ``synthetic:`` specs that do not fix their own
``seed=``, the synthetic trace). ``compare_seeds`` runs the comparison once per seed into
``OUT/seed-<s>/`` and writes ``OUT/summary.csv``: one row per policy, each metric's mean over the
seeds and its 95% confidence half-width ``<metric>_ci95`` (Student's t with n-1 degrees of
freedom: ``t_{0.975, n-1} x s / sqrt(n)``), plus ``seeds``; ``OUT/summary_by_seed.csv`` keeps
every seed's row.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv
from tlora_sim.sim.report.stats import ci95
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

MAX_SEEDS = 1000
MAX_SEED = 2**63 - 1
"""The largest seed: seeds are written as int64 columns (``summary_by_seed.csv``, ``jobs.csv``)."""


def parse_seeds(spec: str) -> list[int]:
    """``0-4`` / ``0,3,7`` / ``1-3,9`` -> sorted distinct seeds (each in 0..``MAX_SEED``).

    Raises:
        InputError: malformed, negative, empty (``--seeds=''``), above ``MAX_SEED`` (2^63 - 1), or
            more than ``MAX_SEEDS`` seeds; checked before any run.
    """
    out: set[int] = set()
    if spec is None or not str(spec).strip():
        raise InputError("expected seeds like 0-4 or 0,3,7, got an empty list", field="--seeds")
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise InputError(f"expected seeds like 0-4 or 0,3,7, got {spec!r}", field="--seeds")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi > MAX_SEED or lo > MAX_SEED:
            raise InputError(f"seed {max(lo, hi)} is above the largest seed 2^63-1 = {MAX_SEED}", field="--seeds")
        if hi < lo or hi - lo + 1 > MAX_SEEDS:
            raise InputError(f"bad seed range {part!r} (low-high, at most {MAX_SEEDS} seeds)", field="--seeds")
        out.update(range(lo, hi + 1))
    if not out or len(out) > MAX_SEEDS:
        raise InputError(f"between 1 and {MAX_SEEDS} seeds expected, got {len(out)}", field="--seeds")
    return sorted(out)


def seed_spec(trace: str, seed: int) -> str:
    """The trace spec a seed runs: a ``synthetic:`` spec without its own ``seed=`` gets this seed."""
    if trace.startswith("synthetic:") and "seed=" not in trace:
        opts = trace[len("synthetic:"):]
        return f"synthetic:{opts + ',' if opts and opts != 'default' else ''}seed={seed}"
    return trace


def aggregate(by_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean and ``_ci95`` of every numeric column per policy (policy order kept), plus ``seeds``."""
    rows = []
    numeric = [c for c in by_seed.columns if c not in ("policy", "seed") and pd.api.types.is_numeric_dtype(by_seed[c])]
    for pol in dict.fromkeys(by_seed["policy"]):
        part = by_seed[by_seed["policy"] == pol]
        row = {"policy": pol, "seeds": len(part)}
        for c in numeric:
            row[c] = float(part[c].mean())
            row[f"{c}_ci95"] = ci95(part[c].to_numpy())
        rows.append(row)
    return pd.DataFrame(rows)


def compare_seeds(base, policies: list[str], out_dir: str | Path, seeds: list[int], *, workers: int = 1,
                  progress: bool = True, policy_options: dict[str, dict] | None = None,
                  check_invariants: bool = True, force: bool = False, reference: str | None = None,
                  discipline: str = "default", plots: bool = True, on_table=None) -> pd.DataFrame:
    """Run ``compare`` for every seed into ``OUT/seed-<s>/`` and write the aggregated tables (see the
    module docstring). The whole directory is written as a unit. Every seed's comparison runs the
    reference (``replay.compare``); the speed-ups (``sim/report/tables.py``) are taken per seed and
    then averaged with their 95% CI like every other metric.

    ``on_table(aggregated, summaries)`` is called once the tables are written, before the figure
    (summaries: ``"<policy> (seed s)"`` -> that run's summary); ``plots=False`` draws none.

    Returns:
        The aggregated table.
    """
    from tlora_sim.sim.experiments.replay import REFERENCE, compare

    reference = reference or REFERENCE
    final = check_out_dir(out_dir, force=force, what="comparison")
    with staged_dir(final) as out:
        tables = []
        summaries: dict[str, dict] = {}
        for s in seeds:
            cfg = replace(base, seed=s, trace=seed_spec(base.trace, s))

            def keep(_t, sums, s=s):
                summaries.update({f"{p} (seed {s})": v for p, v in sums.items()})

            t = compare(cfg, policies, out / f"seed-{s}", workers=workers, progress=progress,
                        policy_options=policy_options, check_invariants=check_invariants, reference=reference,
                        discipline=discipline, plots=False, on_table=keep)
            tables.append(t.assign(seed=s))
        by_seed = pd.concat(tables, ignore_index=True)
        write_csv(out / RunDir.SEEDS_TABLE, by_seed)
        agg = aggregate(by_seed)
        agg["reference"] = reference
        write_csv(out / RunDir.COMPARE_SUMMARY, agg)
        if on_table is not None:
            on_table(agg, summaries)
        if plots:
            from tlora_sim.sim.report.sweep_report import plot_seeds

            plot_seeds(out)
    return agg
