"""From a trace table with LoRA attributes to simulator jobs.

Keeps the trace real: arrival, GPU count and duration come from the trace; ``total_steps`` is
chosen so that the job alone on its requested GPUs (plan ``alone``) runs for its traced duration
under the cost model: ``total_steps = max(1, round(duration_s / isolated_step_time_s))`` (so the
isolated runtime is within half a step of the traced duration).

The job's parallelism plan (``plan_job``): on one GPU ``dp1``; on several, the plan of
``sim/costmodel/parallelism.py`` with the highest training throughput (tokens/s) that fits memory,
each plan giving the job its own global batch ``micro_batch_per_gpu x dp x grad_accum`` (a
sequence is never split across data-parallel ranks). A table with ``batch_size`` instead of
``micro_batch_per_gpu`` (earlier versions) is read as sequences per GPU, ``grad_accum`` 1.

Documented skips (counted in ``summary.json`` under ``skipped``):
``oversized``: the job asks for more GPUs than the cluster has;
``memory``: the job alone does not fit in its GPUs' memory under the cost model.

Always an error (no skip): a submit time plus duration beyond ``MAX_TIME_S`` (1e12 s, ~31,700
years), where float64 seconds no longer resolve a training step. Errors name the job id, because
``row`` is the row of the submit-sorted table (the file row where the trace was already sorted).
"""

from __future__ import annotations

import pandas as pd

from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.costmodel.interface import CostModel, Member
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.jobs import Job, jobs_from_columns
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.traces.sweeps import TAU_FRACTION
from tlora_sim.traces.frame import source_of

MAX_TIME_S = 1e12
"""Largest submit + duration (s): float64 resolves ~0.1 ms there, far below any step time."""

REQUIRED = ("job_id", "submit_time_s", "duration_s", "num_gpus", "model", "rank", "micro_batch_per_gpu",
            "grad_accum", "seq_len", "max_slowdown", "tenant")


def plan_job(cost_model: CostModel, model: str, gpu: str, rank: int, micro_batch_per_gpu: int, grad_accum: int,
             seq_len: int, n_gpus: int, memory_bytes: float) -> tuple[str, int, float, bool]:
    """(parallelism, global batch, isolated step time s, fits memory) of a job alone on ``n_gpus``.

    One GPU: ``dp1``. Several: every plan of ``parallelism.candidates`` (pipelines only where
    nothing else fits) with batch ``micro_batch_per_gpu x dp x grad_accum``; the fitting plan with
    the most tokens per second sets the job's batch (ties: candidate order), and the job then runs
    the plan the cost model's planner picks for that batch, as the engine asks it (the fastest
    step that fits; never slower than the plan that set the batch). Cost models without a planner (the
    roofline) run their one plan (``parallelism()``) with ``dp = n_gpus``.
    """
    from tlora_sim.sim.costmodel.parallelism import candidates

    if n_gpus == 1 or not hasattr(cost_model, "predict"):
        b = micro_batch_per_gpu * n_gpus * grad_accum
        mem = (Member(rank, b, seq_len),)
        iso = cost_model.step_time_s(model, gpu, mem, n_gpus, "alone")
        fits = cost_model.memory_bytes(model, gpu, mem, n_gpus, "alone") <= memory_bytes
        name = cost_model.parallelism(model, gpu, mem, n_gpus, "alone") if hasattr(cost_model, "parallelism") \
            else f"dp{n_gpus}"
        return name, b, iso, fits
    best = None
    for pipeline in (False, True):
        for par in candidates(get_model(model), n_gpus, 1, pipeline):
            if pipeline != (par.kind == "pp"):
                continue
            b = micro_batch_per_gpu * par.dp * grad_accum
            p = cost_model.predict(model, gpu, (Member(rank, b, seq_len),), n_gpus, "alone", parallelism=par.name)
            if p.memory_bytes <= memory_bytes and (best is None or b * seq_len / p.step_time_s > best[0]):
                best = (b * seq_len / p.step_time_s, par.name, b, p.step_time_s)
        if best is not None:  # the batch is set; alone, the job then runs the planner's plan for it
            mem = (Member(rank, best[2], seq_len),)
            p = cost_model.predict(model, gpu, mem, n_gpus, "alone")
            return p.parallelism, best[2], p.step_time_s, p.memory_bytes <= memory_bytes
    return f"dp{n_gpus}", micro_batch_per_gpu * n_gpus * grad_accum, float("nan"), False


def build_jobs(frame: pd.DataFrame, cluster: ClusterSpec, cost_model: CostModel,
               *, strict: bool = False) -> tuple[list[Job], dict[str, int]]:
    """Turn a trace frame (``traces`` schema plus LoRA columns) into jobs.

    Args:
        frame: rows sorted by submit time with columns ``REQUIRED``.
        cluster: target cluster (GPU type and size).
        cost_model: gives the isolated step time.
        strict: raise instead of skipping.

    Returns:
        (jobs in submit order with ``index`` 0..n-1, skipped counts by reason).

    Raises:
        InputError: a missing column; an unknown base model; a time beyond ``MAX_TIME_S``; with
            ``strict``, a job that would be skipped.
    """
    if "micro_batch_per_gpu" not in frame.columns and "batch_size" in frame.columns:
        frame = frame.rename(columns={"batch_size": "micro_batch_per_gpu"})
    if "grad_accum" not in frame.columns:
        frame = frame.assign(grad_accum=1)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise InputError(f"trace table lacks column(s) {missing}", file=frame.attrs.get("path"))
    gpu, total, memory = cluster.gpu.name, cluster.total_gpus, cluster.gpu.memory_bytes
    iso_cache: dict[tuple, tuple[str, int, float, bool]] = {}
    skipped = {"oversized": 0, "memory": 0}
    n = len(frame)
    raw = {c: frame[c].to_numpy() for c in REQUIRED}  # as read, for messages
    # whole columns as Python values, converted as each job's fields are (``int``, ``float``, ``str``)
    subs, durs = (list(map(float, raw[c].tolist())) for c in ("submit_time_s", "duration_s"))
    ngpus, ranks, mbs, gas, seqs = (list(map(int, raw[c].tolist()))
                                    for c in ("num_gpus", "rank", "micro_batch_per_gpu", "grad_accum", "seq_len"))
    keys = zip(raw["model"].tolist(), ranks, mbs, gas, seqs, ngpus)
    given_steps = frame["steps"].to_numpy("float64").tolist() if "steps" in frame.columns else None  # the trace's
    kept: list[int] = []  # rows that become jobs
    steps: list[int] = []
    plans: list[tuple] = []
    for row, (sub, dur, ngpu, key) in enumerate(zip(subs, durs, ngpus, keys)):
        if not sub + dur <= MAX_TIME_S:
            raise InputError(f"job {raw['job_id'][row]!r}: submit {sub:g} s + duration {dur:g} s exceeds {MAX_TIME_S:g} s, "
                             f"beyond the time resolution of the simulation (wrong time unit?)",
                             **_where(frame, row), field="duration_s" if dur > sub else "submit_time_s")
        if ngpu > total:
            if strict:
                raise InputError(f"job {raw['job_id'][row]!r} asks for {ngpu} GPUs; cluster {cluster.spec} has "
                                 f"{cluster.total_gpus}", **_where(frame, row), field="num_gpus")
            skipped["oversized"] += 1
            continue
        plan = iso_cache.get(key)
        if plan is None:
            model, rank, mb, ga, seq, _ = key
            get_model(model)
            if mb < 1 or ga < 1:
                raise InputError(f"job {raw['job_id'][row]!r}: micro_batch_per_gpu {raw['micro_batch_per_gpu'][row]} "
                                 f"and grad_accum {raw['grad_accum'][row]} must be >= 1",
                                 **_where(frame, row), field="micro_batch_per_gpu" if mb < 1 else "grad_accum")
            plan = iso_cache[key] = plan_job(cost_model, model, gpu, rank, mb, ga, seq, ngpu, memory)
        if not plan[3]:
            if strict:
                raise InputError(f"job {raw['job_id'][row]!r} ({key[0]}, rank {raw['rank'][row]}, "
                                 f"{raw['micro_batch_per_gpu'][row]} x {raw['seq_len'][row]}-token sequences per GPU) "
                                 f"does not fit any parallelism plan on {ngpu} {gpu}", **_where(frame, row), field="num_gpus")
            skipped["memory"] += 1
            continue
        kept.append(row)
        if given_steps is not None and given_steps[row] == given_steps[row]:  # steps from the trace (not NaN)
            steps.append(int(given_steps[row]))
        else:
            steps.append(max(1, int(round(dur / plan[2]))))
        plans.append(plan)
    sweep_ids = frame["sweep_id"].to_numpy().tolist() if "sweep_id" in frame.columns else None
    floors = frame["loss_floor"].to_numpy().tolist() if "loss_floor" in frame.columns else None
    taus = frame["loss_tau"].to_numpy().tolist() if "loss_tau" in frame.columns else None
    pick = (lambda col: col) if len(kept) == n else (lambda col: [col[r] for r in kept])
    jobs = jobs_from_columns({
        "index": range(len(kept)), "job_id": list(map(str, pick(raw["job_id"].tolist()))),
        "submit_time_s": pick(subs), "num_gpus": pick(ngpus), "model": list(map(str, pick(raw["model"].tolist()))),
        "rank": pick(ranks), "batch_size": [int(p[1]) for p in plans], "seq_len": pick(seqs), "total_steps": steps,
        "trace_duration_s": pick(durs), "isolated_step_time_s": [p[2] for p in plans],
        "max_slowdown": list(map(float, pick(raw["max_slowdown"].tolist()))),
        "tenant": list(map(str, pick(raw["tenant"].tolist()))),
        "sweep_id": [None] * len(kept) if sweep_ids is None else
        [None if w is None or w == "" or w != w else str(w) for w in pick(sweep_ids)],
        "loss_floor": [0.0] * len(kept) if floors is None else list(map(float, pick(floors))),
        "loss_tau": [TAU_FRACTION] * len(kept) if taus is None else list(map(float, pick(taus))),
        "micro_batch_per_gpu": pick(mbs), "grad_accum": pick(gas), "parallelism": [p[0] for p in plans]})
    return jobs, {k: v for k, v in skipped.items() if v}


def _where(frame: pd.DataFrame, i: int) -> dict:
    """``file`` and ``row`` arguments of an InputError about row ``i`` (0-based) of ``frame``:
    the file and data row it was read from (``tlora_sim.traces.frame.source_of``), not its submit-order position."""
    file, row = source_of(frame, i)
    return {"file": file, "row": row}
