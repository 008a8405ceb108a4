"""The scaled-down workload of an executed run, and ``workload.csv`` (the exact jobs run).

``scaled_workload`` takes a trace as a replay does (``--trace``; LoRA attributes drawn with
``--seed`` from ``--lora-dist``; jobs built against the profiled cost model of the GPU type), keeps
the first ``--jobs`` jobs that ask for at most ``--gpus`` GPUs (after passing over ``--skip-jobs``
of them) and compresses them by
``--time-scale X``, exactly:

* ``submit_time_s``: (submit - the first kept job's submit) / X, so the first job arrives at 0 s
  and the arrival pattern keeps its shape;
* ``trace_duration_s``: the traced duration / X;
* ``total_steps``: the replay's steps (the traced duration over the job's isolated step time on
  the GPU type, ``sim/core/workload.py``) / X, rounded and clipped to ``[--min-steps,
  --max-steps]``, so that alone on the modelled GPU a job runs about its scaled duration;
* nothing else: GPU counts, ranks, batches, sequence lengths, tolerated slowdowns and the isolated
  step times (a property of the GPU, not of the trace) stay as built.

The load (work arriving per second of capacity) is therefore the trace's own, wherever the
clipping does not bite. On the CPU (``--tiny``) a step takes what the CPU takes, not the GPU's
time: there the scale sets the arrival pattern, ``--max-steps`` the length.

``workload.csv`` (``WORKLOAD_COLUMNS``: every field of a ``Job`` but its derived ``member``) is
what ``validate-run`` replays.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from tlora_sim.sim.core.jobs import Job
from tlora_sim.traces.errors import InputError

WORKLOAD_COLUMNS = ["index", "job_id", "submit_time_s", "num_gpus", "model", "rank", "batch_size", "seq_len",
                    "total_steps", "trace_duration_s", "isolated_step_time_s", "max_slowdown", "tenant", "sweep_id",
                    "loss_floor", "loss_tau", "micro_batch_per_gpu", "grad_accum", "parallelism"]


def executor_cost_model(gpu_type: str, artifact: str | None = None):
    """The profiled model of ``gpu_type`` with the no-checkpointing memory convention (how the
    executor trains: every layer's activations kept): the shipped artifact, or ``artifact`` (a
    file, e.g. one written by ``tlora-sim costmodel calibrate``), whose GPU type must be
    ``gpu_type``.

    Raises:
        InputError: no shipped profile for that GPU type; an unreadable or malformed artifact
            file, or one of another GPU type.
    """
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact

    if artifact:
        art = load_artifact(artifact)
        if str(art["gpu"]).upper() != str(gpu_type).upper():
            raise InputError(f"artifact {art['id']} is of GPU type {art['gpu']}, the run's is {gpu_type}",
                             file=str(artifact), field="gpu")
        return ProfiledCostModel(art, checkpointing=False)
    p = artifact_path(gpu_type)
    if not p.is_file():
        raise InputError(f"no profiled cost model for {gpu_type} ({p}); the executor needs one", field="--gpu-type")
    return ProfiledCostModel(load_artifact(p), checkpointing=False)


def scaled_workload(cfg, gpu_type: str):
    """(jobs, cluster, cost model, LoRA distribution, skipped counts) of the scaled-down run.

    Args:
        cfg: an ``ExecuteConfig`` (``trace``, ``gpus``, ``jobs``, ``skip_jobs``, ``time_scale``,
            ``min_steps``, ``max_steps``, ``seed``, ``lora_dist``, ``memory_fraction``).
        gpu_type: GPU type of the cluster and of the cost model.

    Returns:
        The jobs (index 0..n-1, scaled as the module docstring says), the cluster ``1 x gpus x
        gpu_type`` with ``memory_fraction`` of the GPU's memory, the profiled cost model, the LoRA
        distribution and the skip counts of the trace rows read.

    Raises:
        InputError: bad inputs, or no job of the trace fits ``cfg.gpus`` GPUs.
    """
    import numpy as np

    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.core.workload import build_jobs
    from tlora_sim.traces import read_trace
    from tlora_sim.traces.lora import assign_lora, load_distribution

    if not cfg.time_scale > 0:
        raise InputError(f"--time-scale must be > 0, got {cfg.time_scale}", field="--time-scale")
    if not 1 <= cfg.min_steps <= cfg.max_steps:
        raise InputError(f"need 1 <= --min-steps <= --max-steps, got {cfg.min_steps} and {cfg.max_steps}",
                         field="--max-steps")
    if cfg.jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {cfg.jobs}", field="--jobs")
    if cfg.gpus < 1:
        raise InputError(f"--gpus must be >= 1, got {cfg.gpus}", field="--gpus")
    if not 0 < cfg.memory_fraction <= 1:
        raise InputError(f"memory fraction must be in (0, 1], got {cfg.memory_fraction}", field="--memory-fraction")
    cluster = parse_cluster(f"1x{cfg.gpus}x{gpu_type}")
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=cluster.gpu.memory_bytes * cfg.memory_fraction))
    cm = executor_cost_model(gpu_type, getattr(cfg, "artifact", None))
    frame = read_trace(cfg.trace, **(getattr(cfg, "trace_options", None) or {}))
    skip = int(getattr(cfg, "skip_jobs", 0))
    fits = frame[frame.num_gpus <= cfg.gpus]
    if skip and len(fits) <= skip:
        raise InputError(f"--skip-jobs {skip} passes over every job: {cfg.trace} has {len(fits)} job(s) asking for at "
                         f"most {cfg.gpus} GPU(s)", field="--skip-jobs")
    frame = fits.iloc[skip:skip + cfg.jobs * 4].reset_index(drop=True)
    dist = load_distribution(cfg.lora_dist)
    frame = assign_lora(frame, dist, np.random.default_rng(cfg.seed))
    jobs, skipped = build_jobs(frame, cluster, cm)
    jobs = jobs[:cfg.jobs]
    if not jobs:
        raise InputError(f"no job of {cfg.trace} fits {cfg.gpus} GPU(s) of {gpu_type}", field="--trace")
    t0, ts = jobs[0].submit_time_s, cfg.time_scale
    out = [replace(j, index=k, submit_time_s=(j.submit_time_s - t0) / ts, trace_duration_s=j.trace_duration_s / ts,
                   total_steps=int(min(max(round(j.total_steps / ts), cfg.min_steps), cfg.max_steps)))
           for k, j in enumerate(jobs)]
    return out, cluster, cm, dist, skipped


def workload_table(jobs: list[Job]) -> pd.DataFrame:
    """The jobs as ``WORKLOAD_COLUMNS``."""
    return pd.DataFrame([{c: getattr(j, c) for c in WORKLOAD_COLUMNS} for j in jobs], columns=WORKLOAD_COLUMNS)


def read_workload(path) -> list[Job]:
    """The jobs of a ``workload.csv`` (inverse of ``workload_table``).

    Raises:
        InputError: a missing column.
    """
    df = pd.read_csv(path, keep_default_na=False, na_values={"sweep_id": [""]})
    missing = [c for c in WORKLOAD_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"workload.csv lacks column(s) {missing}", file=str(path))
    return jobs_from_table(df)


def jobs_from_table(df: pd.DataFrame) -> list[Job]:
    """Inverse of ``workload_table``."""
    out = []
    for r in df.to_dict("records"):
        sweep = r["sweep_id"]
        out.append(Job(int(r["index"]), str(r["job_id"]), float(r["submit_time_s"]), int(r["num_gpus"]), str(r["model"]),
                       int(r["rank"]), int(r["batch_size"]), int(r["seq_len"]), int(r["total_steps"]),
                       float(r["trace_duration_s"]), float(r["isolated_step_time_s"]), float(r["max_slowdown"]),
                       "" if r["tenant"] != r["tenant"] else str(r["tenant"]),
                       None if sweep != sweep or sweep in ("", None) else str(sweep), float(r["loss_floor"]),
                       float(r["loss_tau"]), int(r["micro_batch_per_gpu"]), int(r["grad_accum"]),
                       "" if r["parallelism"] != r["parallelism"] else str(r["parallelism"])))
    return out
