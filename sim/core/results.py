"""What an engine run produces before metrics: per-job records and the raw result
(``sim/core/engine.py`` fills them; ``sim/core/metrics.py`` and the real-time executor read them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.decision_stats import QueueDecade


@dataclass(slots=True)
class JobRecord:
    """Per-job outcome: first start, finish (s), group size history."""

    start_s: float | None = None
    finish_s: float | None = None
    max_group_size: int = 0
    group_changes: int = 0
    steps_trained: float = 0.0
    early_exit: bool = False


@dataclass
class SimResult:
    """Everything a run produced, before metrics.

    Attributes:
        jobs: the simulated jobs (index order).
        records: outcome per job index.
        timeline: rows ``(time_s, running_jobs, queued_jobs, groups, gpus_allocated, tokens_per_s,
            model_flops_per_s)``; piecewise constant from each time to the next.
        gpu_seconds_held: Σ over groups of GPUs x lifetime (GPU-s).
        events: SimPy events processed.
        decisions: policy calls; decision_time_s: their total wall time (s).
        wall_s: wall time of the run (s).
        decisions_by_queue: queue-length decade -> ``decision_stats.QueueDecade`` (decisions, their
            wall and CPU time, Σ queue length, the same for the decade's idle decisions, and the
            jobs they placed; decade 0: empty queue; d >= 1: 10^(d-1) <= length < 10^d): how
            decision cost grows with the queue (issue 20's "per-decision time flat from queue 10
            to 10,000"; the CPU time does not count other processes sharing the machine, the wall
            time does). Empty for the real-time executor.
    """

    jobs: Sequence[Job]
    records: list[JobRecord]
    timeline: list[tuple]
    gpu_seconds_held: float
    events: int
    decisions: int
    decision_time_s: float
    wall_s: float = 0.0
    groups_started: int = 0
    decisions_by_queue: dict[int, QueueDecade] = field(default_factory=dict)
    reference_step_s: Sequence[float] | None = None
    """Per job (index order): its isolated step time in the policy's own lone-job plan (s), the
    reference of ``jobs.csv`` ``run_slowdown`` (``reference_steps``); None: the eager isolated step
    (``Job.isolated_step_time_s``)."""


def reference_plan_of(policy) -> str:
    """The plan a policy's promise is measured against: its ``reference_plan`` attribute, else its
    lone jobs' plan (``plan_alone``), else ``alone`` (eager per-job LoRA)."""
    return getattr(policy, "reference_plan", None) or getattr(policy, "plan_alone", None) or "alone"


def reference_steps(jobs: Sequence[Job], cost_model, gpu: str, plan: str) -> list[float] | None:
    """Each job's isolated step time alone on its GPUs in ``plan`` (s), one cost-model call per
    distinct (model, member, GPU count); None for ``alone`` (the eager step the jobs carry)."""
    if plan == "alone":
        return None
    memo: dict[tuple, float] = {}
    out = []
    for j in jobs:
        key = (j.model, j.member, j.num_gpus)
        t = memo.get(key)
        if t is None:
            t = memo[key] = cost_model.step_time_s(j.model, gpu, (j.member,), j.num_gpus, plan)
        out.append(t)
    return out
