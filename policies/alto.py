"""``alto``: ALTO's hyper-parameter sweeps with early exit and co-located survivors
(arXiv 2604.05426).

Workload: sweeps are job families (``tlora_sim.traces.sweeps``, enabled by ``--sweeps``); each
configuration's loss follows the documented synthetic model ``tlora_sim.traces.sweeps.loss_at``.

Each decision (also on a policy tick every ``tick_s``):

1. **Early exit**: for every family with running configurations, a configuration is *weak* when
   its loss exceeds the family's best running loss by more than ``gap`` (relative) after at least
   ``min_progress`` of its steps; a configuration weak on ``patience`` consecutive ticks is
   stopped (``StopMembers``), keeping at least ``keep`` configurations per family.
2. **Co-location**: strict FIFO admission; when the queue head belongs to a family, the family's
   queued configurations start together in one group on the head's GPUs (up to
   ``max_group_size``, within memory), executed with grouped GEMMs and rank-local adapter
   parallelism (plan ``grouped``); other jobs run alone.

With ``grouping=False``, early exit remains and every configuration runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.ordering import backfill_starts, check_ordering, ordered
from tlora_sim.policies.registry import register
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup, StopMembers
from tlora_sim.traces.sweeps import loss_at


@dataclass(frozen=True)
class ALTOConfig:
    """Options of ``alto``.

    Attributes:
        max_group_size: most configurations per group.
        gap: relative loss gap to the family's best that counts as weak.
        patience: consecutive weak ticks before an early exit.
        min_progress: fraction of a configuration's steps before it may exit.
        keep: configurations kept per family at least.
        tick_s: policy tick (s).
        grouping: co-locate families (False = the ordering-only ablation).
        ordering: queue discipline (``tlora_sim.policies.ordering``: fifo, backfill, urgency, srpt).
    """

    max_group_size: int = 16
    gap: float = 0.05
    patience: int = 3
    min_progress: float = 0.1
    keep: int = 1
    tick_s: float = 600.0
    grouping: bool = True
    ordering: str = "fifo"

    def __post_init__(self) -> None:
        check_ordering(self.ordering)


@register("alto", ALTOConfig, "ALTO: sweeps as job families, early exit of weak configurations, "
                               "survivors co-located with grouped GEMMs")
class ALTO:
    """Early exit plus family co-location (see module docstring)."""

    name = "alto"
    plan = "grouped"

    def __init__(self, config: ALTOConfig | None = None) -> None:
        self.config = config or ALTOConfig()
        c = self.config
        if c.patience < 1 or c.keep < 1 or c.gap < 0 or c.tick_s <= 0 or c.max_group_size < 1:
            raise InputError("alto needs patience >= 1, keep >= 1, gap >= 0, tick_s > 0, max_group_size >= 1",
                             field="alto")
        self.timer_s = c.tick_s
        self._strikes: dict[int, int] = {}
        self._last_tick = float("-inf")
        self.early_exits = 0

    def decide(self, snap: Snapshot) -> list[Action]:
        """Early exits on ticks, then FIFO admission with family co-location."""
        out: list[Action] = []
        if snap.now_s - self._last_tick >= self.config.tick_s:
            self._last_tick = snap.now_s
            out += self._early_exit(snap)
        admitted = self._admit(ordered(snap, self.config.ordering))
        out += admitted
        if self.config.ordering == "backfill":
            out += backfill_starts(snap, admitted, self.plan)
        return out

    def _early_exit(self, snap: Snapshot) -> list[Action]:
        c = self.config
        families: dict[str, list[tuple]] = {}
        for g in snap.groups.values():
            for job, left in zip(g.members, g.remaining_steps):
                if job.sweep_id:
                    done = job.total_steps - left
                    families.setdefault(job.sweep_id, []).append(
                        (job, g.group_id, done, loss_at(job.loss_floor, done, job.total_steps)))
        stops: dict[int, list[int]] = {}
        strikes: dict[int, int] = {}
        for runs in families.values():
            best = min(r[3] for r in runs)
            alive = len(runs)
            for job, gid, done, loss in sorted(runs, key=lambda r: (-r[3], r[0].index)):
                weak = done >= c.min_progress * job.total_steps and loss > best * (1.0 + c.gap)
                strikes[job.index] = self._strikes.get(job.index, 0) + 1 if weak else 0
                if strikes[job.index] >= c.patience and alive > c.keep:
                    stops.setdefault(gid, []).append(job.index)
                    alive -= 1
        self._strikes = strikes
        self.early_exits += sum(len(v) for v in stops.values())
        return [StopMembers(gid, tuple(ix)) for gid, ix in sorted(stops.items())]

    def _admit(self, snap: Snapshot) -> list[Action]:
        free = snap.free.copy()
        out: list[Action] = []
        taken: set[int] = set()
        for head in snap.queue:
            if head.index in taken:
                continue
            placement = free.find(head.num_gpus)
            if placement is None:
                break
            members = [head]
            if self.config.grouping and head.sweep_id:
                for j in snap.queue:
                    if (j.index not in taken and j is not head and j.sweep_id == head.sweep_id
                            and j.model == head.model and j.num_gpus == head.num_gpus
                            and len(members) < self.config.max_group_size
                            and snap.fits_memory(head.model, [m.member for m in members + [j]], head.num_gpus,
                                                 self.plan)):
                        members.append(j)
            free.take(head.num_gpus)
            taken.update(j.index for j in members)
            out.append(StartGroup(tuple(j.index for j in members), placement, self.plan))
        return out
