"""``tlora-sim execute``: a scaled-down trace run for real, written as a run directory.

The workload: the trace's jobs (``--trace``, LoRA attributes drawn with ``--seed`` from
``--lora-dist``, as a replay does), keeping the first ``--jobs`` that ask for at most ``--gpus``
GPUs. ``--time-scale X`` divides their submit times (counted from the first kept job) and their
traced durations by X; each job's ``total_steps`` is the replay's (its scaled duration over its
isolated step time under the cost model) clipped to ``[--min-steps, --max-steps]``. So the
arrival pattern and the relative job sizes of the trace are kept, compressed into minutes.

The cost model is the profiled model of the GPU type (``--gpu-type``; on CUDA the device's) with
the no-checkpointing memory convention, which is how the executor trains (every layer's
activations kept), so the policies' memory checks hold on the device. With ``--tiny`` the device
trains the tiny shape (a CPU smoke run in seconds) while jobs keep their catalog model for the
policy's cost model.

The run directory has a replay's files (``config.json``, ``jobs.csv``, ``timeline.csv``,
``summary.json``, ``perf.json``; times are wall-clock seconds since the run started) plus
``steps.csv`` (every measured step and regroup pause) and ``workload.csv`` (the exact jobs run,
which ``validate-run`` replays).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv, write_json
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

#: ``workload.csv`` columns: every field of a Job but its derived member
WORKLOAD_COLUMNS = ["index", "job_id", "submit_time_s", "num_gpus", "model", "rank", "batch_size", "seq_len",
                    "total_steps", "trace_duration_s", "isolated_step_time_s", "max_slowdown", "tenant", "sweep_id",
                    "loss_floor", "loss_tau", "micro_batch_per_gpu", "grad_accum", "parallelism"]


@dataclass(frozen=True)
class ExecuteConfig:
    """Inputs of one executed run (see the module docstring for what each scales).

    Attributes:
        trace: trace spec (as ``replay --trace``).
        policy: registered policy name.
        gpus: devices (1: the executor runs one device).
        time_scale: divisor of submit times and durations (> 0).
        device: ``cuda`` or ``cpu``.
        tiny: train the tiny shape.
        jobs: jobs kept (the first that ask for at most ``gpus`` GPUs).
        min_steps, max_steps: bounds of each job's total steps.
        seed: LoRA attribute seed.
        lora_dist: LoRA distribution name or JSON path.
        gpu_type: GPU type of the cost model (None: the CUDA device's, H100 on the CPU).
        policy_options: policy config overrides.
        warmup: compile the kernels of the workload's ranks before the clock starts.
        memory_fraction: share of the GPU's datasheet memory the policies may plan with (the CUDA
            context, the allocator's fragmentation and the kernels' workspaces take the rest: at
            0.95+ an H100 ran out of memory under ``mlora``); recorded in ``config.json``'s
            ``gpu.memory_bytes``, which ``validate-run`` simulates with.
    """

    trace: str
    policy: str
    gpus: int = 1
    time_scale: float = 1000.0
    device: str = "cuda"
    tiny: bool = False
    jobs: int = 24
    min_steps: int = 3
    max_steps: int = 200
    seed: int = 0
    lora_dist: str = "tlora"
    gpu_type: str | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    warmup: bool = True
    memory_fraction: float = 0.85


def executor_cost_model(gpu_type: str):
    """The profiled model of ``gpu_type`` with the no-checkpointing memory convention.

    Raises:
        InputError: no shipped profile for that GPU type.
    """
    from tlora_sim.sim.costmodel.profiled import ProfiledCostModel, artifact_path, load_artifact

    p = artifact_path(gpu_type)
    if not p.is_file():
        raise InputError(f"no profiled cost model for {gpu_type} ({p}); the executor needs one", field="--gpu-type")
    return ProfiledCostModel(load_artifact(p), checkpointing=False)


def scaled_workload(cfg: ExecuteConfig, gpu_type: str):
    """(jobs, cluster, cost model, LoRA distribution, skipped counts) of the scaled-down run.

    Raises:
        InputError: bad inputs, or no job of the trace fits ``cfg.gpus`` GPUs.
    """
    import numpy as np

    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.core.workload import build_jobs
    from tlora_sim.traces import read_trace
    from tlora_sim.traces.lora import assign_lora, load_distribution

    if cfg.time_scale <= 0 or not cfg.min_steps >= 1 or cfg.max_steps < cfg.min_steps or cfg.jobs < 1:
        raise InputError("need --time-scale > 0, 1 <= --min-steps <= --max-steps and --jobs >= 1")
    cluster = parse_cluster(f"1x{cfg.gpus}x{gpu_type}")
    if not 0 < cfg.memory_fraction <= 1:
        raise InputError(f"memory fraction must be in (0, 1], got {cfg.memory_fraction}", field="--memory-fraction")
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=cluster.gpu.memory_bytes * cfg.memory_fraction))
    cm = executor_cost_model(gpu_type)
    frame = read_trace(cfg.trace)
    frame = frame[frame.num_gpus <= cfg.gpus].head(cfg.jobs * 4).reset_index(drop=True)
    dist = load_distribution(cfg.lora_dist)
    frame = assign_lora(frame, dist, np.random.default_rng(cfg.seed))
    jobs, skipped = build_jobs(frame, cluster, cm)
    jobs = jobs[:cfg.jobs]
    if not jobs:
        raise InputError(f"no job of {cfg.trace} fits {cfg.gpus} GPU(s)", field="--trace")
    t0, ts = jobs[0].submit_time_s, cfg.time_scale
    out = [replace(j, index=k, submit_time_s=(j.submit_time_s - t0) / ts, trace_duration_s=j.trace_duration_s / ts,
                   total_steps=int(min(max(round(j.total_steps / ts), cfg.min_steps), cfg.max_steps)))
           for k, j in enumerate(jobs)]
    return out, cluster, cm, dist, skipped


def workload_table(jobs: list[Job]) -> pd.DataFrame:
    """The jobs as ``WORKLOAD_COLUMNS``."""
    return pd.DataFrame([{c: getattr(j, c) for c in WORKLOAD_COLUMNS} for j in jobs], columns=WORKLOAD_COLUMNS)


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


def _device_info(device: str) -> tuple[str, dict]:
    import torch

    info = {"torch": torch.__version__, "device": device}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "none"
    if device.startswith("cuda"):
        from tlora_sim.profiler.provenance import short_gpu_name

        name = torch.cuda.get_device_name(0)
        info["device_name"] = name
        return short_gpu_name(name), info
    info["device_name"] = platform.processor() or platform.machine()
    return "H100", info


def _warmup(trainer, jobs: list[Job]) -> None:
    """One step of every plan's kernels over the workload's ranks per model (JIT compiles)."""
    for model in sorted({j.model for j in jobs}):
        ranks = sorted({j.rank for j in jobs if j.model == model})
        for plan in ("fused", "loop"):
            trainer.group(model, plan, [(-1 - k, r, 1, 64) for k, r in enumerate(ranks)]).step()
    trainer.states.clear()


def execute(cfg: ExecuteConfig, out_dir: str | Path, *, force: bool = False, progress: bool = True) -> dict:
    """Run ``cfg`` for real and write its run directory (as a unit, like a replay).

    Returns:
        The summary dict (``summary.json``).

    Raises:
        InputError: bad inputs or an ``out_dir`` that may not be written.
    """
    out = check_out_dir(out_dir, force=force)
    if cfg.gpus != 1:
        raise InputError(f"the executor runs one device (--gpus 1); got {cfg.gpus} (multi-GPU execution is not built)",
                         field="--gpus")
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda but torch sees no GPU; use --device cpu --tiny for a dry run",
                             field="--device")
    found, dev_info = _device_info(cfg.device)
    gpu_type = cfg.gpu_type or found
    jobs, cluster, cm, dist, skipped = scaled_workload(cfg, gpu_type)
    with staged_dir(out) as stage:
        return _execute_into(cfg, stage, jobs, cluster, cm, dist, skipped, dev_info, progress)


def _execute_into(cfg, out: Path, jobs, cluster, cm, dist, skipped, dev_info, progress: bool) -> dict:
    from tlora_sim.policies.registry import config_of, make_policy
    from tlora_sim.sim.executor.runtime import STEP_COLUMNS, RealTimeExecutor
    from tlora_sim.sim.executor.trainer import DeviceTrainer
    from tlora_sim.sim.experiments.replay import versions

    policy = make_policy(cfg.policy, cfg.policy_options)
    trainer = DeviceTrainer(cfg.device, tiny=cfg.tiny)
    for model in sorted({j.model for j in jobs}):
        trainer.base(model)
    if cfg.warmup:
        _warmup(trainer, jobs)
    files = RunDir(out)
    write_json(files.config, {
        "inputs": asdict(cfg), "executor": {**dev_info, "kind": "real-time", "gpu_type": cluster.gpu.name},
        "cluster": cluster.spec, "gpu": asdict(cluster.gpu), "policy": cfg.policy, "policy_config": config_of(policy),
        "plan": policy.plan, "trace": cfg.trace, "seed": cfg.seed, "lora_distribution": dist.to_dict(),
        "cost_model": cm.describe(), "versions": versions()})
    write_csv(files.workload, workload_table(jobs))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"execute {cfg.policy}", unit="job")
    ex = RealTimeExecutor(jobs, cluster, cm, policy, trainer,
                          progress=(lambda k: bar.update(k - bar.n)) if bar else None)
    try:
        res = ex.run()
    finally:
        if bar is not None:
            bar.close()
    jobs_df = metrics.jobs_table(res)
    flops = sum(r.steps_trained * cm.step_flops(j.model, (j.member,)) for j, r in zip(jobs, res.records))
    steps = pd.DataFrame(ex.log, columns=STEP_COLUMNS)
    pauses = steps[steps.event == "regroup"].ms
    summary = {"policy": cfg.policy, "trace": cfg.trace, "cluster": cluster.spec, "seed": cfg.seed,
               "executed": True, "device": dev_info.get("device_name"),
               **metrics.summarize(jobs_df, res, cluster, flops), "skipped": skipped,
               "steps_measured": int((steps.event == "step").sum()), "regroups": int(len(pauses)),
               "regroup_pause_median_s": float(pauses.median() / 1e3) if len(pauses) else 0.0}
    perf = {k: summary.pop(k) for k in metrics.PERF_KEYS if k in summary}
    write_csv(files.jobs, jobs_df)
    write_csv(files.timeline, metrics.timeline_table(res, cluster))
    write_csv(files.steps, steps)
    write_json(files.summary, summary)
    write_json(files.perf, {**perf, "jobs": len(jobs), "machine": platform.machine()})
    return summary
