"""``alto``: ALTO's co-location of hyper-parameter sweep families (arXiv 2604.05426).

Workload: sweeps are job families (``tlora_sim.traces.sweeps``, enabled by ``--sweeps``).
ALTO's other mechanism, early exit of weak configurations, is shared by every policy
(``policies/early_exit.py``, ``--early-exit``), so a comparison gives it to all or to none.

Each decision:

1. **Co-location**: admission in priority order (``order``, FIFO by default) with EASY
   backfilling (``backfill``, default ``easy``; ``none``: strict FIFO); when the queue head belongs to a family, the family's
   queued configurations start together in one group on the head's GPUs (up to
   ``max_group_size``, within memory), executed with grouped GEMMs and rank-local adapter
   parallelism (plan ``plan_group``, ``grouped``); other jobs run alone (plan ``plan_alone``,
   ``alone``: a grouped GEMM over one adapter is plain LoRA, and the ``grouped`` plan was profiled
   on two or more adapters only).

With ``grouping=False`` every configuration runs alone; so do the jobs EASY backfilling starts.

Ours where the paper differs: a family goes on the GPUs of its first configuration, with no
duration-aware packing of the survivors (ALTO packs them by predicted remaining duration);
``docs/policies.md`` ("Where alto deviates") gives the measured effect (0.93x the reference on the
llm-synthetic sweep workload).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.ordering import backfill_starts, ordered, resolve_discipline
from tlora_sim.policies.registry import register
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup
from tlora_sim.sim.costmodel.interface import check_plan


@dataclass(frozen=True)
class ALTOConfig:
    """Options of ``alto``.

    Attributes:
        max_group_size: most configurations per group.
        grouping: co-locate families (False = the ordering-only ablation).
        order: priority order (``fifo``, ``urgency``, ``srpt``, ``sjf``).
        backfill: ``easy`` (default), ``conservative`` or ``none`` (strict head-of-line).
        ordering: legacy single option, mapped by ``discipline.LEGACY_ORDERING`` (overrides; None: unused).
        plan_alone: plan of a configuration that runs alone (``alone``).
        plan_group: plan of a family's group (``grouped``).
    """

    max_group_size: int = 16
    grouping: bool = True
    order: str = "fifo"
    backfill: str = "easy"
    ordering: str | None = None
    plan_alone: str = "alone"
    plan_group: str = "grouped"

    def __post_init__(self) -> None:
        resolve_discipline(self.order, self.backfill, self.ordering)
        check_plan(self.plan_alone)
        check_plan(self.plan_group)


@register("alto", ALTOConfig, "ALTO: sweep families co-located with grouped GEMMs (early exit: --early-exit, "
                               "shared by every policy)")
class ALTO:
    """Family co-location (see module docstring)."""

    name = "alto"

    def __init__(self, config: ALTOConfig | None = None) -> None:
        self.config = config or ALTOConfig()
        self.order, self.backfill = resolve_discipline(self.config.order, self.config.backfill, self.config.ordering)
        self.plan = self.config.plan_group
        self.plan_alone = self.config.plan_alone
        if self.config.max_group_size < 1:
            raise InputError("alto needs max_group_size >= 1", field="alto")
        self.timer_s = None

    def decide(self, snap: Snapshot) -> list[Action]:
        """Admission in priority order with family co-location, then backfilling."""
        view = ordered(snap, self.order)
        out = self._admit(view)
        if self.backfill != "none":
            out += backfill_starts(snap, out, self.plan_alone, queue=view.queue, rule=self.backfill)
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
                                  self.plan if len(members) > 1 else self.plan_alone))
        return out
