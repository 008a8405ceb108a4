"""``independent``: the baseline. FIFO, every job alone on its requested GPUs, eager LoRA.

Strict first-come-first-served: the queue head starts as soon as its GPUs are free, and no job
passes a head that cannot start (no backfilling). Plan ``alone`` (``tlora_sim.sim.costmodel.interface``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.registry import register
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup


@dataclass(frozen=True)
class IndependentConfig:
    """No options: the baseline is fixed."""


@register("independent", IndependentConfig, "FIFO baseline: every job alone on its requested GPUs, no co-location")
class Independent:
    """FIFO, one job per allocation (see module docstring)."""

    name = "independent"
    plan = "alone"
    timer_s = None  # no timer decisions

    def __init__(self, config: IndependentConfig | None = None) -> None:
        self.config = config or IndependentConfig()

    def decide(self, snap: Snapshot) -> list[Action]:
        """Start queued jobs in arrival order until the head does not fit."""
        free = snap.free.copy()
        out: list[Action] = []
        for job in snap.queue:
            p = free.take(job.num_gpus)
            if p is None:
                break
            out.append(StartGroup((job.index,), p, self.plan))
        return out
