"""One replay (trace x cluster x policy x seed -> run directory) and a comparison of policies.

A run directory holds ``config.json`` (every input, versions, cost-model identity),
``jobs.csv``, ``timeline.csv``, ``summary.json`` (deterministic: same inputs and seed give the same
bytes), ``perf.json`` (wall time, events/s, decision time: machine-dependent, kept apart) and
``figures/``. A comparison directory holds ``summary.csv`` (one row per policy), one run directory
per policy and ``figures/``.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
from dataclasses import asdict, dataclass, field
from operator import attrgetter, mul
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.cluster import parse_cluster
from tlora_sim.sim.core.engine import Engine
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.report.rundir import (check_out_dir, staged_dir,
                                         write_csv, write_json)
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.sim.costmodel.factory import make_cost_model
from tlora_sim.sim.core.workload import build_jobs
from tlora_sim.sim.experiments.pool import run_tasks


@dataclass(frozen=True)
class ReplayConfig:
    """All inputs of one replay.

    Attributes:
        trace: trace spec ``FORMAT:PATH`` (``tlora_sim.traces.read_trace``).
        policy: registered policy name.
        cluster: ``NODESxGPUSxTYPE``.
        seed: seed of the LoRA attribute assignment (``numpy.random.default_rng``).
        lora_dist: LoRA attribute distribution name or JSON path (``tlora_sim.traces.lora``).
        policy_options: overrides of the policy's config dataclass.
        regroup_pause_s: pause when a running group changes membership (s).
        csv_columns: column mapping for the ``csv`` format.
        time_unit: time unit of the ``csv`` format (s, ms, min, h).
        strict: turn documented skips into errors: a job the cluster cannot host (``oversized``,
            ``memory``) and rows a trace reader dropped by a documented rule (``zero_duration``,
            ``duplicate``).
        sweeps: ``FRACTION:K1,K2`` sweep families (ALTO workloads), or None.
        cost_model: ``auto``, ``profiled`` or ``roofline``.
        time_zone: IANA zone of naive timestamps (``csv`` and ``slurm`` formats; None: UTC).
        slurm_states: job states kept from a ``slurm`` export (None: ``traces.slurm.DEFAULT_STATES``).
        artifact: a profiled cost-model artifact file (``--artifact``) instead of the shipped one.
        early_exit: run the shared early-exit rule on sweep families with the policy
            (``policies/early_exit.py``); stopped configurations are reported apart.
        policy_modules: policy modules (``.py`` paths or dotted names) imported before the policy
            is built (``tlora_sim.policies.registry.load_policy_module``), in every process that
            runs this configuration.
    """

    trace: str
    policy: str
    cluster: str = "16x8xH100"
    seed: int = 0
    lora_dist: str = "tlora"
    policy_options: dict[str, Any] = field(default_factory=dict)
    regroup_pause_s: float = 30.0
    csv_columns: dict[str, str] | None = None
    time_unit: str = "s"
    strict: bool = False
    sweeps: str | None = None
    cost_model: str = "auto"
    policy_modules: tuple[str, ...] = ()
    early_exit: bool = False
    time_zone: str | None = None
    slurm_states: str | None = None
    artifact: str | None = None  # a profiled artifact file (``--artifact``), else the shipped one


def versions() -> dict[str, str]:
    """Versions of the interpreter and the libraries that shape results."""
    out = {"python": platform.python_version()}
    for pkg in ("tlora-sim", "simpy", "numpy", "pandas"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def load_workload(cfg: ReplayConfig):
    """Read the trace, assign LoRA attributes with the seed, and build jobs.

    Returns:
        (jobs, cluster, cost_model, trace_frame, distribution, skipped counts).

    Raises:
        InputError: bad trace, cluster spec or distribution; with ``cfg.strict``, any documented skip.
    """
    from tlora_sim.traces import read_trace
    from tlora_sim.traces.lora import assign_lora, load_distribution

    cluster = parse_cluster(cfg.cluster)
    frame = read_trace(cfg.trace, csv_columns=cfg.csv_columns, time_unit=cfg.time_unit, time_zone=cfg.time_zone,
                       slurm_states=cfg.slurm_states)
    if cfg.strict:
        dropped = {k: int(v) for k, v in frame.attrs.get("skipped", {}).items() if v}
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
           listeners: Sequence[Any] = (), force: bool = False) -> dict:
    """Simulate one configuration and write its run directory, as a unit: the files are written
    into a hidden sibling directory that replaces ``out_dir`` only once the run is complete
    (``rundir.staged_dir``), so an interrupted or failed run leaves the previous directory as it
    was. ``out_dir`` holding files is refused unless ``force`` (``rundir.check_out_dir``).

    ``listeners``: ``EngineListener`` objects the engine tells of every state change
    (``sim/core/listeners.py``; ``bench/engine_floor.py`` counts re-times with one).

    ``check_invariants`` (default True) checks ``tlora_sim.sim.core.invariants`` while simulating; switch it off
    for benchmarks only (results are identical, the checks cost a few per cent).

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
                            check_invariants=check_invariants, policy=policy, listeners=listeners)


def _replay_into(cfg: ReplayConfig, out: Path, *, progress: bool, plots: bool, position: int,
                 check_invariants: bool, policy: Any, listeners: Sequence[Any]) -> dict:
    """``replay`` writing straight into the directory ``out`` (the caller stages it)."""
    from tlora_sim.policies.registry import config_of, load_policy_module, make_policy

    for module in cfg.policy_modules:
        load_policy_module(module)
    if policy is None:
        policy = make_policy(cfg.policy, cfg.policy_options)
    if cfg.early_exit:
        from tlora_sim.policies.early_exit import WithEarlyExit

        policy = WithEarlyExit(policy)
    jobs, cluster, cost_model, frame, dist, skipped = load_workload(cfg)
    files = RunDir(out)
    write_json(files.config, {
        "inputs": asdict(cfg), "cluster": cluster.spec, "gpu": asdict(cluster.gpu),
        "policy": cfg.policy, "policy_config": config_of(policy), "plan": policy.plan,
        "trace": cfg.trace, "seed": cfg.seed, "lora_distribution": dist.to_dict(),
        "cost_model": cost_model.describe(), "versions": versions(), "jobs_in_trace": int(len(frame)),
    })
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
    flops = sum(map(mul, map(attrgetter("steps_trained"), res.records), engine.member_flops))  # in job order
    summary = {"policy": cfg.policy, "trace": cfg.trace, "cluster": cluster.spec, "seed": cfg.seed,
               **metrics.summarize(jobs_df, res, cluster, flops), "skipped": skipped,
               **coverage(len(jobs), skipped, cost_model.describe())}
    perf = {k: summary.pop(k) for k in metrics.PERF_KEYS}
    write_csv(files.jobs, jobs_df)
    write_csv(files.timeline, metrics.timeline_table(res, cluster))
    write_json(files.summary, summary)
    write_json(files.perf, {**perf, "jobs": len(jobs), "machine": platform.machine(),
                                   "python": platform.python_version(), "invariants_checked": check_invariants})
    if plots:
        from tlora_sim.sim.report.plots import plot_run

        plot_run(out)
    return summary


EXTRAPOLATION_WARN = 0.05
"""Share of extrapolated cost-model predictions above which a run warns (stderr)."""


def coverage(kept: int, skipped: dict, cost_model: dict) -> dict:
    """What a run covers: ``kept_jobs`` of ``input_jobs`` (the trace's rows, or sweep configurations,
    before skips), and ``extrapolated_share`` of the cost model's distinct predictions that left
    its measured grid (0 for a model that does not count them)."""
    preds = int(cost_model.get("predictions", 0) or 0)
    extra = int(cost_model.get("extrapolated", 0) or 0)
    return {"input_jobs": kept + sum(int(v) for v in skipped.values()), "kept_jobs": kept,
            "extrapolated_share": extra / preds if preds else 0.0}


def coverage_line(policy: str, summary: dict) -> str:
    """``kept N of M jobs (skipped: memory a, ...); X% of cost-model predictions extrapolated``,
    the line every replay and comparison prints per policy."""
    sk = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("skipped", {}).items()) if v) or "none"
    line = (f"{policy}: kept {summary['kept_jobs']} of {summary['input_jobs']} jobs (skipped: {sk}); "
            f"{summary['extrapolated_share']:.1%} of cost-model predictions extrapolated")
    if summary["extrapolated_share"] > EXTRAPOLATION_WARN:
        line += f" -- WARNING: above {EXTRAPOLATION_WARN:.0%}, see config.json cost_model.reasons"
    return line


def _progress_bar(jobs, label: str, position: int):
    from tqdm import tqdm

    horizon_h = (jobs[-1].submit_time_s if jobs else 0.0) / 3600.0
    return tqdm(total=round(horizon_h, 1), unit="sim-h", desc=f"{label:>12}", position=position, leave=True,
                mininterval=0.5, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} simulated h "
                                            "[{elapsed}<{remaining}]")


def _replay_row(cfg: ReplayConfig, out: Path, progress: bool, position: int, check: bool) -> dict:
    """One policy of a comparison (a pool task)."""
    return _replay_into(cfg, out, progress=progress, plots=True, position=position, check_invariants=check,
                        policy=None, listeners=())


def compare(base: ReplayConfig, policies: list[str], out_dir: str | Path, *, workers: int = 1,
            progress: bool = True, policy_options: dict[str, dict] | None = None,
            check_invariants: bool = True, force: bool = False) -> pd.DataFrame:
    """Replay ``base`` under each policy; write ``OUT/summary.csv``, ``OUT/<policy>/`` and ``OUT/figures/``.

    The comparison directory is written as a unit, as ``replay``'s run directory is: it replaces
    ``out_dir`` only when every policy's run, the table and the figures are complete; ``out_dir``
    holding files is refused unless ``force``.

    With ``workers`` > 1 the policies run in worker processes; an error or interrupt in any of them
    stops the others (each leaves only complete files) and is raised here.

    Returns:
        The summary table (one row per policy, in the given order).
    """
    from tlora_sim.policies.registry import load_policy_module, make_policy

    final = check_out_dir(out_dir, force=force, what="comparison")
    for module in base.policy_modules:
        load_policy_module(module)
    for p in policies:  # fail on a bad name or option before any simulation starts
        make_policy(p, (policy_options or {}).get(p))
    cfgs = [ReplayConfig(**{**asdict(base), "policy": p, "policy_options": (policy_options or {}).get(p, {})})
            for p in policies]
    with staged_dir(final) as out:
        return _compare_into(cfgs, out, workers, progress, check_invariants)


def _compare_into(cfgs: list[ReplayConfig], out: Path, workers: int, progress: bool,
                  check_invariants: bool) -> pd.DataFrame:
    """``compare`` writing straight into ``out`` (the caller stages it)."""
    tasks = [(c, out / c.policy, progress, i, check_invariants) for i, c in enumerate(cfgs)]
    rows = run_tasks(_replay_row, tasks, workers)
    broken = [c.policy for c, r in zip(cfgs, rows) if r.get("error") == "BrokenProcessPool"]
    if broken:
        raise RuntimeError(f"the worker running {', '.join(broken)} died (killed, or out of memory)")
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "skipped"} | {"skipped": sum(r["skipped"].values())}
                          for r in rows])
    first = ["policy"] + metrics.SUMMARY_KEYS
    table = table[first + [c for c in table.columns if c not in first]]
    write_csv(RunDir(out).compare_summary, table)
    from tlora_sim.sim.report.plots import plot_compare

    plot_compare(out)
    return table
