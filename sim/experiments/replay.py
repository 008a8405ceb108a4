"""One replay (trace x cluster x policy x seed -> run directory) and a comparison of policies.

A run directory holds ``config.json`` (every input, versions, cost-model identity),
``jobs.csv``, ``timeline.csv``, ``summary.json`` (deterministic: same inputs and seed give the same
bytes), ``perf.json`` (wall time, events/s, decision time: machine-dependent, kept apart) and
``figures/``. A comparison directory holds ``summary.csv`` (one row per policy), one run directory
per policy and ``figures/``.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, replace
from operator import attrgetter, mul
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.cluster import parse_cluster
from tlora_sim.sim.core.engine import Engine
from tlora_sim.sim.core.provenance import coverage, versions
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.report.rundir import (check_out_dir, staged_dir,
                                         write_csv, write_json)
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.sim.report.rundata import REFERENCE_POLICY
from tlora_sim.sim.costmodel.factory import make_cost_model
from tlora_sim.sim.core.workload import build_jobs
from tlora_sim.sim.runtime.pool import run_tasks
from tlora_sim.sim.experiments.spec import ExperimentSpec, axes, build_policy, policy_fields


ReplayConfig = ExperimentSpec
"""All inputs of one replay: the experiment spec (``sim/experiments/spec.py``) under its older name;
each field's meaning, flag and SWEEP.toml key are its ``Knob``."""


REFERENCE = REFERENCE_POLICY
"""The reference baseline every comparison and sweep runs: every job alone, FIFO with EASY
backfilling (``policies/independent.py``), unless ``--baseline`` names another."""


def effective_discipline(policy_config: dict) -> dict:
    """The priority order and backfilling rule a policy runs with, from its config dict.

    Reads the ``order``/``backfill`` fields where the config has them (``policies/discipline.py``),
    else maps the older single ``ordering`` field through ``LEGACY_ORDERING``; a config with
    neither gives None for both.

    Returns:
        ``{"order": str | None, "backfill": str | None}``.
    """
    from tlora_sim.policies.discipline import LEGACY_ORDERING

    if "order" in policy_config or "backfill" in policy_config:
        return {"order": policy_config.get("order"), "backfill": policy_config.get("backfill")}
    legacy = policy_config.get("ordering")
    if isinstance(legacy, str) and legacy in LEGACY_ORDERING:
        order, backfill = LEGACY_ORDERING[legacy]
        return {"order": order, "backfill": backfill}
    return {"order": None, "backfill": None}


def policy_options_with_discipline(policy: str, discipline: str, user: dict | None) -> dict:
    """``policy``'s options under ``discipline``: the discipline's ``order``/``backfill``
    (``policies.discipline.discipline_options``) for the keys the policy's config has, under
    the user's own options (the user's win).

    Raises:
        InputError: unknown discipline or policy.
    """
    from tlora_sim.policies.discipline import discipline_options

    extra = discipline_options(policy, discipline)
    if extra:
        fields = policy_fields(policy)  # read from the registry: the policy is not built for it
        if fields is None:
            from tlora_sim.policies.registry import make_policy

            make_policy(policy)  # an unknown name: the registry's error
        extra = {k: v for k, v in extra.items() if k in fields}
    return {**extra, **dict(user or {})}


def load_workload(cfg: ReplayConfig, frame: pd.DataFrame | None = None):
    """Read the trace (or take ``frame``, an already-read trace table), assign LoRA attributes with the
    seed, and build jobs.

    Returns:
        (jobs, cluster, cost_model, trace_frame, distribution, skipped counts).

    Raises:
        InputError: bad trace, cluster spec or distribution; with ``cfg.strict``, any documented skip.
    """
    from tlora_sim.traces import read_trace
    from tlora_sim.traces.lora import assign_lora, load_distribution

    cluster = parse_cluster(cfg.cluster)
    if frame is None:
        frame = read_trace(cfg.trace, csv_columns=cfg.csv_columns, time_unit=cfg.time_unit, time_zone=cfg.time_zone,
                           slurm_states=cfg.slurm_states, keep_states=cfg.keep_states, window=cfg.window,
                           first_jobs=cfg.first_jobs, arrival_scale=cfg.arrival_scale)
    if cfg.strict:
        cuts = ("outside_window", "after_first_jobs")  # asked for (--window, --first-jobs): not a skip
        dropped = {k: int(v) for k, v in frame.attrs.get("skipped", {}).items() if v and k not in cuts}
        if dropped:
            reason, n = next(iter(dropped.items()))
            raise InputError(f"the reader skipped {n} row(s) by the documented rule {reason!r} "
                             f"(traces/README.md); --strict makes every skip an error",
                             file=frame.attrs.get("path"), field="duration" if reason == "zero_duration" else None)
    from tlora_sim.traces.sweeps import expand_sweeps, parse_sweeps

    dist = load_distribution(cfg.lora_dist)
    from tlora_sim.sim.costmodel.models import get_model

    for model in dist.models:  # an unknown model is the distribution file's error, named with it
        try:
            get_model(model)
        except InputError as e:
            raise InputError(e.message, file=cfg.lora_dist if Path(cfg.lora_dist).is_file() else None,
                             field=f"models.{model}") from None
    from tlora_sim.sim.costmodel.models import MODELS
    from tlora_sim.traces.lora import check_models

    check_models(frame, list(MODELS))  # base models the trace names (an operator's export)
    rng = np.random.default_rng(cfg.seed)
    frame = assign_lora(frame, dist, rng)
    sweeps = parse_sweeps(cfg.sweeps)
    if sweeps is not None:
        frame = expand_sweeps(frame, rng, sweeps[0], sweeps[1], dist.ranks)
    cost_model = make_cost_model(cfg.cost_model, cluster.gpu.name, getattr(cfg, "artifact", None))
    jobs, skipped = build_jobs(frame, cluster, cost_model, strict=cfg.strict)
    skipped = {**dict(frame.attrs.get("skipped", {})), **skipped}
    return jobs, cluster, cost_model, frame, dist, skipped


def replay(cfg: ReplayConfig, out_dir: str | Path, *, progress: bool = True, plots: bool = True,
           position: int = 0, check_invariants: bool = True, policy: Any = None,
           listeners: Sequence[Any] = (), force: bool = False,
           on_summary: Callable[[dict], None] | None = None) -> dict:
    """Simulate one configuration and write its run directory, as a unit: the files are written
    into a hidden sibling directory that replaces ``out_dir`` only once the run is complete
    (``rundir.staged_dir``), so an interrupted or failed run leaves the previous directory as it
    was. ``out_dir`` holding files is refused unless ``force`` (``rundir.check_out_dir``).

    ``listeners``: ``EngineListener`` objects the engine tells of every state change
    (``sim/core/listeners.py``; ``bench/engine_floor.py`` counts re-times with one).

    ``check_invariants`` (default True) checks ``tlora_sim.sim.core.invariants`` while simulating; switch it off
    for benchmarks only (results are identical, the checks cost a few per cent).

    ``on_summary(summary)`` is called once the numbers are written, before any figure is drawn.

    ``policy``: an already-built policy object to simulate instead of the registry's
    ``cfg.policy`` (``bench/engine_floor.py`` passes one that records or replays decisions); the
    run directory still names ``cfg.policy``.

    Returns:
        The summary dict (also written to ``summary.json``).

    Raises:
        InputError: bad input, or an ``out_dir`` that may not be written (nothing is written).
        sim.engine.InvariantError: an impossible state (nothing is written).
    """
    out = check_out_dir(out_dir, force=force)
    with staged_dir(out) as stage:
        return _replay_into(cfg, stage, progress=progress, plots=plots, position=position,
                            check_invariants=check_invariants, policy=policy, listeners=listeners,
                            on_summary=on_summary)


def _replay_into(cfg: ReplayConfig, out: Path, *, progress: bool, plots: bool, position: int,
                 check_invariants: bool, policy: Any, listeners: Sequence[Any],
                 on_summary: Callable[[dict], None] | None = None) -> dict:
    """``replay`` writing straight into the directory ``out`` (the caller stages it)."""
    result = simulate(cfg, progress=progress, position=position, check_invariants=check_invariants, policy=policy,
                      listeners=listeners)
    write_run(out, result, plots=False)
    if on_summary is not None:  # the numbers are printed before any figure is drawn
        on_summary(result["summary"])
    if plots:
        from tlora_sim.sim.report.plots import plot_run

        plot_run(out)
    return result["summary"]


def simulate(cfg: ReplayConfig, *, frame: pd.DataFrame | None = None, progress: bool = False, position: int = 0,
             check_invariants: bool = True, policy: Any = None, listeners: Sequence[Any] = ()) -> dict:
    """Simulate one configuration in memory; nothing is written (``write_run`` writes it).

    Args:
        cfg: the inputs; ``cfg.trace`` names the trace (read unless ``frame`` is given).
        frame: an already-read trace table (``traces.frame`` schema) to simulate instead of reading
            ``cfg.trace`` (the Python API's DataFrame traces); window options are not applied to it again.
        progress, position, check_invariants, policy, listeners: as for :func:`replay`.

    Returns:
        dict with ``config`` (what ``config.json`` holds), ``jobs``, ``timeline`` (DataFrames of
        ``jobs.csv``, ``timeline.csv``), ``tenants`` (``tenants.csv``'s table, or None where the trace
        has no tenants), ``summary`` (``summary.json``) and ``perf`` (``perf.json``).

    Raises:
        InputError: bad input. sim.engine.InvariantError: an impossible state.
    """
    from tlora_sim.policies.registry import config_of, load_policy_module

    for module in cfg.policy_modules:
        load_policy_module(module)
    if policy is None:
        policy = build_policy(cfg)  # once; its options price the engine's regroup pause (spec.run_policy_options)
    if cfg.early_exit:
        from tlora_sim.policies.early_exit import WithEarlyExit

        policy = WithEarlyExit(policy)
    jobs, cluster, cost_model, frame, dist, skipped = load_workload(cfg, frame=frame)
    config = {
        "inputs": cfg.to_json(), "axes": axes(cfg, cluster.total_gpus), "cluster": cluster.spec, "gpu": asdict(cluster.gpu),
        "policy": cfg.policy, "policy_config": config_of(policy), "plan": policy.plan,
        "discipline": {"name": cfg.discipline, **effective_discipline(config_of(policy))},
        "reference": cfg.reference,
        "trace": cfg.trace, "seed": cfg.seed, "lora_distribution": dist.to_dict(),
        "cost_model": cost_model.describe(), "versions": versions(), "jobs_in_trace": int(len(frame)),
    }
    bar = _progress_bar(jobs, cfg.policy, position) if progress else None
    engine = Engine(jobs, cluster, cost_model, policy, regroup_pause_s=cfg.regroup_pause_s,
                    progress=(lambda now: bar.update(min(now / 3600.0, bar.total) - bar.n)) if bar else None,
                    check_invariants=check_invariants, listeners=listeners)
    try:
        res = engine.run()
    finally:
        if bar is not None:
            bar.close()
    jobs_df = metrics.jobs_table(res)
    if "attrs_from_trace" in frame.columns:  # which LoRA attributes each job took from the trace
        jobs_df["attrs_from_trace"] = jobs_df["job_id"].map(dict(zip(frame["job_id"], frame["attrs_from_trace"])))
    flops = sum(map(mul, map(attrgetter("steps_trained"), res.records), engine.member_flops))  # in job order
    from tlora_sim.sim.experiments import fidelity

    described = cost_model.describe()
    shares, total = fidelity.gpu_time_shares(jobs_df, fidelity.job_reasons(cost_model, jobs, cluster.gpu.name,
                                                                           cfg.cost_model))
    summary = {"policy": cfg.policy, "trace": cfg.trace, "cluster": cluster.spec, "seed": cfg.seed,
               **metrics.summarize(jobs_df, res, cluster, flops), "skipped": skipped,
               **coverage(len(jobs), skipped, described),
               "cost_model": described.get("artifact") or described.get("name"),
               "extrapolated_gpu_time_share_total": total, "extrapolated_gpu_time_share": shares}
    summary["host_bound_gpu_time_share"] = fidelity.host_bound_gpu_time_share(cost_model, jobs, cluster.gpu.name, jobs_df)
    validation = fidelity.validation_error(cluster.gpu.name) if described.get("kind") == "profiled" else None
    if validation is not None:
        summary["validation"] = validation
    perf = {k: summary.pop(k) for k in metrics.PERF_KEYS}
    timeline_df = metrics.timeline_table(res, cluster)
    from tlora_sim.sim.core import fairness

    tenants = fairness.tenant_table(jobs_df, timeline_df, cluster.total_gpus)
    summary.update(fairness.fairness_summary(jobs_df, timeline_df, cluster.total_gpus, tenants))
    perf = {**perf, "jobs": len(jobs), "machine": platform.machine(), "python": platform.python_version(),
            "invariants_checked": check_invariants}
    return {"config": config, "jobs": jobs_df, "timeline": timeline_df,
            "tenants": tenants if (tenants["tenant"] != "").any() else None, "summary": summary, "perf": perf}


def write_run(out: Path, result: dict, *, plots: bool = True) -> None:
    """Write :func:`simulate`'s result as a run directory's files into ``out`` (an existing, staged
    directory: the caller makes the write a unit, ``rundir.staged_dir``), then its figures."""
    files = RunDir(out)
    write_json(files.config, result["config"])
    write_csv(files.jobs, result["jobs"])
    write_csv(files.timeline, result["timeline"])
    if result.get("tenants") is not None:  # per-tenant table where the trace has tenants
        write_csv(files.root / TENANTS_CSV, result["tenants"])
    write_json(files.summary, result["summary"])
    write_json(files.perf, result["perf"])
    if plots:
        from tlora_sim.sim.report.plots import plot_run

        plot_run(out)


TENANTS_CSV = "tenants.csv"
"""Per-tenant table of a run directory (``sim/core/fairness.py``), where the trace has tenants."""


def coverage_line(policy: str, summary: dict) -> str:
    """``kept N of M jobs (skipped: memory a, ...); X% of GPU-time on extrapolated step times``, the
    line every replay and comparison prints per policy (also under ``-q``: it is part of the answer;
    the fidelity warning that explains the share is printed apart, once, by the CLI)."""
    sk = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("skipped", {}).items()) if v) or "none"
    share = summary.get("extrapolated_gpu_time_share_total", summary["extrapolated_share"])
    return (f"{policy}: kept {summary['kept_jobs']} of {summary['input_jobs']} jobs (skipped: {sk}); "
            f"{share:.0%} of GPU-time on extrapolated step times "
            f"({summary['extrapolated_share']:.0%} of distinct cost-model predictions)")


def _progress_bar(jobs, label: str, position: int):
    from tqdm import tqdm

    horizon_h = (jobs[-1].submit_time_s if jobs else 0.0) / 3600.0
    return tqdm(total=round(horizon_h, 1), unit="sim-h", desc=f"{label:>12}", position=position, leave=True,
                mininterval=0.5, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} simulated h "
                                            "[{elapsed}<{remaining}]")


def _replay_row(cfg: ReplayConfig, out: Path, progress: bool, position: int, check: bool,
                policy: Any = None) -> dict:
    """One policy of a comparison (a pool task), simulating ``policy`` (built by ``compare``; None:
    built here); its figures are the comparison's (``plot OUT/<policy>`` draws the run's own)."""
    return _replay_into(cfg, out, progress=progress, plots=False, position=position, check_invariants=check,
                        policy=policy, listeners=())


def _shippable(policy: Any) -> Any:
    """``policy`` where it pickles (to a worker process), else None (the worker builds its own)."""
    import pickle

    try:
        pickle.dumps(policy)
    except Exception:  # noqa: BLE001 - a plug-in holding a lambda, a lock, an open file ...
        return None
    return policy


def with_reference(policies: Sequence[str], reference: str = REFERENCE) -> tuple[list[str], bool]:
    """``policies`` with ``reference`` first when it is not among them.

    Returns:
        (the policy list, whether the reference was added).
    """
    pols = list(dict.fromkeys(policies))
    if reference in pols:
        return pols, False
    return [reference, *pols], True


def compare(base: ReplayConfig, policies: list[str], out_dir: str | Path, *, workers: int = 1,
            progress: bool = True, policy_options: dict[str, dict] | None = None,
            check_invariants: bool = True, force: bool = False, reference: str = REFERENCE,
            discipline: str = "default", plots: bool = True,
            on_table: Callable[[pd.DataFrame, dict], None] | None = None) -> pd.DataFrame:
    """Replay ``base`` under each policy; write ``OUT/summary.csv``, ``OUT/<policy>/`` and ``OUT/figures/``.

    The reference baseline ``reference`` (default ``independent-backfill``) is run too when it is
    not among ``policies`` (first). Every policy runs under ``discipline``
    (``policies/discipline.py``: ``default`` each policy's own order with the reference's EASY
    backfilling, ``shared`` also the reference's FIFO order, ``native`` each system's published
    discipline): its ``order``/``backfill`` options are merged under the user's
    ``policy_options`` (only those the policy's config has). Each run's ``config.json`` records
    the discipline, the effective order and backfilling, and the reference.

    ``summary.csv`` and every policy's ``summary.json`` carry the speed-ups against the reference
    (``sim/report/tables.py`` ``SPEEDUP_COLUMNS``: 1.0 for the reference itself) and
    ``reference``. ``on_table(table, summaries)`` is called (summaries: policy -> its
    ``summary.json`` dict) once the numbers are written, before any figure
    is drawn (the CLI prints the numbers there); ``plots=False`` draws none (no ``figures/``).
    The figures are PNGs (``COMPARE_FORMATS``; ``tlora-sim plot OUT`` adds the PDFs).

    The comparison directory is written as a unit, as ``replay``'s run directory is: it replaces
    ``out_dir`` only when every policy's run, the table and the figures are complete; ``out_dir``
    holding files is refused unless ``force``.

    With ``workers`` > 1 the policies run in worker processes; an error or interrupt in any of them
    stops the others (each leaves only complete files) and is raised here.

    Returns:
        The summary table (one row per policy, the reference first, then the given order).

    Raises:
        InputError: unknown policy, option or discipline, before any simulation starts.
    """
    from tlora_sim.policies.registry import load_policy_module

    final = check_out_dir(out_dir, force=force, what="comparison")
    for module in base.policy_modules:
        load_policy_module(module)
    policies, _ = with_reference(policies, reference)
    cfgs = [replace(base, policy=p, discipline=discipline, reference=reference,
                    policy_options=policy_options_with_discipline(p, discipline, (policy_options or {}).get(p)))
            for p in policies]
    # each policy built once, here: a bad name, option or discipline fails before any simulation starts
    built = [build_policy(c) for c in cfgs]
    with staged_dir(final) as out:
        return _compare_into(cfgs, out, workers, progress, check_invariants, reference, plots, on_table, built)


def _compare_into(cfgs: list[ReplayConfig], out: Path, workers: int, progress: bool,
                  check_invariants: bool, reference: str, plots: bool,
                  on_table: Callable[[pd.DataFrame, dict], None] | None, built: list) -> pd.DataFrame:
    """``compare`` writing straight into ``out`` (the caller stages it), simulating the ``built``
    policies (one per config; sent to worker processes where they pickle)."""
    from tlora_sim.sim.report.tables import speedups

    pooled = workers > 1 and len(cfgs) > 1
    tasks = [(c, out / c.policy, progress, i, check_invariants, _shippable(p) if pooled else p)
             for i, (c, p) in enumerate(zip(cfgs, built))]
    rows = run_tasks(_replay_row, tasks, workers)
    broken = [c.policy for c, r in zip(cfgs, rows) if r.get("error") == "BrokenProcessPool"]
    if broken:
        raise RuntimeError(f"the worker running {', '.join(broken)} died (killed, or out of memory)")
    table = pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, (dict, list))}
                          | {"skipped": sum(r["skipped"].values())} for r in rows])
    table = speedups(table, reference)
    first = ["policy"] + metrics.SUMMARY_KEYS
    table = table[first + [c for c in table.columns if c not in first]]
    write_csv(RunDir(out).compare_summary, table)
    from tlora_sim.sim.report.tables import SPEEDUP_COLUMNS

    summaries = {}
    for cfg, r, sp in zip(cfgs, rows, table.to_dict("records")):  # each run's summary.json: its speed-ups
        summaries[cfg.policy] = {**r, "reference": reference, **{c: sp[c] for c in SPEEDUP_COLUMNS if c in sp}}
        write_json(RunDir(out / cfg.policy).summary, summaries[cfg.policy])
    if on_table is not None:
        on_table(table, summaries)
    if plots:  # PNG only: the PDFs double the figures' time (bench/figures.py); `tlora-sim plot OUT` adds them
        from tlora_sim.sim.report.plots import plot_compare

        plot_compare(out, formats=COMPARE_FORMATS)
    return table


COMPARE_FORMATS = ("png",)
"""Figure formats ``compare`` draws (PNG: a figure costs about half its PNG + PDF time, measured in
``bench/figures.py``); ``tlora-sim plot OUT`` redraws them as PDF and PNG."""
