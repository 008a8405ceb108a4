"""``mlora``: FIFO packing of same-base-model jobs up to ``concurrency_num`` (mLoRA, VLDB'25).

mLoRA trains several adapters over one shared base model: one base GEMM over the concatenated
batch, the adapters in a per-adapter loop (plan ``loop``), admitting jobs first-come-first-served
up to a concurrency limit, with no check of how much each job slows down. Here: in priority order
(arrival by default), each job joins the first running (or just planned) group with the same base
model and GPU count that has fewer than ``concurrency_num`` members and memory to spare; otherwise
it starts a new group on free GPUs; the first job that can do neither gets an EASY reservation
(``backfill="easy"``, the default; ``none``: it blocks the rest, strict FIFO as mLoRA's own
dispatcher does).

``concurrency_num`` defaults to 2: the value of the ``dispatcher: concurrency_num`` key in the
configurations mLoRA's repository ships (TUDB-Labs/mLoRA, ``demo/lora/lora_case_1.yaml`` and the
other ``demo/*`` cases; ``mlora/config/dispatcher.py`` reads it, with no default of its own). The
study of issue 40 measured 18.63 h at 2 vs 20.54 h at 4 on ITP cluster02.

Plans: groups run ``plan_group`` (``loop``). A group may grow at any decision, so every start
of the grouping policy is in ``plan_group``; ``plan_alone`` is the plan of lone jobs when grouping
is off (the ``mlora-nogroup`` ablation; default ``loop``, a loop over one adapter).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.planner import Planner
from tlora_sim.policies.ordering import backfill_starts, ordered, resolve_discipline
from tlora_sim.policies.registry import register
from tlora_sim.sim.core.snapshot import Action, Snapshot, StartGroup
from tlora_sim.sim.costmodel.interface import check_plan
from tlora_sim.traces.errors import InputError


@dataclass(frozen=True)
class MLoRAConfig:
    """Options of ``mlora``.

    Attributes:
        concurrency_num: most adapters per shared base model (mLoRA's ``concurrency_num``,
            its repository's default 2).
        grouping: co-locate at all (False = the ordering-only ablation: every job alone).
        order: priority order (``fifo``, ``urgency``, ``srpt``, ``sjf``).
        backfill: ``easy`` (default), ``conservative`` or ``none`` (strict head-of-line).
        ordering: legacy single option, mapped by ``discipline.LEGACY_ORDERING`` (overrides; None: unused).
        plan_alone: plan of lone jobs with grouping off (``loop``).
        plan_group: plan of the groups (``loop``).
    """

    concurrency_num: int = 2
    grouping: bool = True
    order: str = "fifo"
    backfill: str = "easy"
    ordering: str | None = None
    plan_alone: str = "loop"
    plan_group: str = "loop"

    def __post_init__(self) -> None:
        resolve_discipline(self.order, self.backfill, self.ordering)
        check_plan(self.plan_alone)
        check_plan(self.plan_group)


@register("mlora", MLoRAConfig, "mLoRA: FIFO packing of same-base-model jobs up to concurrency_num, no slowdown check")
class MLoRA:
    """FIFO packing without a slowdown check (see module docstring)."""

    name = "mlora"
    timer_s = None  # no timer decisions

    def __init__(self, config: MLoRAConfig | None = None) -> None:
        self.config = config or MLoRAConfig()
        if self.config.concurrency_num < 1:
            raise InputError("mlora concurrency_num must be >= 1", field="concurrency_num")
        self.order, self.backfill = resolve_discipline(self.config.order, self.config.backfill, self.config.ordering)
        self.plan = self.config.plan_group if self.config.grouping else self.config.plan_alone
        self.plan_alone = self.plan if self.config.grouping else self.config.plan_alone

    def decide(self, snap: Snapshot) -> list[Action]:
        """Pack or start queued jobs in priority order until one can do neither, then backfill."""
        queue = ordered(snap, self.order).queue
        if not self.config.grouping:
            free = snap.free.copy()
            out: list[Action] = []
            for job in queue:
                p = free.take(job.num_gpus)
                if p is None:
                    break
                out.append(StartGroup((job.index,), p, self.plan))
        else:
            plan = Planner(snap, self.plan)
            for job in queue:
                group = next((g for g in plan.open_candidates(job, self.config.concurrency_num)
                              if g.fits(snap, self.plan, job)), None)
                if group is not None:
                    plan.join(group, job)
                elif plan.start(job) is None:
                    break
            out = plan.actions()
        if self.backfill != "none":
            out += backfill_starts(snap, out, self.plan, queue=queue, rule=self.backfill)
        return out
