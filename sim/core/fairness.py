"""Tenants and fairness: per-tenant JCT, queueing and GPU-hours, Jain's index, finish-time fairness.

Definitions (docs/metrics.md, "Tenants and fairness"); every figure is over completed jobs (not
configurations stopped early):

* Per tenant (``tenants.csv``, one row per tenant, sorted by name; a trace without tenants has one
  tenant ``""``): ``jobs``, ``completed_jobs``, ``avg_jct_s``, ``p90_jct_s``, ``avg_queue_s``,
  ``avg_slowdown``, ``gpu_hours`` (the tenant's demand: Σ num_gpus x traced duration / 3600, the same under
  every policy), ``gpu_hours_share`` (of all tenants'), ``avg_rho`` and ``max_rho`` (below).
* Jain's fairness index (Jain, Chiu, Hawe, DEC-TR-301, 1984) of values x_1..x_n:
  ``J = (Σ x)^2 / (n Σ x^2)``, 1 when all are equal, 1/n when one job takes everything. ``jain_slowdown``
  is J over the jobs' slowdowns (JCT / isolated runtime); ``jain_tenant_slowdown`` over the tenants' mean
  slowdowns (null with fewer than two tenants).
* Finish-time fairness (Themis, Mahajan et al., NSDI'20, section 3): ``rho = T_shared / T_id``, the job's
  completion time in the shared cluster over the time it would take in an isolated cluster of its fair
  share, 1/N of the G GPUs where N is the number of jobs contending. Here ``T_shared`` is the JCT,
  N̄ the time-average of running + queued jobs over the job's life (submit to finish, from the run's
  timeline), and ``T_id = isolated_runtime x max(1, num_gpus x N̄ / G)``: alone on ``G / N̄`` GPUs a job asking
  more runs that much slower (linear scaling; a job asking no more than its share runs at its isolated
  speed, T_id = isolated runtime). rho <= 1 means the job did no worse than its fair share.
  ``summary.json``: ``ftf_rho_mean``, ``ftf_rho_max`` (Themis' objective: the worst job), and
  ``ftf_share_rho_le_1`` (share of jobs with rho <= 1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TENANT_COLUMNS = ["tenant", "jobs", "completed_jobs", "avg_jct_s", "p90_jct_s", "avg_queue_s", "avg_slowdown",
                  "gpu_hours", "gpu_hours_share", "avg_rho", "max_rho"]
FAIRNESS_KEYS = ["tenants", "jain_slowdown", "jain_tenant_slowdown", "ftf_rho_mean", "ftf_rho_max",
                 "ftf_share_rho_le_1"]


def jain_index(x: np.ndarray) -> float:
    """Jain's index ``(Σx)^2 / (n Σx^2)`` of non-negative values (1.0 for an empty or all-zero input)."""
    x = np.asarray(x, dtype=np.float64)
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * sq)) if len(x) and sq > 0 else 1.0


def contention(timeline: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Time-average of running + queued jobs over each interval ``[start_i, end_i]`` (s), from the run's
    piecewise-constant timeline (``time_s``, ``running_jobs``, ``queued_jobs``; each row holds until the
    next). An empty interval takes the value at its start."""
    t = timeline["time_s"].to_numpy(dtype=np.float64)
    n = (timeline["running_jobs"] + timeline["queued_jobs"]).to_numpy(dtype=np.float64)
    if len(t) == 0:
        return np.ones(len(start))
    area = np.r_[0.0, np.cumsum(n[:-1] * np.diff(t))]  # ∫ n dt from t[0] to t[k]

    def cum(x: np.ndarray) -> np.ndarray:
        k = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
        return area[k] + n[k] * (x - t[k])

    span = end - start
    at = n[np.clip(np.searchsorted(t, start, side="right") - 1, 0, len(t) - 1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(span > 0, (cum(end) - cum(start)) / np.where(span > 0, span, 1.0), at)


def finish_time_fairness(jobs: pd.DataFrame, timeline: pd.DataFrame, total_gpus: int) -> np.ndarray:
    """rho per row of ``jobs`` (``jobs.csv`` columns; NaN for jobs not completed); see the module docstring."""
    submit = jobs["submit_time_s"].to_numpy(dtype=np.float64)
    finish = jobs["finish_time_s"].to_numpy(dtype=np.float64)
    done = np.isfinite(finish)
    n_bar = np.full(len(jobs), np.nan)
    n_bar[done] = np.maximum(contention(timeline, submit[done], finish[done]), 1.0)
    share = np.maximum(1.0, jobs["num_gpus"].to_numpy(dtype=np.float64) * n_bar / total_gpus)
    t_id = jobs["isolated_runtime_s"].to_numpy(dtype=np.float64) * share
    return (finish - submit) / t_id


def _completed(jobs: pd.DataFrame) -> np.ndarray:
    return (~jobs["early_exit"].astype(bool) & jobs["finish_time_s"].notna()).to_numpy()


def tenant_table(jobs: pd.DataFrame, timeline: pd.DataFrame, total_gpus: int) -> pd.DataFrame:
    """One row per tenant with :data:`TENANT_COLUMNS` (times s, GPU-hours h); see the module docstring."""
    rho = finish_time_fairness(jobs, timeline, total_gpus)
    df = jobs.assign(_rho=rho, _done=_completed(jobs),
                     _gpu_h=jobs["num_gpus"] * jobs["trace_duration_s"] / 3600.0)
    df["tenant"] = df["tenant"].fillna("").astype(str)
    rows = []
    total_h = float(df["_gpu_h"].sum())
    for tenant, g in df.groupby("tenant", sort=True):
        d = g[g["_done"]]
        k = len(d)
        rows.append({"tenant": tenant, "jobs": len(g), "completed_jobs": k,
                     "avg_jct_s": float(d["jct_s"].mean()) if k else 0.0,
                     "p90_jct_s": float(np.percentile(d["jct_s"], 90)) if k else 0.0,
                     "avg_queue_s": float(d["queue_s"].mean()) if k else 0.0,
                     "avg_slowdown": float(d["slowdown"].mean()) if k else 0.0,
                     "gpu_hours": float(g["_gpu_h"].sum()),
                     "gpu_hours_share": float(g["_gpu_h"].sum()) / total_h if total_h > 0 else 0.0,
                     "avg_rho": float(d["_rho"].mean()) if k else 0.0,
                     "max_rho": float(d["_rho"].max()) if k else 0.0})
    return pd.DataFrame(rows, columns=TENANT_COLUMNS)


def fairness_summary(jobs: pd.DataFrame, timeline: pd.DataFrame, total_gpus: int,
                     tenants: pd.DataFrame | None = None) -> dict:
    """The :data:`FAIRNESS_KEYS` for ``summary.json`` (``tenants``: the number of tenants)."""
    done = _completed(jobs)
    rho = finish_time_fairness(jobs, timeline, total_gpus)[done]
    tenants = tenant_table(jobs, timeline, total_gpus) if tenants is None else tenants
    with_jobs = tenants[tenants["completed_jobs"] > 0]
    return {
        "tenants": int(len(tenants)),
        "jain_slowdown": jain_index(jobs["slowdown"].to_numpy()[done]),
        "jain_tenant_slowdown": jain_index(with_jobs["avg_slowdown"].to_numpy()) if len(with_jobs) >= 2 else None,
        "ftf_rho_mean": float(rho.mean()) if len(rho) else 0.0,
        "ftf_rho_max": float(rho.max()) if len(rho) else 0.0,
        "ftf_share_rho_le_1": float((rho <= 1.0 + 1e-9).mean()) if len(rho) else 0.0,
    }
