"""The decomposed contest (issue 40): how much of a grouping policy's gain is the kernel, the queue
order and the grouping, as one comparison.

For each grouping policy P the ladder is four runs of one trace, each adding one axis:

1. ``eager-alone``: ``independent-backfill`` (every job alone, eager per-job LoRA, FIFO + EASY);
2. ``fused-alone``: ``independent-fused`` (every job alone on the fused kernel, FIFO + EASY);
3. ``+order``: ``P-nogroup`` (P's priority order and backfilling, every job alone in P's lone-job
   plan; P's ``--option`` values are given to it too);
4. ``+grouping``: P itself.

``summary.csv`` keeps compare's columns and adds, per run, ``ladder_step``, ``ladder_of`` (the
grouping policies whose ladder it is on), ``step_speedup`` (the previous step's average JCT over
this one's; 1 for the first step), ``total_speedup`` (``eager-alone``'s average JCT over this
one's) and ``step_throughput_x`` / ``total_throughput_x`` (the same for trained-token throughput,
which says more where the baseline's queue explodes). ``decompose.csv`` holds the ladders
themselves, one row per (policy, step). With several seeds the ratios are of the seed means.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tlora_sim.traces.errors import InputError

EAGER, FUSED = "independent-backfill", "independent-fused"
STEPS = ("eager-alone", "fused-alone", "+order", "+grouping")
"""The ladder's steps, in order."""

LADDER_FILE = "decompose.csv"


def ladder_runs(policies: list[str]) -> list[str]:
    """The runs a decomposition of ``policies`` needs, in order, each once: the two alone
    baselines, then ``P-nogroup`` and ``P`` for each grouping policy P.

    Raises:
        InputError: a policy without grouping (no ``-nogroup`` ablation) or one of the baselines.
    """
    from tlora_sim.policies.registry import make_policy

    out = [EAGER, FUSED]
    for p in policies:
        if p in (EAGER, FUSED) or p.endswith("-nogroup"):
            raise InputError(f"--decompose takes grouping policies (their ladders include the baselines "
                             f"and the -nogroup ablation), got {p!r}", field="--policies")
        make_policy(p + "-nogroup")  # InputError: no grouping to turn off
        out += [p + "-nogroup", p]
    return list(dict.fromkeys(out))


def ladder_options(policies: list[str], options: dict[str, dict] | None) -> dict[str, dict]:
    """The user's ``--option`` values per run, each grouping policy's given to its ``-nogroup``
    step as well (its own values win)."""
    options = {k: dict(v) for k, v in (options or {}).items()}
    for p in policies:
        mine = {k: v for k, v in options.get(p, {}).items() if k != "grouping"}
        options[p + "-nogroup"] = {**mine, **options.get(p + "-nogroup", {})}
    return options


def ladder_table(summary: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """One row per (grouping policy, step) from a comparison's summary table (one row per run,
    with ``policy``, ``avg_jct_s`` and ``throughput_tokens_per_s``).

    Returns:
        Columns ``policy``, ``step``, ``run``, ``avg_jct_s``, ``throughput_tokens_per_s``,
        ``step_speedup``, ``total_speedup``, ``step_throughput_x``, ``total_throughput_x``.
    """
    by = summary.set_index("policy")
    rows = []
    for p in policies:
        runs = [EAGER, FUSED, p + "-nogroup", p]
        jct = [float(by.loc[r, "avg_jct_s"]) for r in runs]
        thr = [float(by.loc[r, "throughput_tokens_per_s"]) for r in runs]
        for i, (step, r) in enumerate(zip(STEPS, runs)):
            rows.append({"policy": p, "step": step, "run": r, "avg_jct_s": jct[i], "throughput_tokens_per_s": thr[i],
                         "step_speedup": jct[i - 1] / jct[i] if i else 1.0, "total_speedup": jct[0] / jct[i],
                         "step_throughput_x": thr[i] / thr[i - 1] if i else 1.0,
                         "total_throughput_x": thr[i] / thr[0]})
    return pd.DataFrame(rows)


def annotate(summary: pd.DataFrame, ladder: pd.DataFrame) -> pd.DataFrame:
    """``summary`` with each run's step and speed-ups (module docstring); a baseline shared by
    several ladders carries the same numbers for all."""
    first = ladder.drop_duplicates("run").set_index("run")
    of = ladder.groupby("run", sort=False)["policy"].agg(lambda s: ";".join(s))
    out = summary.copy()
    for col in ("step", "step_speedup", "total_speedup", "step_throughput_x", "total_throughput_x"):
        out["ladder_step" if col == "step" else col] = out["policy"].map(first[col])
    out["ladder_of"] = out["policy"].map(of)
    return out


def compare_decomposed(base, policies: list[str], out_dir: str | Path, *, seeds: list[int] | None = None,
                       policy_options: dict[str, dict] | None = None, **kw) -> pd.DataFrame:
    """Run the ladders of ``policies`` as one comparison into ``out_dir`` (``compare``, or
    ``compare_seeds`` with ``seeds``), then add the ladder columns to its ``summary.csv`` and
    write ``decompose.csv``.

    Args:
        base: the ``ReplayConfig`` of the comparison; policies: grouping policy names;
        kw: ``compare``'s keywords (workers, progress, check_invariants, force).

    Returns:
        The ladder table (``ladder_table``).

    Raises:
        InputError: a policy that does not group (``ladder_runs``), or compare's own errors.
    """
    from tlora_sim.sim.report.rundir import write_csv
    from tlora_sim.sim.report.rundir_layout import RunDir

    runs = ladder_runs(policies)
    opts = ladder_options(policies, policy_options)
    if seeds:
        from tlora_sim.sim.experiments.seeds import compare_seeds

        table = compare_seeds(base, runs, out_dir, seeds, policy_options=opts, **kw)
    else:
        from tlora_sim.sim.experiments.replay import compare

        table = compare(base, runs, out_dir, policy_options=opts, **kw)
    ladder = ladder_table(table, policies)
    out = Path(out_dir)
    write_csv(out / RunDir.COMPARE_SUMMARY, annotate(table, ladder))
    write_csv(out / LADDER_FILE, ladder)
    return ladder


def format_ladder(ladder: pd.DataFrame) -> str:
    """The ladder as the printed table: average JCT in hours, each step's and the total speed-up."""
    t = ladder.assign(avg_jct_h=ladder["avg_jct_s"] / 3600.0)
    cols = ["policy", "step", "run", "avg_jct_h", "step_speedup", "total_speedup", "step_throughput_x",
            "total_throughput_x"]
    return t[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}")
