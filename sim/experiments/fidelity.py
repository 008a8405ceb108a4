"""How far a replay's numbers rest on measurements: the share of simulated GPU-time whose step
times no measured profile covers, by reason, and the end-to-end validation of the GPU type.

Every prediction not taken from a measured profile counts as extrapolated:

* the roofline model (``--cost-model roofline``, or ``auto`` on a GPU type without a shipped
  profile such as the A100): every job, reason ``roofline`` / ``roofline:gpu``;
* the profiled model: the reasons its prediction of the job's own shape carries
  (``sim/costmodel/profiled/model.py`` ``Prediction.reasons``: ``multigpu:gpus>2``,
  ``multigpu:inter-node``, ``layer``, ``head``, ``roofline:gpu`` ...).

GPU-time of a job = GPUs x (finish - first start), the time it held GPUs (an unfinished job up to
the end of the run). Shares are of the run's total job GPU-time; a job with several reasons counts
under each of them, once in ``extrapolated_gpu_time_share_total``. The reasons are those of the
job's isolated prediction (its model, rank, batch, GPU count and GPU type); a group mix that leaves
the measured grid only inside a group is counted in the distinct-prediction share
``extrapolated_share`` (``sim.core.provenance.coverage``), not here.

:func:`validation_error` reads the end-to-end validation of record for a GPU type
(``profiler/data/validation/``, ``VALIDATION_RUNS``): real against simulated average JCT per policy
and the error of each policy's JCT ratio to ``independent`` (what a speed-up claim rests on).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

EXTRAPOLATION_WARN = 0.05
"""Share of extrapolated cost-model predictions above which a run warns (stderr)."""

#: GPU type -> (validation directory under profiler/data/validation, the workload in words).
VALIDATION_RUNS = {
    "H100": ("h100_third/validation", "ITP cluster02, first 24 one-GPU jobs, Llama-3-8B, times / 300, on one "
                                      "H100 (profiler/data/validation/README.md)"),
    "H200": ("h200_2026-12-01/A/validation_shipped",
             "ITP cluster02, first 24 one-GPU jobs, Llama-3-8B and Qwen3-8B, times / 300, on one H200, shipped "
             "artifact (a calibrated one does better: profiler/data/validation/README.md)"),
}


def job_reasons(cost_model, jobs: Sequence, gpu: str, cost_model_name: str) -> list[tuple[str, ...]]:
    """Per job, the reasons its step time is not from a measured profile (empty: measured).

    Args:
        cost_model: the run's cost model (``describe()["kind"]`` analytic or profiled).
        jobs: the run's ``Job`` objects (``model``, ``member``, ``num_gpus``).
        gpu: the cluster's GPU type.
        cost_model_name: the ``--cost-model`` value (``auto``, ``profiled``, ``roofline``).
    """
    if cost_model.describe().get("kind") != "profiled":
        from tlora_sim.sim.costmodel.profiled.artifact import artifact_path

        why = "roofline" if artifact_path(gpu).is_file() and cost_model_name == "roofline" else "roofline:gpu"
        return [(why,)] * len(jobs)
    memo: dict = {}
    out = []
    for j in jobs:
        key = (j.model, j.member, j.num_gpus)
        r = memo.get(key)
        if r is None:
            r = memo[key] = tuple(cost_model.predict(j.model, gpu, (j.member,), j.num_gpus, "alone").reasons)
        out.append(r)
    return out


#: share of a run's job GPU-time in host-bound jobs above which ``host_bound_text`` prints a note:
#: from a quarter on, the host part of the step model (host-bound held-out points off by a median
#: 14-28% on five lent H200 hosts with the shipped artifact, 4-10% calibrated there;
#: profiler/data/validation/README.md, "How repeatable a point is")
#: can move the run's average JCT by several percent
HOST_BOUND_NOTE = 0.25


def job_host_shares(cost_model, jobs: Sequence, gpu: str) -> list[float] | None:
    """Per job, the share of its isolated step (plan ``alone``, its GPU count) that follows the host
    CPU under the run's profiled model: the elasticity of the predicted step time to the host speed
    (``sim/costmodel/profiled/calibrated.py`` ``host_share``: host terms x (1 + ``HOST_STEP``),
    ``with_host_speed``).
    0: GPU-bound; 1: all host (kernel launches, Python). None where the model is not profiled (the
    roofline has no host term) or does not expose its artifact.

    Args:
        cost_model: the run's cost model.
        jobs: the run's ``Job`` objects (``model``, ``member``, ``num_gpus``).
        gpu: the cluster's GPU type.
    """
    art = getattr(cost_model, "artifact", None)
    if cost_model.describe().get("kind") != "profiled" or not isinstance(art, dict):
        return None
    from tlora_sim.sim.costmodel.profiled.calibrated import HOST_STEP, host_share, with_host_speed
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    slow = ProfiledCostModel(with_host_speed(art, 1 + HOST_STEP), checkpointing=getattr(cost_model, "checkpointing", True))
    memo: dict = {}
    out = []
    for j in jobs:
        key = (j.model, j.member, j.num_gpus)
        if key not in memo:
            t0 = cost_model.step_time_s(j.model, gpu, (j.member,), j.num_gpus, "alone")
            t1 = slow.step_time_s(j.model, gpu, (j.member,), j.num_gpus, "alone")
            memo[key] = host_share(t0, t1)
        out.append(memo[key])
    return out


def host_bound_gpu_time_share(cost_model, jobs: Sequence, gpu: str, jobs_df) -> float | None:
    """The share of the run's job GPU-time (``gpu_time_shares``, from ``jobs_df``, ``jobs.csv``'s
    rows in job order) in jobs whose step alone is host-bound (``job_host_shares`` >=
    ``HOST_BOUND_SHARE``); None where ``job_host_shares`` is (not a profiled model)."""
    from tlora_sim.sim.costmodel.profiled.calibrated import HOST_BOUND_SHARE

    host = job_host_shares(cost_model, jobs, gpu)
    if host is None:
        return None
    return gpu_time_shares(jobs_df, [("host_bound",) if h >= HOST_BOUND_SHARE else () for h in host])[1]


def host_bound_text(shares_by_policy: dict[str, float | None], cost_model: str, gpu: str) -> str | None:
    """The host-bound note of a replay or comparison, or None when no policy's host-bound GPU-time
    share (``host_bound_gpu_time_share``) exceeds ``HOST_BOUND_NOTE``.

    A job is host-bound where half or more of its step alone follows the host CPU
    (``job_host_shares`` >= ``sim/costmodel/profiled/calibrated.py`` ``HOST_BOUND_SHARE``): its step time is the
    host floor the profile measured on one machine, which moves with the host CPU and software
    stack. A share that differs across policies is printed as its range."""
    vals = [v for v in shares_by_policy.values() if v is not None]
    if not vals or max(vals) <= HOST_BOUND_NOTE:
        return None
    calibrated = "-cal-" in str(cost_model)
    return (f"host-bound: {_pct_range(vals)} of simulated GPU-time is in jobs whose step alone is host-bound (half "
            f"or more of it follows the host CPU: launches, Python; cost model {cost_model}), whose time moves with "
            f"the {gpu} host's CPU and software stack. On five lent H200 hosts such steps were off by 14-28% "
            "(held-out median) with the shipped artifact and 4-10% with one calibrated on the machine "
            "(profiler/data/validation/README.md); "
            + ("this artifact is calibrated: `tlora-sim costmodel show --artifact FILE` prints its host-bound "
               "held-out error." if calibrated else
               "calibrate on the machine whose answer you want: `tlora-sim costmodel calibrate --gpu-name auto "
               "--out FILE`, then `--artifact FILE`."))


def gpu_time_shares(jobs_df, reasons: list[tuple[str, ...]]) -> tuple[dict[str, float], float]:
    """(share of job GPU-time per reason, share with any reason), from ``jobs.csv``'s
    ``num_gpus``, ``start_time_s``, ``finish_time_s`` (rows in job order, as ``reasons``)."""
    import numpy as np

    start = jobs_df["start_time_s"].to_numpy(dtype=float)
    finish = jobs_df["finish_time_s"].to_numpy(dtype=float)
    end = np.nanmax(finish) if np.isfinite(finish).any() else (np.nanmax(start) if np.isfinite(start).any() else 0.0)
    held = np.where(np.isfinite(finish), finish, end) - start
    gt = np.where(np.isfinite(held) & (held > 0), held, 0.0) * jobs_df["num_gpus"].to_numpy(dtype=float)
    total = float(gt.sum())
    if total <= 0:
        return {}, 0.0
    by: dict[str, float] = {}
    anyr = 0.0
    for g, rs in zip(gt.tolist(), reasons):
        if rs:
            anyr += g
        for r in rs:
            by[r] = by.get(r, 0.0) + g
    return {r: by[r] / total for r in sorted(by) if by[r] > 0}, anyr / total


def explain(reason: str, gpu: str, gpus_per_node: int) -> tuple[str, str, str]:
    """(what rests on the unmeasured term, what was measured, what would measure it), in words."""
    g = max(int(gpus_per_node), 2)
    prof = "`python -m tlora_sim.profiler.multigpu --gpus {n} --out DIR` on a host with {n} {gpu} GPUs, then " \
           "`tlora-sim costmodel fit-multigpu`"
    if reason == "multigpu:gpus>2":
        return ("jobs on more than 2 GPUs", "profiled up to 2 GPUs", prof.format(n=g, gpu=gpu) + " measures it")
    if reason == "multigpu:inter-node":
        return (f"jobs across nodes (more than {g} GPUs)", "profiled within one host",
                "a profile across hosts would measure it (the profiler runs on one host today)")
    if reason in ("multigpu:gpu", "multigpu:unmeasured"):
        return (f"multi-GPU jobs on {gpu}", "collectives profiled on another GPU type",
                prof.format(n=2, gpu=gpu) + " measures it")
    if reason == "multigpu:pp":
        return ("pipeline-parallel plans", "never profiled", prof.format(n=g, gpu=gpu) + " with pipeline plans measures it")
    if reason.startswith("multigpu:host_scale_of_fused:"):
        plan = reason.rsplit(":", 1)[1]
        return (f"multi-GPU host time of plan {plan}", "scaled from the fused plan's",
                prof.format(n=2, gpu=gpu) + f" with plan {plan} measures it")
    if reason in ("layer", "head"):
        part = "decoder layer" if reason == "layer" else "embedding and LM head"
        return (f"{part} mixes outside the profiled grid (tokens, ranks, adapters)",
                f"profiled grid of profiler/data/profile_{gpu.lower()}.csv",
                f"`tlora-sim profile --out DIR` on an {gpu} with a wider grid, then `tlora-sim costmodel fit` measures it")
    if reason.startswith("analytic_plan:"):
        plan = reason.split(":", 1)[1]
        return (f"plan {plan}", "not profiled (fused plan x roofline ratio)",
                f"`tlora-sim profile --plans {plan} --out DIR` on an {gpu} measures it")
    if reason == "lorafusion:max_rank<16":
        return ("LoRAFusion mixes with ranks below 16", "its kernels cannot run them", "nothing can: priced as fused")
    if reason == "roofline":
        return ("every step (--cost-model roofline)", f"a measured {gpu} profile exists but is not used",
                "`--cost-model auto` uses it")
    if reason.startswith("roofline:"):
        what = "GPU type" if reason == "roofline:gpu" else "base model"
        return (f"every step ({what} {gpu if what == 'GPU type' else ''} has no measured profile: roofline model)".replace("  ", " "),
                "no profile of it", f"`tlora-sim profile --out DIR` on an {gpu}, then `tlora-sim costmodel fit --gpu {gpu}` "
                                    f"measures it")
    return (reason, "not measured", "see config.json cost_model.reasons")


def warning_text(shares_by_policy: dict[str, dict[str, float]], totals: dict[str, float], gpu: str,
                 gpus_per_node: int, cost_model: str) -> str | None:
    """The one fidelity warning of a replay or comparison, or None when every policy's extrapolated
    GPU-time share is at most ``EXTRAPOLATION_WARN`` (5%).

    ``shares_by_policy``: policy -> reason -> share; ``totals``: policy -> share with any reason.
    A share that differs across policies is printed as its range."""
    if not totals or max(totals.values()) <= EXTRAPOLATION_WARN:
        return None
    reasons = sorted({r for s in shares_by_policy.values() for r in s},
                     key=lambda r: -max(s.get(r, 0.0) for s in shares_by_policy.values()))
    parts = []
    for r in reasons:
        what, measured, how = explain(r, gpu, gpus_per_node)
        parts.append(f"{what}: {_pct_range([s.get(r, 0.0) for s in shares_by_policy.values()])} of GPU-time; "
                     f"{measured}; {how}")
    return (f"fidelity: {_pct_range(list(totals.values()))} of simulated GPU-time rests on step times no "
            f"measured profile covers (cost model {cost_model}):\n  - " + "\n  - ".join(parts))


def _pct_range(vals: list[float]) -> str:
    lo, hi = min(vals), max(vals)
    return f"{100 * hi:.0f}%" if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}-{100 * hi:.0f}%"


def validation_error(gpu: str) -> dict | None:
    """The end-to-end validation of record for ``gpu`` (``VALIDATION_RUNS``), or None where none exists.

    Returns:
        ``{"gpu", "workload", "source", "avg_jct_error": {policy: (sim - real) / real},
        "ratio_error": {policy: (sim_p / sim_independent) / (real_p / real_independent) - 1}}``
        (fractions; the ratio error is the error of the policy's avg-JCT ratio to ``independent``).
    """
    if gpu not in VALIDATION_RUNS:
        return None
    import pandas as pd

    from tlora_sim.sim.costmodel.profiled.artifact import data_dir

    rel, workload = VALIDATION_RUNS[gpu]
    path = Path(data_dir()) / "validation" / rel / "validation.csv"
    if not path.is_file():
        return None
    t = pd.read_csv(path).set_index("policy")
    err = {p: float(t.at[p, "sim_avg_jct_s"] / t.at[p, "real_avg_jct_s"] - 1) for p in t.index}
    ratio = {}
    if "independent" in t.index:
        si, ri = float(t.at["independent", "sim_avg_jct_s"]), float(t.at["independent", "real_avg_jct_s"])
        for p in t.index:
            if p != "independent":
                ratio[p] = float((t.at[p, "sim_avg_jct_s"] / si) / (t.at[p, "real_avg_jct_s"] / ri) - 1)
    return {"gpu": gpu, "workload": workload, "source": f"profiler/data/validation/{rel}/validation.csv",
            "avg_jct_error": {k: round(v, 4) for k, v in err.items() if math.isfinite(v)},
            "ratio_error": {k: round(v, 4) for k, v in ratio.items() if math.isfinite(v)}}
