"""The Python API (``import tlora_sim as ts``): traces, replays and comparisons as objects, nothing written
unless asked.

``ts.read_trace``, ``ts.replay``, ``ts.compare`` and ``ts.costmodel`` are these functions (the package
``tlora_sim`` re-exports them lazily, so ``import tlora_sim`` stays cheap and torch-free). A replay here is
the CLI's replay (:func:`tlora_sim.sim.experiments.replay.simulate`, the same code and bytes): ``Run.save``
writes exactly the run directory ``tlora-sim replay`` writes for the same inputs.

Errors are :class:`tlora_sim.traces.errors.InputError` (bad input: file, row and field in the message)
and ``tlora_sim.sim.core.engine.InvariantError`` (a simulator bug).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from tlora_sim.traces.errors import InputError

#: reader options of :func:`read_trace` (and of :func:`replay`/:func:`compare` for a spec string).
READER_OPTIONS = ("csv_columns", "time_unit", "time_zone", "slurm_states", "keep_states")
#: trace cuts, every format and DataFrames too.
CUT_OPTIONS = ("window", "first_jobs", "arrival_scale")


def read_trace(trace: str | pd.DataFrame, **options: Any) -> pd.DataFrame:
    """A trace as the common table (``job_id, submit_time_s, duration_s, num_gpus, tenant`` and any LoRA
    attribute columns; ``tlora_sim.traces.frame``).

    Args:
        trace: ``"FORMAT:PATH"`` (``itp:``, ``philly:``, ``acme:``, ``csv:``, ``slurm:``, ``synthetic:...``; see
            ``traces/README.md``) or a DataFrame with the columns of ``tlora_sim.traces.dataframe``
            (``submit_time_s``, ``duration_s``, ``num_gpus`` required; ``job_id``, ``tenant`` and ``model``,
            ``rank``, ``seq_len``, ``batch_size``, ``max_slowdown``, ``steps`` optional).
        **options: ``csv_columns`` (dict, or the CLI's ``"submit=ts,duration=d,gpus=n"``), ``time_unit``,
            ``time_zone``, ``slurm_states``, ``keep_states`` (spec strings only) and ``window``
            (``"START,END"``, seconds or dates), ``first_jobs`` (N), ``arrival_scale`` (X) (any trace).

    Raises:
        InputError: an unknown option, a reader option with a DataFrame, or bad input.
    """
    unknown = sorted(set(options) - set(READER_OPTIONS) - set(CUT_OPTIONS))
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(READER_OPTIONS + CUT_OPTIONS)}", field=unknown[0])
    cuts = {k: options.pop(k) for k in CUT_OPTIONS if k in options}
    if isinstance(trace, str):
        from tlora_sim.traces.registry import read_trace as read_spec

        if isinstance(options.get("csv_columns"), str):
            from tlora_sim.traces.generic_csv import parse_column_mapping

            options["csv_columns"] = parse_column_mapping(options["csv_columns"])
        return read_spec(trace, **options, **cuts)
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise InputError(f"{given[0]} applies to trace files, not to a DataFrame", field=given[0])
    from tlora_sim.traces.dataframe import from_dataframe
    from tlora_sim.traces.frame import validate_frame
    from tlora_sim.traces.window import apply_window

    df = apply_window(from_dataframe(trace), **cuts)
    validate_frame(df)
    return df


@dataclass
class Run:
    """One simulated configuration, in memory.

    Attributes:
        config: what ``config.json`` holds (``inputs``: every input; cluster, policy config, cost model, versions).
        summary: ``summary.json``'s dict (``avg_jct_s``, ``p90_jct_s``, ``throughput_tokens_per_s``,
            ``gpu_alloc_util``, fairness, ``skipped``, ...; docs/metrics.md).
        jobs: ``jobs.csv`` (one row per job: times in s; docs/outputs.md).
        timeline: ``timeline.csv`` (piecewise-constant cluster series).
        tenants: ``tenants.csv`` (one row per tenant), or None where the trace has no tenants.
        perf: ``perf.json`` (wall time, events/s: machine-dependent).
    """

    config: dict
    summary: dict
    jobs: pd.DataFrame
    timeline: pd.DataFrame
    tenants: pd.DataFrame | None = None
    perf: dict = field(default_factory=dict)

    @property
    def policy(self) -> str:
        """The policy's name."""
        return str(self.summary.get("policy", ""))

    def save(self, out_dir: str | Path, *, force: bool = False, plots: bool = True) -> Path:
        """Write the run directory ``tlora-sim replay`` writes (figures too unless ``plots=False``), as a
        unit: ``out_dir`` holding files is refused unless ``force``.

        Raises:
            InputError: ``out_dir`` not writable, or holding files without ``force``.
        """
        from tlora_sim.sim.experiments.replay import write_run
        from tlora_sim.sim.report.rundir import check_out_dir, staged_dir

        out = check_out_dir(out_dir, force=force)
        with staged_dir(out) as stage:
            write_run(stage, self._result(), plots=plots)
        return out

    def _result(self) -> dict:
        return {"config": self.config, "jobs": self.jobs, "timeline": self.timeline, "tenants": self.tenants,
                "summary": self.summary, "perf": self.perf}

    def plot(self):
        """A matplotlib Figure (not tied to pyplot; a notebook shows it): the CDF of JCT (h) and the GPU
        allocation over time. The paper-style figures are :meth:`save`'s ``figures/``."""
        return plot_runs({self.policy: self})


@dataclass
class Comparison:
    """Several policies on one workload.

    Attributes:
        runs: policy -> :class:`Run`, the reference first, then in the order given.
        summary: one row per policy (``policy`` and ``summary.json``'s scalar figures, as ``summary.csv``),
            plus the speed-up columns against the reference (``sim/report/tables.py``
            ``SPEEDUP_COLUMNS``: ``avg_jct_speedup``, ``p90_jct_speedup``, ``throughput_x``,
            ``makespan_speedup``; above 1 is better, 1.0 for the reference) and ``reference``.
    """

    runs: dict[str, Run]
    summary: pd.DataFrame

    def save(self, out_dir: str | Path, *, force: bool = False, plots: bool = True) -> Path:
        """Write the comparison directory ``tlora-sim compare`` writes (``summary.csv``, one run directory
        per policy, ``figures/``), as a unit."""
        from tlora_sim.sim.experiments.replay import write_run
        from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv
        from tlora_sim.sim.report.rundir_layout import RunDir

        out = check_out_dir(out_dir, force=force, what="comparison")
        with staged_dir(out) as stage:
            for policy, run in self.runs.items():
                (stage / policy).mkdir()
                write_run(stage / policy, run._result(), plots=plots)
            write_csv(RunDir(stage).compare_summary, self.summary)
            if plots:
                from tlora_sim.sim.report.plots import plot_compare

                plot_compare(stage)
        return out

    def plot(self):
        """A matplotlib Figure with every policy's JCT CDF and GPU allocation over time."""
        return plot_runs(self.runs)


def _config(trace: str | pd.DataFrame, policy: str, cluster: str, seed: int, options: Mapping[str, Any]):
    """(ReplayConfig, frame or None) for the API's arguments."""
    from tlora_sim.sim.experiments.replay import ReplayConfig

    fields = {f.name for f in dataclasses.fields(ReplayConfig)} - {"trace", "policy", "cluster", "seed"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}",
                         field=unknown[0])
    kw = dict(options)
    if isinstance(kw.get("csv_columns"), str):
        from tlora_sim.traces.generic_csv import parse_column_mapping

        kw["csv_columns"] = parse_column_mapping(kw["csv_columns"])
    if "policy_modules" in kw:
        kw["policy_modules"] = tuple(kw["policy_modules"])
    from tlora_sim.sim.experiments.spec import checked

    seed, cluster = (checked(k, v, where=lambda m, k=k: InputError(m, field=k))
                     for k, v in (("seed", seed), ("cluster", cluster)))
    for k, v in kw.items():  # each option through its field's check (a window may also be a pair)
        if v is not None and v != "" and not (k == "window" and not isinstance(v, str)):
            kw[k] = checked(k, v, where=lambda m, k=k: InputError(m, field=k))
    frame = None
    if not isinstance(trace, str):
        cuts = {k: kw.pop(k) for k in CUT_OPTIONS if kw.get(k) is not None}
        frame = read_trace(trace, **cuts)
        trace = f"dataframe:{len(frame)} jobs"
        kw.update(cuts)
    return ReplayConfig(trace=trace, policy=policy, cluster=cluster, seed=seed, **kw), frame


def replay(trace: str | pd.DataFrame, policy: str, cluster: str = "16x8xH100", seed: int = 0, *,
           progress: bool = False, check_invariants: bool = True, **options: Any) -> Run:
    """Simulate ``trace`` under ``policy`` on ``cluster`` and return the :class:`Run` (nothing is written).

    Args:
        trace: a spec (``"synthetic:jobs=200,seed=1"``, ``"itp:.../cluster02.csv.gz"``) or a DataFrame
            (see :func:`read_trace`).
        policy: a registered policy name (``tlora-sim policies``).
        cluster: ``NODESxGPUSxTYPE`` (``"2x8xH100"``).
        seed: seed of the LoRA attribute assignment.
        progress: show a progress bar.
        check_invariants: check the engine's invariants while running (default on).
        **options: any other ``ReplayConfig`` field: ``lora_dist``, ``policy_options`` (dict),
            ``cost_model``, ``regroup_pause_s``, ``strict``, ``sweeps``, ``early_exit``, ``policy_modules``,
            the reader options and the trace cuts of :func:`read_trace`.

    Raises:
        InputError: bad input (an unknown option names itself).
    """
    from tlora_sim.sim.experiments.replay import simulate

    cfg, frame = _config(trace, policy, cluster, seed, options)
    return Run(**simulate(cfg, frame=frame, progress=progress, check_invariants=check_invariants))


def compare(trace: str | pd.DataFrame, policies: Sequence[str] | str, cluster: str = "16x8xH100", seed: int = 0,
            *, policy_options: Mapping[str, Mapping[str, Any]] | None = None, progress: bool = False,
            check_invariants: bool = True, reference: str | None = None, discipline: str = "default",
            **options: Any) -> Comparison:
    """Replay one workload under each policy (in this process, one after another); nothing is written.

    As ``tlora-sim compare``: the reference baseline (``independent-backfill`` unless
    ``reference`` names another) runs too when absent, first, and every policy runs under
    ``discipline`` (``policies/discipline.py``: ``default``, ``shared``, ``native``).

    Args:
        policies: names, or ``"independent,mlora,tlora"``.
        policy_options: policy -> its option overrides (they win over the discipline's).
        reference: the reference policy of the speed-up columns (``avg_jct_speedup``, ...).
        discipline: the comparison's queue discipline.
        Others: as for :func:`replay`.

    Raises:
        InputError: no policies, a repeated one, or bad input; every policy and option is checked before
            any simulation starts.
    """
    from tlora_sim.policies.registry import load_policy_module
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.experiments.replay import (REFERENCE, policy_options_with_discipline, simulate,
                                                  with_reference)
    from tlora_sim.sim.experiments.spec import build_policy
    from tlora_sim.sim.report.tables import speedups

    names = [p.strip() for p in (policies.split(",") if isinstance(policies, str) else policies) if p.strip()]
    if not names:
        raise InputError("no policies given", field="policies")
    if len(set(names)) != len(names):
        raise InputError(f"a policy is given twice: {names}", field="policies")
    reference = reference or REFERENCE
    names, _ = with_reference(names, reference)
    cfg, frame = _config(trace, names[0], cluster, seed, options)
    for module in cfg.policy_modules:
        load_policy_module(module)
    opts = dict(policy_options or {})
    for p in opts:
        if p not in names:
            raise InputError(f"policy_options names {p!r}, which is not being run", field="policy_options")
    specs = {p: dataclasses.replace(cfg, policy=p, discipline=discipline, reference=reference,
                                    policy_options=policy_options_with_discipline(p, discipline, opts.get(p)))
             for p in names}
    built = {p: build_policy(one) for p, one in specs.items()}  # once each, before any simulation starts
    runs = {}
    for p, one in specs.items():
        runs[p] = Run(**simulate(one, frame=frame, progress=progress, check_invariants=check_invariants,
                                 policy=built[p]))
    table = pd.DataFrame([{k: v for k, v in r.summary.items() if not isinstance(v, (dict, list))}
                          | {"skipped": sum(r.summary["skipped"].values())} for r in runs.values()])
    table = speedups(table, reference)
    first = ["policy"] + metrics.SUMMARY_KEYS
    table = table[first + [c for c in table.columns if c not in first]]
    from tlora_sim.sim.report.tables import SPEEDUP_COLUMNS

    for row in table.to_dict("records"):  # each run's summary: its speed-ups, as compare's summary.json
        runs[row["policy"]].summary.update({"reference": reference,
                                            **{c: row[c] for c in SPEEDUP_COLUMNS if c in row}})
    return Comparison(runs=runs, summary=table)


@dataclass(frozen=True)
class CostModel:
    """A cost model for one GPU type (``ts.costmodel("H100")``); ``model`` is the underlying
    ``tlora_sim.sim.costmodel`` object (``step_time_s``, ``memory_bytes``, ``step_flops``)."""

    model: Any
    gpu: str

    def predict(self, model: str, members: Iterable[tuple[int, int, int]], gpus: int = 1, *, plan: str | None = None,
                nano_batches: int = 1, micro_batches: int = 1, parallelism: str | None = None) -> dict:
        """One step of a job or group, as ``tlora-sim costmodel predict`` answers it.

        Args:
            model: base model (``llama3-8b``).
            members: ``(rank, sequences of the whole job per step, tokens per sequence)`` per adapter.
            gpus: GPUs of the group.
            plan: ``alone`` (default for one member), ``fused`` (default otherwise), ``loop``, ...
            nano_batches, micro_batches: pipelining of the step (>= 1).
            parallelism: force a plan (``dp``, ``fsdp``, ``tp2-dp4``); profiled model only.

        Returns:
            ``{"step_time_s": s, "memory_bytes": bytes per GPU, "parallelism": name, "measured": bool,
            "reasons": [why a term was extrapolated]}``.

        Raises:
            InputError: unknown model or plan, a member that is not three integers >= 1, counts < 1.
        """
        from tlora_sim.sim.costmodel.interface import Member, check_plan
        from tlora_sim.sim.costmodel.models import get_model

        get_model(model)
        mem = []
        for i, m in enumerate(members):
            m = tuple(m)
            if len(m) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in m):
                raise InputError(f"member {i + 1} {m!r} is not (rank, sequences, seq_len), three integers >= 1",
                                 field="members")
            mem.append(Member(*m))
        if not mem:
            raise InputError("no members given", field="members")
        mem = tuple(mem)
        if min(gpus, nano_batches, micro_batches) < 1:
            raise InputError("gpus, nano_batches and micro_batches must be >= 1", field="gpus")
        plan = check_plan(plan or ("alone" if len(mem) == 1 else "fused"))
        cm = self.model
        if hasattr(cm, "predict"):
            p = cm.predict(model, self.gpu, mem, gpus, plan, nano_batches, micro_batches, parallelism=parallelism)
            step, name, reasons, memory = p.step_time_s, p.parallelism, list(p.reasons), p.memory_bytes
            if memory != memory:
                memory = cm.memory_bytes(model, self.gpu, mem, gpus, plan, micro_batches)
        else:
            if parallelism:
                raise InputError(f"the {cm.name} model has no parallelism planner", field="parallelism")
            step = cm.step_time_s(model, self.gpu, mem, gpus, plan, nano_batches, micro_batches)
            memory = cm.memory_bytes(model, self.gpu, mem, gpus, plan, micro_batches)
            name, reasons = cm.parallelism(model, self.gpu, mem, gpus, plan), ["analytic roofline model"]
        return {"step_time_s": float(step), "memory_bytes": float(memory), "parallelism": name,
                "measured": not reasons, "reasons": reasons}


def costmodel(gpu: str = "H100", kind: str = "auto") -> CostModel:
    """The cost model a replay on ``gpu`` uses (``kind``: ``auto``, ``profiled`` or ``roofline``).

    Raises:
        InputError: unknown GPU type or kind.
    """
    from tlora_sim.sim.costmodel.factory import make_cost_model
    from tlora_sim.sim.costmodel.hardware import GPUS

    name = str(gpu).upper()
    if name not in GPUS:
        raise InputError(f"unknown GPU type {gpu!r}; known: {', '.join(GPUS)}", field="gpu")
    return CostModel(make_cost_model(kind, name), name)


def plot_runs(runs: Mapping[str, Run]):
    """A two-panel matplotlib Figure: CDF of JCT (h) per policy, GPU allocation (%) over time (days)."""
    import numpy as np

    from tlora_sim.sim.report import style as fs

    with fs.style_context():
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.4)
        a, b = fig.subplots(nrows=1, ncols=2)
        styles = fs.policy_styles(list(runs))
        for name, run in runs.items():
            jct = np.sort(run.jobs["jct_s"].dropna().to_numpy() / 3600.0)
            a.plot(jct, np.arange(1, len(jct) + 1) / max(len(jct), 1), **styles[name].line_kwargs())
            t = run.timeline
            b.step(t["time_s"] / 86400.0, 100 * t["gpu_alloc_util"], where="post", **styles[name].line_kwargs())
        a.set_xlabel(fs.axis_label("JCT", "h"))
        a.set_ylabel(fs.axis_label("CDF", "fraction of jobs"))
        b.set_xlabel(fs.axis_label("time", "days"))
        b.set_ylabel(fs.axis_label("GPU allocation", "%"))
        a.legend(fontsize=5)
    return fig
