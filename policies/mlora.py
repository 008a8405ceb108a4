"""``mlora``: FIFO packing of same-base-model jobs up to ``concurrency_num`` (mLoRA, VLDB'25).

mLoRA trains several adapters over one shared base model: one base GEMM over the concatenated
batch, the adapters in a per-adapter loop (plan ``loop``), admitting jobs first-come-first-served
up to a concurrency limit, with no check of how much each job slows down. Here: in arrival
order, each job joins the first running (or just planned) group with the same base model and GPU
count that has fewer than ``concurrency_num`` members and memory to spare; otherwise it starts a
new group on free GPUs; the first job that can do neither blocks the rest (strict FIFO).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.planner import Planner
from tlora_sim.policies.ordering import backfill_starts, check_ordering, ordered
from tlora_sim.policies.registry import register
from tlora_sim.sim.core.snapshot import Action, Snapshot


@dataclass(frozen=True)
class MLoRAConfig:
    """Options of ``mlora``.

    Attributes:
        concurrency_num: most adapters per shared base model (mLoRA's ``concurrency_num``).
        grouping: co-locate at all (False = the FIFO-only ablation: every job alone).
        ordering: queue discipline (``tlora_sim.policies.ordering``: fifo, backfill, urgency, srpt).
    """

    concurrency_num: int = 4
    grouping: bool = True
    ordering: str = "fifo"

    def __post_init__(self) -> None:
        check_ordering(self.ordering)


@register("mlora", MLoRAConfig, "mLoRA: FIFO packing of same-base-model jobs up to concurrency_num, no slowdown check")
class MLoRA:
    """FIFO packing without a slowdown check (see module docstring)."""

    name = "mlora"
    plan = "loop"
    timer_s = None  # no timer decisions

    def __init__(self, config: MLoRAConfig | None = None) -> None:
        self.config = config or MLoRAConfig()
        if self.config.concurrency_num < 1:
            from tlora_sim.traces.errors import InputError

            raise InputError("mlora concurrency_num must be >= 1", field="concurrency_num")

    def decide(self, snap: Snapshot) -> list[Action]:
        """Pack or start queued jobs in arrival order until one can do neither."""
        plan = Planner(snap, self.plan)
        for job in ordered(snap, self.config.ordering).queue:
            group = None if not self.config.grouping else next(
                (g for g in plan.open_candidates(job, self.config.concurrency_num) if g.fits(snap, self.plan, job)), None)
            if group is not None:
                plan.join(group, job)
            elif plan.start(job) is None:
                break
        out = plan.actions()
        if self.config.ordering == "backfill":
            out += backfill_starts(snap, out, self.plan)
        return out
