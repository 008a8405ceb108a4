"""``independent``: the baseline. Every job alone on its requested GPUs, eager LoRA, FIFO with EASY
backfilling.

The queue is read in the configured priority order (``order``, default arrival); the first job
that cannot start gets an EASY reservation and later jobs start where they do not delay it
(``backfill="easy"``, the default, Slurm's ``sched/backfill``; ``tlora_sim.policies.ordering``).
``backfill="none"`` is strict first-come-first-served (the old default of ``independent``: no job
passes a head that cannot start). ``independent-backfill`` is the same policy under its older
name (the reference baseline of every comparison), and ``independent-fused`` runs every job alone
on the fused kernel (``plan_alone="fused"``): the baseline that separates the kernel's gain from
co-location's. Plans: ``tlora_sim.sim.costmodel.interface``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.ordering import backfill_starts, ordered, resolve_discipline
from tlora_sim.policies.registry import register
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup
from tlora_sim.sim.costmodel.interface import check_plan


@dataclass(frozen=True)
class IndependentConfig:
    """Options of ``independent``.

    Attributes:
        order: priority order (``fifo``, ``urgency``, ``srpt``, ``sjf``; ``tlora_sim.policies.ordering``).
        backfill: ``easy`` (default), ``conservative`` or ``none`` (strict head-of-line).
        ordering: legacy single option (``fifo``, ``backfill``, ``urgency``, ``srpt``), mapped by
            ``discipline.LEGACY_ORDERING`` onto ``order``/``backfill`` and overriding them; None: unused.
        plan_alone: the execution plan every job runs in (``alone``: eager per-job LoRA).
    """

    order: str = "fifo"
    backfill: str = "easy"
    ordering: str | None = None
    plan_alone: str = "alone"

    def __post_init__(self) -> None:
        resolve_discipline(self.order, self.backfill, self.ordering)
        check_plan(self.plan_alone)


@dataclass(frozen=True)
class IndependentBackfillConfig(IndependentConfig):
    """``independent``'s options under the name of the reference baseline (same defaults)."""


@dataclass(frozen=True)
class IndependentFusedConfig(IndependentConfig):
    """``independent`` with every job alone on the fused kernel."""

    plan_alone: str = "fused"


@register("independent", IndependentConfig,
          "baseline: every job alone on its requested GPUs (eager LoRA), FIFO with EASY backfilling")
class Independent:
    """One job per allocation (see module docstring)."""

    name = "independent"
    timer_s = None  # no timer decisions

    def __init__(self, config: IndependentConfig | None = None) -> None:
        self.config = config or IndependentConfig()
        self.order, self.backfill = resolve_discipline(self.config.order, self.config.backfill, self.config.ordering)
        self.plan = self.plan_alone = self.config.plan_alone

    def decide(self, snap: Snapshot) -> list[Action]:
        """Start queued jobs in priority order until one does not fit, then the jobs the
        backfilling rule admits."""
        free = snap.free.copy()
        out: list[Action] = []
        queue = ordered(snap, self.order).queue
        for job in queue:
            p = free.take(job.num_gpus)
            if p is None:
                break
            out.append(StartGroup((job.index,), p, self.plan))
        if self.backfill != "none" and len(out) < len(queue):
            out += backfill_starts(snap, out, self.plan, queue=queue, rule=self.backfill)
        return out


@register("independent-backfill", IndependentBackfillConfig,
          "reference baseline: every job alone (eager LoRA), FIFO with EASY backfilling (Slurm's default)")
class IndependentBackfill(Independent):
    """``Independent`` under the reference baseline's name (no behaviour of its own)."""

    name = "independent-backfill"

    def __init__(self, config: IndependentBackfillConfig | None = None) -> None:
        super().__init__(config or IndependentBackfillConfig())


@register("independent-fused", IndependentFusedConfig,
          "every job alone on the fused kernel, FIFO with EASY backfilling (the kernel's gain alone)")
class IndependentFused(Independent):
    """``Independent`` with ``plan_alone="fused"`` by default (no behaviour of its own)."""

    name = "independent-fused"

    def __init__(self, config: IndependentFusedConfig | None = None) -> None:
        super().__init__(config or IndependentFusedConfig())
