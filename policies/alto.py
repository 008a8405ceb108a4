"""``alto``: ALTO's co-location of hyper-parameter sweep families (arXiv 2604.05426).

Workload: sweeps are job families (``tlora_sim.traces.sweeps``, enabled by ``--sweeps``).
ALTO's other mechanism, early exit of weak configurations, is shared by every policy
(``policies/early_exit.py``, ``--early-exit``), so a comparison gives it to all or to none.

Each decision:

1. **Co-location**: FIFO admission (or the configured ``ordering``); when the queue head belongs to a family, the family's
   queued configurations start together in one group on the head's GPUs (up to
   ``max_group_size``, within memory), executed with grouped GEMMs and rank-local adapter
   parallelism (plan ``grouped``); other jobs run alone (plan ``alone``: a grouped GEMM over one
   adapter is plain LoRA, and the ``grouped`` plan was profiled on two or more adapters only).

With ``grouping=False`` every configuration runs alone; so do the jobs EASY backfilling starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.ordering import backfill_starts, check_ordering, ordered
from tlora_sim.policies.registry import register
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup


@dataclass(frozen=True)
class ALTOConfig:
    """Options of ``alto``.

    Attributes:
        max_group_size: most configurations per group.
        grouping: co-locate families (False = the ordering-only ablation).
        ordering: queue discipline (``tlora_sim.policies.ordering``: fifo, backfill, urgency, srpt).
    """

    max_group_size: int = 16
    grouping: bool = True
    ordering: str = "fifo"

    def __post_init__(self) -> None:
        check_ordering(self.ordering)


@register("alto", ALTOConfig, "ALTO: sweep families co-located with grouped GEMMs (early exit: --early-exit, "
                               "shared by every policy)")
class ALTO:
    """Family co-location (see module docstring)."""

    name = "alto"
    plan = "grouped"

    def __init__(self, config: ALTOConfig | None = None) -> None:
        self.config = config or ALTOConfig()
        if self.config.max_group_size < 1:
            raise InputError("alto needs max_group_size >= 1", field="alto")
        self.timer_s = None

    def decide(self, snap: Snapshot) -> list[Action]:
        """FIFO (or ``ordering``) admission with family co-location."""
        out = self._admit(ordered(snap, self.config.ordering))
        if self.config.ordering == "backfill":
            out += backfill_starts(snap, out, "alone")
        return out

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
            out.append(StartGroup(tuple(j.index for j in members), placement,
                                  self.plan if len(members) > 1 else "alone"))
        return out
