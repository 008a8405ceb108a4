"""``tlora-sim execute``: a scaled-down trace run for real, written as a run directory.

The workload (``sim/executor/workload.py``): the first ``--jobs`` jobs of ``--trace`` that ask for
at most ``--gpus`` GPUs, submit times and durations divided by ``--time-scale``, each job's
total steps its replay's steps divided by the same, clipped to ``[--min-steps, --max-steps]``.

The devices: ``--device cuda --gpus 1`` runs one GPU in this process on the wall clock; ``--device
cuda --gpus N`` (N > 1) starts one worker process per GPU (NCCL; ``sim/executor/workers.py``) on
the wall clock, groups side by side and a group on k GPUs data-parallel over k workers
(``sim/executor/poolloop.py``). ``--device cpu`` runs the CPU as one device on the wall clock, or
``--gpus N`` devices simulated on it on a virtual clock (``sim/executor/clock.py``), or with
``--processes`` N gloo worker processes on the wall clock (the multi-GPU code path on the CPU).

The cost model the policies plan with is the profiled model of the GPU type (``--gpu-type``; on
CUDA the device's, on the CPU H100's) with the no-checkpointing memory convention, which is how the
executor trains, and ``--memory-fraction`` of the GPU's memory. With ``--tiny`` the device trains
the tiny shape on sequences ``TINY_SEQ_DIV`` times shorter while the jobs keep their catalog model
for the policy.

The run directory has a replay's files (``config.json``, ``jobs.csv``, ``timeline.csv``,
``summary.json``, ``perf.json``, ``figures/``; times are clock seconds since the run started) plus
``steps.csv`` (every measured step and rebuild, ``runtime.STEP_COLUMNS``) and ``workload.csv``
(the exact jobs run, which ``validate-run`` replays). On one device on the wall clock (not the
virtual clock, not worker processes) with ``--probe-every S`` > 0, also ``probes.csv``: the
host-speed probe (``sim/executor/probe.py``) measured every S clock seconds between steps and
during idle waits (``probe.COLUMNS``); ``perf.json`` gets ``probes``, ``probe_s`` and
``probe_share`` (probe_s / wall_s) always (0 without probes).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.provenance import coverage, versions
from tlora_sim.sim.executor.workload import scaled_workload, workload_table
from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv, write_json
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError


@dataclass(frozen=True)
class ExecuteConfig:
    """Inputs of one executed run (``sim/executor/workload.py`` says what each scales).

    Attributes:
        trace: trace spec (as ``replay --trace``).
        policy: registered policy name.
        gpus: devices (cuda: one process for 1, one worker process per GPU for more; cpu: 1 on
            the wall clock, more simulated on the virtual clock, or ``processes``).
        time_scale: divisor of submit times, durations and total steps (> 0).
        device: ``cuda`` or ``cpu``.
        tiny: train the tiny shape.
        jobs: jobs kept (the first that ask for at most ``gpus`` GPUs, after ``skip_jobs``).
        min_steps, max_steps: bounds of each job's total steps.
        seed: LoRA attribute seed.
        lora_dist: LoRA distribution name or JSON path.
        gpu_type: GPU type of the cost model (None: the CUDA device's, H100 on the CPU).
        policy_options: policy config overrides.
        warmup: before the clock starts, one step of the policy's plan per distinct job shape and one over
            the workload's ranks (``trainer.warm_up``).
        memory_fraction: share of the GPU's datasheet memory the policies may plan with (the CUDA
            context, the allocator's fragmentation and the kernels' workspaces take the rest: at
            0.95+ an H100 ran out of memory under ``mlora``); recorded in ``config.json``'s
            ``gpu.memory_bytes``, which ``validate-run`` simulates with.
        processes: one worker process per device (``workers.WorkerPool``) on the wall clock;
            always so for ``cuda`` with ``gpus > 1``; on the CPU, gloo workers (a test of the
            multi-GPU code path).
        skip_jobs: trace jobs that fit ``gpus`` passed over before the first kept one (choose a
            stretch of the trace with multi-GPU jobs).
        artifact: a cost-model artifact file the policies plan with (e.g. from ``tlora-sim
            costmodel calibrate``) instead of the shipped one of the GPU type; its identity is
            recorded in ``config.json``'s ``cost_model``.
        trace_options: keyword arguments of ``traces.read_trace`` (``csv_columns``,
            ``time_unit``, ``time_zone``, ``slurm_states``), as ``replay`` takes them.
        probe_every_s: clock seconds between host-speed probes (``sim/executor/probe.py``, issue
            43: the host-bound floor of the eager step drifts with time on some hosts, and
            ``validate-run`` scales the host terms by the run's probes); 0: none. Probes run on
            one device on the wall clock only (not the virtual clock, not worker processes).
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
    processes: bool = False
    skip_jobs: int = 0
    artifact: str | None = None
    trace_options: dict[str, Any] = field(default_factory=dict)
    probe_every_s: float = 2.0


def uses_workers(cfg: "ExecuteConfig") -> bool:
    """Whether ``cfg`` runs one worker process per device (``--processes``, or CUDA with
    ``--gpus`` > 1)."""
    return cfg.processes or (cfg.device == "cuda" and cfg.gpus > 1)


def _device_info(device: str, name: str | None = None) -> tuple[str, dict]:
    import torch

    info = {"torch": torch.__version__, "device": device}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "none"
    if device.startswith("cuda"):
        from tlora_sim.profiler.provenance import short_gpu_name

        name = name or torch.cuda.get_device_name(0)
        info["device_name"] = name
        return short_gpu_name(name), info
    info["device_name"] = platform.processor() or platform.machine()
    return "H100", info


def warm_shapes(jobs: list, model: str) -> tuple[list, list]:
    """What ``trainer.warm_up`` steps for ``model``: (its jobs' distinct (rank, sequences, seq_len),
    sorted; their distinct ranks, sorted)."""
    mine = [j for j in jobs if j.model == model]
    return sorted({(j.rank, j.batch_size, j.seq_len) for j in mine}), sorted({j.rank for j in mine})


def check_kernels(cfg: ExecuteConfig) -> None:
    """Refuse a policy whose plan runs the Triton kernels (``fused``, ``lorafusion``, ``grouped``:
    ``trainer.IMPL``) on the CPU without ``TRITON_INTERPRET=1``, before anything is built (Triton
    compiles for a GPU only; its interpreter runs the kernels on the CPU).

    Raises:
        InputError: unknown policy, or that case.
    """
    import os

    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.executor.trainer import IMPL

    plan = make_policy(cfg.policy, cfg.policy_options).plan
    if cfg.device == "cpu" and IMPL.get(plan) == "fused" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(f"policy {cfg.policy} runs the Triton kernels (plan {plan}); on the CPU set "
                         f"TRITON_INTERPRET=1 (and use --tiny)", field="--device")


def check_probe(cfg: ExecuteConfig) -> None:
    """Refuse a ``probe_every_s`` that is negative or not finite.

    Raises:
        InputError: that case, naming ``--probe-every``.
    """
    import math

    every = cfg.probe_every_s
    if not isinstance(every, (int, float)) or not math.isfinite(every) or every < 0:
        raise InputError(f"--probe-every must be a finite number of seconds >= 0 (0: no probes), got {every}",
                         field="--probe-every")


def probes_on(cfg: ExecuteConfig, clock: str) -> bool:
    """Whether ``cfg`` probes the host speed: ``probe_every_s > 0``, one device on the wall clock
    (``clock == "wall"``) and no worker processes."""
    return cfg.probe_every_s > 0 and clock == "wall" and not uses_workers(cfg)


def check_devices(cfg: ExecuteConfig) -> None:
    """Refuse what cannot run here.

    Raises:
        InputError: an unknown device, CUDA without a GPU or with fewer GPUs than ``--gpus``, more
            worker processes than ``workers.MAX_PROCESSES``, or no torch.distributed.
    """
    from tlora_sim.sim.executor.workers import MAX_PROCESSES

    if cfg.device not in ("cuda", "cpu"):
        raise InputError(f"--device must be cuda or cpu, got {cfg.device!r}", field="--device")
    if cfg.skip_jobs < 0:
        raise InputError(f"--skip-jobs must be >= 0, got {cfg.skip_jobs}", field="--skip-jobs")
    if uses_workers(cfg) and not 1 <= cfg.gpus <= MAX_PROCESSES:
        raise InputError(f"one worker process per device: --gpus 1 to {MAX_PROCESSES}, got {cfg.gpus}",
                         field="--gpus")
    if uses_workers(cfg):
        import torch.distributed as dist

        if not dist.is_available():
            raise InputError("worker processes need torch.distributed, which this torch lacks", field="--processes")
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda but torch sees no GPU; use --device cpu --tiny for a dry run",
                             field="--device")
        if torch.cuda.device_count() < cfg.gpus:
            raise InputError(f"--gpus {cfg.gpus} but torch sees {torch.cuda.device_count()} GPU(s)", field="--gpus")


def execute(cfg: ExecuteConfig, out_dir: str | Path, *, force: bool = False, progress: bool = True,
            plots: bool = True) -> dict:
    """Run ``cfg`` for real and write its run directory (as a unit, like a replay).

    Returns:
        The summary dict (``summary.json``).

    Raises:
        InputError: bad inputs or an ``out_dir`` that may not be written (nothing is written).
        InvariantError: a policy action the executor cannot apply (nothing is written).
    """
    check_probe(cfg)
    out = check_out_dir(out_dir, force=force)
    check_devices(cfg)
    pool = None
    if uses_workers(cfg):
        from tlora_sim.sim.executor.workers import WorkerPool

        pool = WorkerPool(cfg.device, cfg.gpus, tiny=cfg.tiny)  # first: the coordinator never touches a GPU
    try:
        found, dev_info = _device_info(cfg.device, pool.device_names[0] if pool and cfg.device == "cuda" else None)
        gpu_type = cfg.gpu_type or found
        jobs, cluster, cm, dist, skipped = scaled_workload(cfg, gpu_type)
        with staged_dir(out) as stage:
            summary = _execute_into(cfg, stage, jobs, cluster, cm, dist, skipped, dev_info, progress, pool)
            if plots:
                from tlora_sim.sim.report.plots import plot_run

                plot_run(stage)
            return summary
    finally:
        if pool is not None:
            pool.close()


def _execute_into(cfg, out: Path, jobs, cluster, cm, dist, skipped, dev_info, progress: bool, pool=None) -> dict:
    from tlora_sim.policies.registry import config_of, make_policy
    from tlora_sim.sim.executor.runtime import STEP_COLUMNS, RealTimeExecutor
    from tlora_sim.sim.executor.trainer import TINY_SEQ_DIV, DeviceTrainer, warm_up
    from tlora_sim.sim.executor.workers import NO_MULTICAST

    policy = make_policy(cfg.policy, cfg.policy_options)
    trainer = pool if pool is not None else DeviceTrainer(cfg.device, tiny=cfg.tiny)
    for model in sorted({j.model for j in jobs}):
        trainer.base(model)
        if cfg.warmup and pool is not None:
            pool.warmup(model, policy.plan, *warm_shapes(jobs, model))
    if cfg.warmup and pool is None:
        for model in sorted({j.model for j in jobs}):
            warm_up(trainer, model, policy.plan, *warm_shapes(jobs, model))
    clock = "wall" if cluster.total_gpus == 1 or pool is not None else "virtual"
    probe = None
    if probes_on(cfg, clock):
        from tlora_sim.sim.executor import probe as probe_mod

        probe = probe_mod.HostProbe(cfg.device)
        probe.measure()  # its first, untimed pass and a measurement before the clock starts (steady costs in the run)
        probe_info = {"every_s": cfg.probe_every_s, "device": cfg.device, **probe_mod.PARAMS}
    else:
        probe_info = None
    workers = {"processes": pool.n, "backend": pool.backend, "device_names": pool.device_names,
               "no_multicast": dict(NO_MULTICAST)} if pool is not None else {"processes": 1}
    files = RunDir(out)
    write_json(files.config, {
        "inputs": asdict(cfg),
        "executor": {**dev_info, "kind": "real-time", "gpu_type": cluster.gpu.name, "clock": clock,
                     "devices": cluster.total_gpus, "tiny_seq_div": TINY_SEQ_DIV if cfg.tiny else 1,
                     "probe": probe_info, **workers},
        "cluster": cluster.spec, "gpu": asdict(cluster.gpu), "policy": cfg.policy, "policy_config": config_of(policy),
        "plan": policy.plan, "trace": cfg.trace, "seed": cfg.seed, "lora_distribution": dist.to_dict(),
        "cost_model": cm.describe(), "versions": versions()})
    write_csv(files.workload, workload_table(jobs))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc=f"execute {cfg.policy}", unit="job")
    ex = RealTimeExecutor(jobs, cluster, cm, policy, trainer,
                          progress=(lambda k: bar.update(k - bar.n)) if bar else None, probe=probe,
                          probe_every_s=cfg.probe_every_s if probe is not None else 0.0)
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
               "executed": True, "device": dev_info.get("device_name"), "clock": clock,
               **metrics.summarize(jobs_df, res, cluster, flops), "skipped": skipped,
               **coverage(len(jobs), skipped, cm.describe()),
               "steps_measured": int((steps.event == "step").sum()), "regroups": int(len(pauses)),
               "regroup_pause_median_s": float(pauses.median() / 1e3) if len(pauses) else 0.0}
    if pool is not None:
        from tlora_sim.sim.executor.poolloop import REPLICA_COLUMNS

        replicas = pd.DataFrame(ex.replicas, columns=REPLICA_COLUMNS)
        write_csv(out / "replicas.csv", replicas)
        summary.update(processes=pool.n, replica_checks=int(len(replicas)),
                       replicas_identical=bool(replicas.identical.all()))
    perf = {k: summary.pop(k) for k in metrics.PERF_KEYS if k in summary}
    write_csv(files.jobs, jobs_df)
    write_csv(files.timeline, metrics.timeline_table(res, cluster))
    write_csv(files.steps, steps)
    if probe is not None:
        from tlora_sim.sim.executor.probe import COLUMNS as PROBE_COLUMNS

        write_csv(files.probes, pd.DataFrame(ex.probes, columns=PROBE_COLUMNS))
    write_json(files.summary, summary)
    wall = res.wall_s
    write_json(files.perf, {**perf, "jobs": len(jobs), "machine": platform.machine(),
                            "python": platform.python_version(), "probes": len(ex.probes), "probe_s": ex.probe_s,
                            "probe_share": ex.probe_s / wall if wall > 0 else 0.0})
    return summary
