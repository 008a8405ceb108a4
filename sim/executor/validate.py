"""``tlora-sim validate-run``: replay executed runs in the simulator and compare, job by job.

For each executed run directory (``tlora-sim execute``) the identical workload (``workload.csv``:
the same jobs, total steps and arrivals), cluster (``config.json``: devices, GPU type and the
memory the policies planned with), policy and policy options are simulated by the SimPy engine.
Step times (``--step-times``):

* ``profiled`` (default for a CUDA run): the profiled model of the run's GPU type, the model the
  policy planned with; this is the validation of the simulator.
* ``measured`` (default for a CPU run, which has no profiled model of its device): a table-driven
  model of this run's own measured steps (``sim/executor/steptable.py``: median steady step time
  per group composition; compositions the run never trained fall back to the profiled model times
  the run's measured / predicted ratio, ``cpu_scale``). On a GPU run it separates the step
  model's error from the schedule's. On a CPU run it is the only meaningful comparison, and it
  validates the machinery (the executor, the engine and their agreement), nothing about GPUs.

Whenever the engine's step times are not the planning model's, the policy still plans with the
planning model (``sim/executor/planning.py``), as it did in the executed run, and the invariant
checker's isolation floor is off (it compares JCTs with the planning model's isolated runtimes).

What a step-time table does not see is measured from the run's ``steps.csv`` and given to the
engine: the regroup pause (mean save/rebuild/restore time plus the mean excess of a rebuilt
group's first step over the engine's step), the same for a new group's start (``start_pause_s``),
and a pause whenever a member finishes and the others go on (the executor rebuilds the
super-model then; ``Engine(pause_on_finish=True)``). Pauses are charged as the executor pays
them (``Engine(serial_pauses=True, pause_by_size=...)``): a change during a rebuild from an
earlier instant pays its own pause after it (the executor decides between steps), and a change's
pause is the run's mean rebuild for the group's new size (``steptable.pauses_by_size``).

Writes ``validation.csv`` (one row per run: ``policy, jobs, real_avg_jct_s, sim_avg_jct_s,
real_makespan_s, sim_makespan_s, jct_abs_error_p50, jct_abs_error_p90``, the errors being per-job
|sim - real| / real, then context columns), ``validation_jobs.csv`` (per job) and
``validation.png``/``.pdf`` (``sim/executor/figure.py``), ``divergence.csv`` (per job: real against
simulated placements, the first point where the schedules part; ``sim/executor/divergence.py``),
and each simulated run's ``jobs.csv`` and ``groups.csv`` (membership changes) under ``sim/<policy>/``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd

from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

COLUMNS = ["policy", "jobs", "real_avg_jct_s", "sim_avg_jct_s", "real_makespan_s", "sim_makespan_s",
           "jct_abs_error_p50", "jct_abs_error_p90"]
STEP_TIMES = ("auto", "profiled", "measured")
GROUPS = "groups.csv"  # sim/<policy>/: the replay's membership changes (time_s, group_id, jobs)
DIVERGENCE = "divergence.csv"  # per job: real against simulated placements (sim/executor/divergence.py)


def _load(real: Path) -> tuple[dict, list, pd.DataFrame, pd.DataFrame]:
    from tlora_sim.sim.executor.workload import read_workload

    files = RunDir(real)
    if not real.is_dir():
        raise InputError("no such directory; give run directories written by tlora-sim execute", file=str(real))
    for p in (files.config, files.workload, files.steps, files.jobs):
        if not p.is_file():
            raise InputError(f"not an executed run directory (missing {p.name}); make one with tlora-sim execute",
                             file=str(real))
    cfg = json.loads(files.config.read_text())
    if "executor" not in cfg:
        raise InputError("config.json has no 'executor' section: not a tlora-sim execute run", file=str(files.config))
    jobs = read_workload(files.workload)
    real_jobs = pd.read_csv(files.jobs)
    if real_jobs.finish_time_s.isna().any():
        raise InputError("jobs.csv has unfinished jobs: the run did not complete", file=str(files.jobs))
    return cfg, jobs, pd.read_csv(files.steps), real_jobs


def simulate(real: str | Path, out: Path | None = None,
             step_times: str = "auto") -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Replay one executed run; (row of ``validation.csv``, per-job table, its ``divergence.csv``
    rows). With ``out``, writes the replay's ``jobs.csv`` and ``groups.csv`` under ``out/sim/<policy>/``.

    Raises:
        InputError: not an executed run directory, or an unknown ``step_times``.
        InvariantError: the replay broke an invariant.
    """
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.core.invariants import InvariantChecker
    from tlora_sim.sim.executor.divergence import MembershipLog, divergence, real_changes
    from tlora_sim.sim.executor.planning import PlanningPolicy
    from tlora_sim.sim.core.engine import Engine
    from tlora_sim.sim.executor.steptable import (MeasuredStepTable, ScaledCostModel, first_step_excess_s,
                                                  pace, pauses_by_size)
    from tlora_sim.sim.executor.workload import executor_cost_model

    if step_times not in STEP_TIMES:
        raise InputError(f"--step-times must be one of {', '.join(STEP_TIMES)}, got {step_times!r}",
                         field="--step-times")
    real = Path(real)
    cfg, jobs, steps, real_jobs = _load(real)
    cluster = parse_cluster(cfg["cluster"])
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=float(cfg["gpu"]["memory_bytes"])))
    gpu = cluster.gpu.name
    planning = executor_cost_model(gpu)
    on_gpu = str(cfg["executor"].get("device", "cuda")).startswith("cuda")
    mode = step_times if step_times != "auto" else ("profiled" if on_gpu else "measured")
    scale = 1.0 if on_gpu else pace(steps, jobs, planning, gpu)
    if mode == "measured":
        cm = MeasuredStepTable.from_run(steps, jobs, planning, gpu)
    elif on_gpu:
        cm = planning
    else:  # a CPU run against a GPU profile: the profile at the CPU's pace
        cm = ScaledCostModel(planning, scale)
    first_s = first_step_excess_s(steps, jobs, cm, gpu)
    pauses, starts = steps[steps.event == "regroup"].ms, steps[steps.event == "start"].ms
    pause_s = (float(pauses.mean() / 1e3) if len(pauses) else 0.0) + first_s
    start_s = (float(starts.mean() / 1e3) if len(starts) else 0.0) + first_s
    if hasattr(cm, "hits"):
        cm.hits = cm.misses = 0  # count the replay's lookups only
    policy = make_policy(cfg["policy"], cfg["inputs"].get("policy_options") or {})
    checker = InvariantChecker(jobs, cluster, cm)
    if cm is not planning:
        policy = PlanningPolicy(policy, planning, gpu)
        checker.solo = bytearray(len(jobs))  # isolated runtimes are the planning model's, not these step times
    log = MembershipLog()
    by_size = pauses_by_size(steps, first_s)
    engine = Engine(jobs, cluster, cm, policy, regroup_pause_s=pause_s, start_pause_s=start_s,
                    pause_on_finish=True, check_invariants=False, listeners=[checker, log],
                    serial_pauses=True, pause_by_size=by_size)
    log.bind(engine)
    res = engine.run()
    sim_jobs = metrics.jobs_table(res)
    div = divergence(cfg["policy"], real_jobs, real_changes(steps), sim_jobs, log.table())
    if out is not None:
        d = out / "sim" / cfg["policy"]
        d.mkdir(parents=True, exist_ok=True)
        write_csv(RunDir(d).jobs, sim_jobs)
        write_csv(d / GROUPS, log.table())
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
           "device": cfg["executor"].get("device_name"), "gpu_type": gpu, "devices": cluster.total_gpus,
           "clock": cfg["executor"].get("clock", "wall"), "step_times": mode, "cpu_scale": scale,
           "table_hit_share": cm.hit_share() if hasattr(cm, "hit_share") else float("nan"),
           "regroup_pause_s": pause_s, "start_pause_s": start_s, "first_step_excess_s": first_s,
           "regroup_pause_by_size_s": ";".join(f"{k}:{v:.3f}" for k, v in sorted(by_size.items())),
           "serial_pauses": engine.serial_pause_count, "first_divergence_s": float(div.diverged_at_s.min()),
           "same_groups_share": float(div.same_groups.mean()),
           "real_dir": str(real)}
    return row, both, div


def validate_runs(real_dirs: list[str | Path], out_dir: str | Path, *, force: bool = False,
                  step_times: str = "auto", progress: bool = False) -> pd.DataFrame:
    """Validate every run in ``real_dirs``; write the validation directory (as a unit); return its table.

    Raises:
        InputError: a directory that is not an executed run, or an ``out_dir`` that may not be written.
    """
    from tlora_sim.sim.executor.figure import plot_validation

    if not real_dirs:
        raise InputError("validate-run needs at least one executed run directory")
    out = check_out_dir(out_dir, force=force, what="validation")
    dirs = [Path(d) for d in real_dirs]
    with staged_dir(out) as stage:
        rows, per_job, divs = [], [], []
        it = dirs
        if progress:
            from tqdm import tqdm

            it = tqdm(dirs, desc="validate-run", unit="run")
        for d in it:
            row, both, div = simulate(d, stage, step_times)
            rows.append(row)
            per_job.append(both)
            divs.append(div)
        table = pd.DataFrame(rows)
        table = table[COLUMNS + [c for c in table.columns if c not in COLUMNS]]
        write_csv(RunDir(stage).validation, table)
        jobs = pd.concat(per_job, ignore_index=True)
        write_csv(stage / "validation_jobs.csv", jobs)
        write_csv(stage / DIVERGENCE, pd.concat(divs, ignore_index=True))
        plot_validation(jobs, stage)
    return table
