"""``tlora-sim validate-run``: replay an executed run in the simulator and compare, job by job.

For each executed run directory (``tlora-sim execute``) the identical workload (``workload.csv``:
the same jobs, total steps and arrivals), cluster, policy and policy options are simulated by the
SimPy engine with the matching cost model:

* a CUDA run: the profiled model of its GPU type (no-checkpointing memory convention, as executed);
* a CPU run (``--device cpu``, no CPU profile exists): that model with every step time multiplied
  by one factor, the median over the run's measured steps of measured / predicted (``cpu_scale``
  in ``validation.csv``), so that a CPU smoke run exercises the comparison; it validates nothing
  about GPUs.

What a step-time table does not see is measured from the run's ``steps.csv`` and given to the
simulator, so that the comparison tests the step model and the schedule, not guessed constants:
the regroup pause (mean save/rebuild/restore time plus the mean excess of a rebuilt group's
first step over its predicted step), the same for a new group's start (``start_pause_s``), and a
pause whenever a member finishes and the others go on (the executor rebuilds the super-model
then; ``Engine(pause_on_finish=True)``).

Writes ``validation.csv`` (one row per run: ``policy, jobs, real_avg_jct_s, sim_avg_jct_s,
real_makespan_s, sim_makespan_s, jct_abs_error_p50, jct_abs_error_p90``, the errors being per-job
|sim - real| / real, plus context columns), ``validation_jobs.csv`` (per job) and
``validation.png``/``.pdf`` (simulated against real JCT per job, one panel per policy), and each
simulated run under ``sim/<policy>/``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

COLUMNS = ["policy", "jobs", "real_avg_jct_s", "sim_avg_jct_s", "real_makespan_s", "sim_makespan_s",
           "jct_abs_error_p50", "jct_abs_error_p90"]


class ScaledCostModel:
    """A cost model whose step times are another's times ``factor`` (memory and FLOPs unchanged)."""

    name = "scaled"

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, float(factor)

    def step_time_s(self, *a, **k) -> float:
        return self.factor * self.inner.step_time_s(*a, **k)

    def memory_bytes(self, *a, **k) -> float:
        return self.inner.memory_bytes(*a, **k)

    def step_flops(self, *a, **k) -> float:
        return self.inner.step_flops(*a, **k)

    def batch(self, *a, **k):
        return None

    def describe(self) -> dict:
        return {**self.inner.describe(), "name": self.name, "scale": self.factor}


def first_step_excess_s(steps: pd.DataFrame, jobs: list, cm, gpu: str) -> float:
    """Mean over the run's group compositions of (first step - predicted step) (s, >= 0): what
    a freshly built super-model's first step costs beyond a steady one (allocations, autotuning)."""
    st = steps.reset_index(drop=True)
    seg = ((st.group_id != st.group_id.shift()) | (st.jobs.astype(str) != st.jobs.astype(str).shift())).cumsum()
    first = st.groupby(seg).head(1)
    if first.empty:
        return 0.0
    pred = [cm.step_time_s(jobs[int(str(j).split(";")[0])].model, gpu,
                           tuple(jobs[int(i)].member for i in str(j).split(";")), 1, p, int(n))
            for j, p, n in zip(first.jobs, first.plan, first.nano_batches)]
    return float(max(0.0, np.mean(first.ms.to_numpy() / 1e3 - np.array(pred))))


def _load(real: Path) -> tuple[dict, list, pd.DataFrame, pd.DataFrame]:
    from tlora_sim.sim.executor.execute import jobs_from_table

    files = RunDir(real)
    for p in (files.config, files.workload, files.steps, files.jobs):
        if not p.is_file():
            raise InputError(f"not an executed run directory (missing {p.name}); make one with tlora-sim execute",
                             file=str(real))
    cfg = json.loads(files.config.read_text())
    if "executor" not in cfg:
        raise InputError("config.json has no 'executor' section: not a tlora-sim execute run", file=str(files.config))
    jobs = jobs_from_table(pd.read_csv(files.workload, keep_default_na=False, na_values={"sweep_id": [""]}))
    return cfg, jobs, pd.read_csv(files.steps), pd.read_csv(files.jobs)


def simulate(real: str | Path, out: Path | None = None) -> tuple[dict, pd.DataFrame]:
    """Replay one executed run; (row of ``validation.csv``, per-job table)."""
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.core.engine import Engine
    from tlora_sim.sim.executor.execute import executor_cost_model

    real = Path(real)
    cfg, jobs, steps, real_jobs = _load(real)
    cluster = parse_cluster(cfg["cluster"])
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=float(cfg["gpu"]["memory_bytes"])))
    cm = executor_cost_model(cluster.gpu.name)
    st = steps[steps.event == "step"]
    scale = 1.0
    if not str(cfg["executor"].get("device", "cuda")).startswith("cuda"):
        pred = [cm.step_time_s(jobs[int(j.split(";")[0])].model, cluster.gpu.name,
                               tuple(jobs[int(i)].member for i in str(j).split(";")), 1, p, int(n)) * 1e3
                for j, p, n in zip(st.jobs.astype(str), st.plan, st.nano_batches)]
        scale = float(np.median(st.ms.to_numpy() / np.array(pred))) if len(pred) else 1.0
        cm = ScaledCostModel(cm, scale)
        jobs = [replace(j, isolated_step_time_s=j.isolated_step_time_s * scale) for j in jobs]
    first_s = first_step_excess_s(st, jobs, cm, cluster.gpu.name)
    pauses, starts = steps[steps.event == "regroup"].ms, steps[steps.event == "start"].ms
    pause_s = (float(pauses.mean() / 1e3) if len(pauses) else 0.0) + first_s
    start_s = (float(starts.mean() / 1e3) if len(starts) else 0.0) + first_s
    policy = make_policy(cfg["policy"], cfg["inputs"].get("policy_options") or {})
    res = Engine(jobs, cluster, cm, policy, regroup_pause_s=pause_s, start_pause_s=start_s, pause_on_finish=True,
                 check_invariants=True).run()
    sim_jobs = metrics.jobs_table(res)
    if out is not None:
        d = out / "sim" / cfg["policy"]
        d.mkdir(parents=True, exist_ok=True)
        write_csv(RunDir(d).jobs, sim_jobs)
    both = real_jobs[["job_id", "jct_s", "submit_time_s", "finish_time_s"]].merge(
        sim_jobs[["job_id", "jct_s", "finish_time_s"]], on="job_id", suffixes=("_real", "_sim"))
    both["abs_error"] = (both.jct_s_sim - both.jct_s_real).abs() / both.jct_s_real
    both.insert(0, "policy", cfg["policy"])
    row = {"policy": cfg["policy"], "jobs": int(len(both)), "real_avg_jct_s": float(both.jct_s_real.mean()),
           "sim_avg_jct_s": float(both.jct_s_sim.mean()), "real_makespan_s": float(real_jobs.finish_time_s.max()),
           "sim_makespan_s": float(sim_jobs.finish_time_s.max()),
           "jct_abs_error_p50": float(both.abs_error.quantile(0.5)),
           "jct_abs_error_p90": float(both.abs_error.quantile(0.9)),
           "avg_jct_error": float(both.jct_s_sim.mean() / both.jct_s_real.mean() - 1),
           "device": cfg["executor"].get("device_name"), "gpu_type": cluster.gpu.name, "cpu_scale": scale,
           "regroup_pause_s": pause_s, "start_pause_s": start_s, "first_step_excess_s": first_s,
           "real_dir": str(real)}
    return row, both


def validate_runs(real_dirs: list[str | Path], out_dir: str | Path, *, force: bool = False) -> pd.DataFrame:
    """Validate every run in ``real_dirs``; write the validation directory; return its table.

    Raises:
        InputError: a directory that is not an executed run, or an ``out_dir`` that may not be written.
    """
    out = check_out_dir(out_dir, force=force, what="validation")
    with staged_dir(out) as stage:
        rows, per_job = [], []
        for d in real_dirs:
            row, both = simulate(d, stage)
            rows.append(row)
            per_job.append(both)
        table = pd.DataFrame(rows)
        table = table[COLUMNS + [c for c in table.columns if c not in COLUMNS]]
        write_csv(RunDir(stage).validation, table)
        jobs = pd.concat(per_job, ignore_index=True)
        write_csv(stage / "validation_jobs.csv", jobs)
        plot_validation(jobs, stage)
    return table


def plot_validation(jobs: pd.DataFrame, out: Path) -> list[Path]:
    """Simulated against real JCT per job, one panel per policy, with the y = x line."""
    from tlora_sim.sim.report import style as fs

    policies = list(dict.fromkeys(jobs.policy))
    with fs.style_context():
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.4)
        axes = np.atleast_1d(fig.subplots(1, len(policies), squeeze=False)[0])
        for ax, pol in zip(axes, policies):
            p = jobs[jobs.policy == pol]
            ax.scatter(p.jct_s_real, p.jct_s_sim, s=10)
            hi = float(max(p.jct_s_real.max(), p.jct_s_sim.max())) * 1.05
            ax.plot([0, hi], [0, hi], color="0.5", lw=0.8, ls="--")
            ax.set_xlim(0, hi)
            ax.set_ylim(0, hi)
            ax.set_title(f"{pol} (p50 err {p.abs_error.median():.0%})")
            ax.set_xlabel(fs.axis_label("Real JCT", "s"))
        axes[0].set_ylabel(fs.axis_label("Simulated JCT", "s"))
        return fs.save_figure(fig, out, "validation")
