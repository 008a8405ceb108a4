"""Metrics, defined once (docs/metrics.md, "Metrics").

* JCT = finish - submit; queueing delay = first start - submit; slowdown = JCT / isolated runtime.
* run slowdown = (finish - first start) / isolated time of the steps trained, the isolated step
  measured alone in the policy's own lone-job plan (``SimResult.reference_step_s``: the fused
  kernel for tLoRA, eager LoRA for the baseline): what a co-located job's tolerated slowdown
  (``max_slowdown``) promises; ``summary.json`` counts the jobs over it. ``run_slowdown_eager``
  is the same against the eager per-job step (``Job.isolated_step_time_s``), the older reading.
* Throughput = trained tokens per second, cluster-wide, over the makespan and as a time series.
* GPU utilization, two figures named apart: *allocation* = GPU-seconds held / GPU-seconds
  available (all GPUs x makespan); *compute* = model FLOPs done / peak FLOPs of the held GPUs
  (datasheet dense bf16 peak x GPU-seconds held).
* Makespan = last finish - first submit (s). Policy decision time per call (ms).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

import numpy as np
import pandas as pd

from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.core.decision_stats import QueueDecade
from tlora_sim.sim.core.results import SimResult

JOB_COLUMNS = ["job_id", "index", "tenant", "model", "rank", "batch_size", "micro_batch_per_gpu", "grad_accum",
               "seq_len", "num_gpus", "parallelism", "total_steps",
               "tokens_per_step", "submit_time_s", "start_time_s", "finish_time_s", "jct_s", "queue_s",
               "isolated_runtime_s", "slowdown", "trace_duration_s", "max_group_size", "group_changes",
               "steps_trained", "early_exit", "max_slowdown", "run_slowdown", "run_slowdown_eager", "sweep_id", "loss_floor"]
TIMELINE_COLUMNS = ["time_s", "running_jobs", "queued_jobs", "groups", "gpus_allocated", "gpus_total",
                    "tokens_per_s", "model_flops_per_s", "gpu_alloc_util", "gpu_compute_util"]
PERF_KEYS = ["events", "decisions", "decision_ms_per_call", "wall_s", "events_per_s", "decision_ms_by_queue"]
SUMMARY_KEYS = ["jobs", "avg_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
                "throughput_tokens_per_s", "gpu_alloc_util", "gpu_compute_util", "avg_slowdown", "p90_slowdown"]


def _column(values) -> np.ndarray | list:
    """Python numbers as an array, typed as pandas types their list (int64 when all are ints,
    float64 when any is a float, bool when all are bools) by ``np.array``'s C path instead of
    pandas' object-array inference (issue 20); an empty list stays a list (pandas types it)."""
    values = values if isinstance(values, list) else list(values)
    return np.array(values) if values else values


def jobs_table(res: SimResult) -> pd.DataFrame:
    """One row per job with the ``JOB_COLUMNS`` (times in s)."""
    j, r = res.jobs, res.records

    def job(name):
        return _column(map(attrgetter(name), j))

    def rec(name):
        return _column(map(attrgetter(name), r))

    nan = np.nan
    df = pd.DataFrame({
        "job_id": [x.job_id for x in j], "index": job("index"), "tenant": [x.tenant for x in j],
        "model": [x.model for x in j], "rank": job("rank"), "batch_size": job("batch_size"),
        "micro_batch_per_gpu": job("micro_batch_per_gpu"), "grad_accum": job("grad_accum"),
        "seq_len": job("seq_len"), "num_gpus": job("num_gpus"),
        "parallelism": [x.parallelism for x in j],
        "total_steps": job("total_steps"), "tokens_per_step": job("tokens_per_step"),
        "submit_time_s": job("submit_time_s"),
        "start_time_s": _column([nan if y is None else y for y in map(attrgetter("start_s"), r)]),
        "finish_time_s": _column([nan if y is None else y for y in map(attrgetter("finish_s"), r)]),
        "isolated_runtime_s": job("isolated_runtime_s"),
        "trace_duration_s": job("trace_duration_s"),
        "max_group_size": rec("max_group_size"), "group_changes": rec("group_changes"),
        "steps_trained": rec("steps_trained"), "early_exit": rec("early_exit"),
        "max_slowdown": job("max_slowdown"),
        "sweep_id": [x.sweep_id or "" for x in j], "loss_floor": job("loss_floor"),
        "_iso_step_s": job("isolated_step_time_s"),
    })
    df["jct_s"] = df["finish_time_s"] - df["submit_time_s"]
    df["queue_s"] = df["start_time_s"] - df["submit_time_s"]
    df["slowdown"] = df["jct_s"] / df["isolated_runtime_s"]
    # the promise tLoRA makes: running time (first start to finish) over the isolated time of the
    # steps actually trained (all of them unless the job exited early)
    ran = df["finish_time_s"] - df["start_time_s"]
    df["run_slowdown_eager"] = ran / (df["steps_trained"] * df["_iso_step_s"])
    ref = getattr(res, "reference_step_s", None)
    df["run_slowdown"] = df["run_slowdown_eager"] if ref is None else ran / (df["steps_trained"] * _column(list(ref)))
    return df[JOB_COLUMNS]


def timeline_table(res: SimResult, cluster: ClusterSpec) -> pd.DataFrame:
    """The piecewise-constant time series (``TIMELINE_COLUMNS``), one row per state change."""
    cols = ["time_s", "running_jobs", "queued_jobs", "groups", "gpus_allocated", "tokens_per_s", "model_flops_per_s"]
    tl = res.timeline
    if tl and set(map(len, tl)) == {len(cols)}:  # column by column (typed as from the rows, in half the time)
        df = pd.DataFrame({c: _column(list(map(itemgetter(i), tl))) for i, c in enumerate(cols)})
    else:
        df = pd.DataFrame(tl, columns=cols)
    df["gpus_total"] = cluster.total_gpus
    df["gpu_alloc_util"] = df["gpus_allocated"] / cluster.total_gpus
    held_peak = df["gpus_allocated"] * cluster.gpu.peak_flops
    df["gpu_compute_util"] = np.where(held_peak > 0, df["model_flops_per_s"] / held_peak.where(held_peak > 0, 1), 0.0)
    return df[TIMELINE_COLUMNS]


SLOWDOWN_TOLERANCE = 1.01
"""A co-located job breaks its bound when ``run_slowdown > max_slowdown x SLOWDOWN_TOLERANCE``
(1% for rounding and the step-time model's granularity; regroup pauses are not taken out)."""


def promise_kept(jobs: pd.DataFrame) -> dict:
    """How many co-located jobs (``max_group_size > 1``) ran slower than their tolerated slowdown.

    Returns:
        ``colocated_jobs``, ``over_max_slowdown`` (count with ``run_slowdown > max_slowdown x
        SLOWDOWN_TOLERANCE``) and ``over_max_slowdown_share`` (their share of the co-located jobs).
    """
    co = jobs[jobs["max_group_size"] > 1]
    over = int((co["run_slowdown"] > co["max_slowdown"] * SLOWDOWN_TOLERANCE).sum())
    return {"colocated_jobs": int(len(co)), "over_max_slowdown": over,
            "over_max_slowdown_share": over / len(co) if len(co) else 0.0}


def early_exit_summary(jobs: pd.DataFrame) -> dict:
    """Stopped sweep configurations, reported apart from completed jobs.

    Returns:
        ``stopped_jobs``; ``stopped_gpu_hours_saved`` (GPU-hours the stopped configurations did
        not train: their untrained steps at their isolated step time, times their GPUs);
        ``avg_time_to_best_s`` (per sweep family, from its submission to the finish of its
        best configuration, the lowest ``loss_floor``; mean over families; None without sweeps);
        ``best_stopped_families`` (families whose best configuration was stopped early).
    """
    stopped = jobs[jobs["early_exit"].astype(bool)]
    iso_step = jobs["isolated_runtime_s"] / jobs["total_steps"]
    saved = ((jobs["total_steps"] - jobs["steps_trained"]) * iso_step * jobs["num_gpus"])[jobs["early_exit"].astype(bool)]
    sw = jobs[jobs["sweep_id"] != ""]
    ttb, lost = [], 0
    for _, fam in sw.groupby("sweep_id", sort=True):
        best = fam.loc[fam["loss_floor"].idxmin()]
        ttb.append(best["finish_time_s"] - fam["submit_time_s"].min())
        lost += bool(best["early_exit"])
    return {"stopped_jobs": int(len(stopped)), "stopped_gpu_hours_saved": float(saved.sum() / 3600.0),
            "avg_time_to_best_s": float(np.mean(ttb)) if ttb else None,
            "best_stopped_families": int(lost)}


def summarize(jobs: pd.DataFrame, res: SimResult, cluster: ClusterSpec, model_flops: float) -> dict:
    """Run-level figures (``SUMMARY_KEYS`` plus decision and engine statistics).

    JCT, queueing and slowdown figures are over completed jobs; configurations stopped early are
    counted apart (``early_exit_summary``).

    Args:
        jobs: ``jobs_table`` output.
        res: the raw result.
        cluster: the cluster.
        model_flops: total model FLOPs trained (FLOP).
    """
    done = jobs[~jobs["early_exit"].astype(bool)]  # a stopped configuration is not a completed job
    jct = done["jct_s"].to_numpy()
    n = len(done)
    makespan = float(jobs["finish_time_s"].max() - min(jobs["submit_time_s"].min(), 0.0)) if n else 0.0
    tokens = float((jobs["steps_trained"] * jobs["tokens_per_step"]).sum())
    held = res.gpu_seconds_held
    pct = (lambda q: float(np.percentile(jct, q))) if n else (lambda q: 0.0)
    return {
        "jobs": int(len(jobs)),
        "completed_jobs": n,
        "avg_jct_s": float(jct.mean()) if n else 0.0,
        "p50_jct_s": pct(50), "p90_jct_s": pct(90), "p99_jct_s": pct(99),
        "avg_queue_s": float(done["queue_s"].mean()) if n else 0.0,
        "makespan_s": makespan,
        "throughput_tokens_per_s": tokens / makespan if makespan > 0 else 0.0,
        "gpu_alloc_util": held / (cluster.total_gpus * makespan) if makespan > 0 else 0.0,
        "gpu_compute_util": model_flops / (cluster.gpu.peak_flops * held) if held > 0 else 0.0,
        "avg_slowdown": float(done["slowdown"].mean()) if n else 0.0,
        "p90_slowdown": float(np.percentile(done["slowdown"], 90)) if n else 0.0,
        **early_exit_summary(jobs),
        **promise_kept(jobs),
        "trained_tokens": tokens,
        "model_flops": model_flops,
        "gpu_seconds_held": held,
        "groups_started": res.groups_started,
        "events": res.events,
        "decisions": res.decisions,
        "decision_ms_per_call": 1e3 * res.decision_time_s / res.decisions if res.decisions else 0.0,
        "wall_s": res.wall_s,
        "events_per_s": res.events / res.wall_s if res.wall_s > 0 else 0.0,
        "decision_ms_by_queue": decisions_by_queue(res.decisions_by_queue),
    }


def decisions_by_queue(by_queue: dict[int, QueueDecade]) -> dict[str, dict]:
    """Decision cost by queue length, for ``perf.json``: ``{"10-99": {"decisions": n, "ms_per_call":
    x, "cpu_ms_per_call": c, "mean_queue": q}, ...}`` keyed by queue-length decade (``"0"`` = empty
    queue), in order; ``ms_per_call`` is wall time over every decision, ``cpu_ms_per_call`` the CPU
    time of the engine's thread (``time.thread_time``), which other work on the machine does not
    inflate, per decision, estimated from the ``cpu_timed`` decisions the engine CPU-timed (the
    first 64 of the decade, then every 8th: ``decision_stats.CPU_ALL``).

    A decision's cost is a look at the queue plus work per job it places, so a decade's mean mixes
    two costs in whatever proportion its decisions had (mLoRA at load 0.7: idle decisions ~0.01 ms
    at every queue length, placing ones 0.05-1.5 ms). Each decade also has ``idle_decisions`` and their ``idle_ms_per_call`` / ``idle_cpu_ms_per_call``
    (decisions that placed no job), ``placed_jobs`` and ``ms_per_placed_job`` /
    ``cpu_ms_per_placed_job`` (the time of the decade's placing decisions per job they placed).
    The wall times cover every decision; the CPU times are estimated from the sampled ones, which
    is noisy where a decade has few placing decisions."""
    out = {}
    for d in sorted(by_queue):
        r = by_queue[d]
        n, t, idle_n, placed = r.decisions, r.wall_s, r.idle_decisions, r.placed_jobs
        key = "0" if d == 0 else f"{10 ** (d - 1)}-{10 ** d - 1}"
        out[key] = {"decisions": n, "ms_per_call": 1e3 * t / n if n else 0.0,
                    "mean_queue": r.queue_sum / n if n else 0.0,
                    "cpu_ms_per_call": 1e3 * r.cpu_s / n if n else 0.0, "cpu_timed": r.cpu_timed,
                    "idle_decisions": idle_n, "idle_ms_per_call": 1e3 * r.idle_wall_s / idle_n if idle_n else 0.0,
                    "idle_cpu_ms_per_call": 1e3 * r.idle_cpu_s / idle_n if idle_n else 0.0, "placed_jobs": placed,
                    "ms_per_placed_job": 1e3 * max(t - r.idle_wall_s, 0.0) / placed if placed else 0.0,
                    "cpu_ms_per_placed_job": 1e3 * max(r.cpu_s - r.idle_cpu_s, 0.0) / placed if placed else 0.0}
    return out
