"""``tlora``: residual-capacity-aware grouping into elastic shared super-models (tLoRA,
arXiv 2602.07263) - the first version: greedy joins, no nano-batching or tiers yet.

Every running group has residual capacity: how much its step time may still grow before some
member exceeds its tolerated slowdown (``Job.max_slowdown``, step time in the group over the
job's isolated step time). For each queued job, in arrival order:

1. It may join a running or just-planned group with the same base model and GPU count when,
   with it added, every member stays within its slowdown bound, the group fits in memory, and
   the group's predicted collective throughput rises: Σ_i T_iso,i / T_group (isolated-speed
   units of progress per second) must exceed the group's current value plus what the job would
   do on its own now (1 if free GPUs can host it, else 0). Among such groups it takes the one
   with the largest gain.
2. Otherwise it starts alone (plan ``fused``) if its GPUs are free and every earlier job that
   needed GPUs got them (GPU admission stays FIFO, so joins, which take no GPUs, never delay the
   queue head).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.planner import Planner, PlannedGroup
from policies.registry import register
from sim.errors import InputError
from sim.jobs import Job
from sim.snapshot import Action, Snapshot


@dataclass(frozen=True)
class TLoRAConfig:
    """Options of ``tlora``.

    Attributes:
        max_group_size: most adapters per super-model.
        min_gain: smallest rise of collective throughput (isolated-speed units) worth a regroup.
    """

    max_group_size: int = 16
    min_gain: float = 0.05


@register("tlora", TLoRAConfig, "tLoRA: residual-capacity-aware grouping within each job's tolerated slowdown")
class TLoRA:
    """Greedy residual-capacity-aware grouping (see module docstring)."""

    name = "tlora"
    plan = "fused"

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        self.config = config or TLoRAConfig()
        # Memo of pure cost-model answers: group id -> (version, {member: (step with it, fits)}).
        self._memo: dict[int, tuple[int, dict]] = {}
        if self.config.max_group_size < 1:
            raise InputError("tlora max_group_size must be >= 1", field="max_group_size")

    def collective_rate(self, snap: Snapshot, members: list[Job], step_s: float) -> float:
        """Σ isolated step time / group step time: progress in isolated-speed units per second."""
        return sum(j.isolated_step_time_s for j in members) / step_s

    def within_slowdown(self, members: list[Job], step_s: float) -> bool:
        """Every member's step time in the group within its tolerated slowdown."""
        return all(step_s <= j.max_slowdown * j.isolated_step_time_s * (1 + 1e-12) for j in members)

    def join_gain(self, snap: Snapshot, g: PlannedGroup, job: Job, alone_rate: float) -> float | None:
        """Throughput gain of adding ``job`` to ``g``, or None if a constraint fails."""
        if len(g.members) >= self.config.max_group_size:
            return None
        # Residual capacity: the step time only grows when a member joins, so a group already at
        # (or past) its tightest member's bound, or at the newcomer's, cannot take it.
        now_step = g.step_time_s(snap, self.plan)
        bound = min(g.slowdown_bound_s(snap, self.plan), job.max_slowdown * job.isolated_step_time_s)
        if now_step >= bound:
            return None
        new_step, fits = self._with(snap, g, job)
        if not fits or new_step > bound * (1 + 1e-12):
            return None
        now_rate = self.collective_rate(snap, g.members, now_step)
        gain = self.collective_rate(snap, g.members + [job], new_step) - now_rate - alone_rate
        return gain if gain > self.config.min_gain else None

    def _with(self, snap: Snapshot, g: PlannedGroup, job: Job) -> tuple[float, bool]:
        """(step time, fits in memory) of ``g`` with ``job`` added, memoised for unchanged running groups."""
        memo = None
        if g.group_id is not None and not g.added:
            ver, memo = self._memo.get(g.group_id, (None, None))
            if ver != g.version:
                memo = {}
                self._memo[g.group_id] = (g.version, memo)
            hit = memo.get(job.member)
            if hit is not None:
                return hit
        out = (g.step_time_s(snap, self.plan, job), g.fits(snap, self.plan, job))
        if memo is not None:
            memo[job.member] = out
        return out

    def decide(self, snap: Snapshot) -> list[Action]:
        """Join where throughput rises within every bound, else start alone in FIFO order."""
        plan = Planner(snap, self.plan)
        self._memo = {gid: m for gid, m in self._memo.items() if gid in snap.groups}
        fifo_open = True
        # A job of the same shape as one that found no group, with nothing planned since, finds none either.
        no_group: dict[tuple, int] = {}
        for job in snap.queue:
            can_start = fifo_open and plan.free.find(job.num_gpus) is not None
            shape = (job.model, job.num_gpus, job.rank, job.batch_size, job.seq_len, job.max_slowdown,
                     job.isolated_step_time_s, can_start)
            if no_group.get(shape) == plan.version:
                if not can_start:
                    fifo_open = False
                    continue
                plan.start(job)
                continue
            best, best_gain = None, 0.0
            for g in plan.candidates(job):
                gain = self.join_gain(snap, g, job, 1.0 if can_start else 0.0)
                if gain is not None and gain > best_gain:
                    best, best_gain = g, gain
            if best is not None:
                plan.join(best, job)
                continue
            no_group[shape] = plan.version
            if can_start:
                plan.start(job)
            else:
                fifo_open = False
        return plan.actions()
