"""``independent``: the baseline. FIFO, every job alone on its requested GPUs, eager LoRA.

Strict first-come-first-served: the queue head starts as soon as its GPUs are free, and no job
passes a head that cannot start (no backfilling). Plan ``alone`` (``tlora_sim.sim.costmodel.interface``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.ordering import backfill_starts, check_ordering, ordered
from tlora_sim.policies.registry import register
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup


@dataclass(frozen=True)
class IndependentConfig:
    """Options of ``independent``.

    Attributes:
        ordering: queue discipline (``tlora_sim.policies.ordering``: fifo, backfill, urgency, srpt).
    """

    ordering: str = "fifo"

    def __post_init__(self) -> None:
        check_ordering(self.ordering)


@dataclass(frozen=True)
class IndependentBackfillConfig(IndependentConfig):
    """``independent`` with EASY backfilling: the reference baseline clusters run."""

    ordering: str = "backfill"


@register("independent", IndependentConfig, "FIFO baseline: every job alone on its requested GPUs, no co-location")
class Independent:
    """FIFO, one job per allocation (see module docstring)."""

    name = "independent"
    plan = "alone"
    timer_s = None  # no timer decisions

    def __init__(self, config: IndependentConfig | None = None) -> None:
        self.config = config or IndependentConfig()

    def decide(self, snap: Snapshot) -> list[Action]:
        """Start queued jobs in the configured order until one does not fit (then, with
        ``backfill``, the jobs EASY backfilling admits)."""
        free = snap.free.copy()
        out: list[Action] = []
        for job in ordered(snap, self.config.ordering).queue:
            p = free.take(job.num_gpus)
            if p is None:
                break
            out.append(StartGroup((job.index,), p, self.plan))
        if self.config.ordering == "backfill":
            out += backfill_starts(snap, out, self.plan)
        return out


@register("independent-backfill", IndependentBackfillConfig,
          "reference baseline: every job alone, FIFO with EASY backfilling (Slurm's default)")
class IndependentBackfill(Independent):
    """``Independent`` with ``IndependentBackfillConfig`` by default (no behaviour of its own)."""

    name = "independent-backfill"

    def __init__(self, config: IndependentBackfillConfig | None = None) -> None:
        super().__init__(config or IndependentBackfillConfig())
