"""``TLoRAConfig``: the options of ``tlora`` (and of ``tlora-ref`` and ``lookahead``, which read the
same rules), and ``Setup``: what a policy object derives from them once (order, plans, timer)."""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.discipline import check_order
from tlora_sim.policies.ordering import resolve_discipline
from tlora_sim.sim.costmodel.interface import check_plan
from tlora_sim.traces.errors import InputError

JOIN_RULES = ("residual", "throughput")
"""Values of ``TLoRAConfig.join_rule`` (``rules.residual_target``, ``rules.throughput_target``)."""

NANO_PLANS = ("fused", "lorafusion", "grouped")
"""Plans that take nano-batches (``tlora_sim.sim.costmodel.interface``): the tuner runs only there."""

SLOWDOWN_REFERENCES = ("own", "eager")
"""Values of ``TLoRAConfig.slowdown_reference``."""


@dataclass(frozen=True)
class TLoRAConfig:
    """Options of ``tlora``.

    Attributes:
        max_group_size: most adapters per super-model.
        min_gain: smallest rise of collective throughput (isolated-speed units) worth a regroup.
        order: priority order (``tlora_sim.policies.ordering``: fifo, urgency, srpt, sjf, srpt-aged;
            tLoRA's own: ``urgency``).
        backfill: ``easy`` (default), ``conservative`` or ``none`` (strict head-of-line: the first
            job that can neither join nor start stops every later start).
        ordering: legacy single option (fifo, backfill, urgency, srpt), mapped by
            ``discipline.LEGACY_ORDERING`` onto ``order``/``backfill`` and overriding them; None: unused.
        backfill_order: the order backfilling tries the later jobs in (a priority order; None:
            ``order``).
        plan_alone: plan of lone jobs when grouping is off (with grouping on every group may grow,
            so every start is in ``plan_group``); also the slowdown reference (``slowdown_reference``).
        plan_group: plan of the super-models (``fused``: our fused multi-LoRA kernel).
        slowdown_reference: what a tolerated slowdown is measured against: ``own`` (a job's
            isolated step time in the policy's own plan, ``plan_alone``: the promise as tLoRA
            states it, and what ``jobs.csv`` ``run_slowdown`` reports) or ``eager`` (its eager
            per-job LoRA step time, ``Job.isolated_step_time_s``: the old reading).
        regroup_pause_s: the regroup pause (s) a join or merge costs its group; the join test prices
            it against each member's remaining slowdown budget (0: not priced). Set it to the
            engine's ``--regroup-pause`` (default 30 s).
        window: candidates examined after the head (bounds decision time).
        grouping: co-locate at all (False = the ordering-only ablation).
        nano_batching: tune nano-batch counts.
        consolidate: merge running groups on policy ticks (node, rack, cluster tiers).
        tick_s: policy tick (s): nano-batch measurements and consolidation.
        join_rule: ``residual`` (the paper's: most residual capacity) or ``throughput`` (ours:
            largest rise of collective throughput; ``rules.throughput_target``).
    """

    max_group_size: int = 16
    min_gain: float = 0.05
    order: str = "urgency"
    backfill: str = "easy"
    ordering: str | None = None
    backfill_order: str | None = None
    plan_alone: str = "fused"
    plan_group: str = "fused"
    slowdown_reference: str = "own"
    regroup_pause_s: float = 30.0
    window: int = 64
    grouping: bool = True
    nano_batching: bool = True
    consolidate: bool = True
    tick_s: float = 600.0
    join_rule: str = "residual"

    def __post_init__(self) -> None:
        resolve_discipline(self.order, self.backfill, self.ordering)
        if self.backfill_order is not None:
            check_order(self.backfill_order)
        check_plan(self.plan_alone)
        check_plan(self.plan_group)
        if self.slowdown_reference not in SLOWDOWN_REFERENCES:
            raise InputError(f"unknown slowdown_reference {self.slowdown_reference!r}; known: "
                             f"{', '.join(SLOWDOWN_REFERENCES)}", field="slowdown_reference")
        if not 0.0 <= self.regroup_pause_s < float("inf"):
            raise InputError("tlora regroup_pause_s must be finite and >= 0", field="regroup_pause_s")


@dataclass(frozen=True)
class Setup:
    """What a tLoRA policy object derives from its config (``setup``).

    Attributes:
        order, backfill: the resolved priority order and backfilling rule.
        plan: the plan of every group it starts (``plan_group`` with grouping on, else ``plan_alone``).
        reference_plan: the plan a job's tolerated slowdown is measured against (``alone``: its
            eager step, ``Job.isolated_step_time_s``).
        pause_priced: whether the join test prices the regroup pause (grouping on, pause > 0).
        timer_s: the policy tick (s), or None when neither grouping nor nano-batching needs one.
    """

    order: str
    backfill: str
    plan: str
    reference_plan: str
    pause_priced: bool
    timer_s: float | None


def setup(config: TLoRAConfig) -> Setup:
    """The ``Setup`` of ``config``.

    Raises:
        InputError: max_group_size < 1, window < 0, tick_s <= 0, or an unknown join rule.
    """
    if config.max_group_size < 1 or config.window < 0 or config.tick_s <= 0:
        raise InputError("tlora needs max_group_size >= 1, window >= 0, tick_s > 0", field="tlora")
    order, backfill = resolve_discipline(config.order, config.backfill, config.ordering)
    if config.join_rule not in JOIN_RULES:
        raise InputError(f"unknown join rule {config.join_rule!r}; known: {', '.join(JOIN_RULES)}",
                         field="join_rule")
    plan = config.plan_group if config.grouping else config.plan_alone
    return Setup(order=order, backfill=backfill, plan=plan,
                 reference_plan=config.plan_alone if config.slowdown_reference == "own" else "alone",
                 pause_priced=config.grouping and config.regroup_pause_s > 0,
                 timer_s=config.tick_s if (config.grouping or config.nano_batching) else None)


def adopt(policy, config: TLoRAConfig) -> Setup:
    """Give ``policy`` (a tLoRA policy object: ``tlora``, ``tlora-ref``, ``lookahead``) the attributes
    the engine and the discipline read, from ``config``: ``order``, ``backfill``, ``plan`` (every
    group it starts), ``plan_alone``, ``reference_plan`` (what a job's tolerated slowdown is measured
    against) and ``timer_s``; returns the ``Setup`` they came from.

    Raises:
        InputError: as ``setup``.
    """
    s = setup(config)
    policy.order, policy.backfill, policy.plan = s.order, s.backfill, s.plan
    policy.plan_alone = s.plan if config.grouping else config.plan_alone
    policy.reference_plan = s.reference_plan
    policy.timer_s = s.timer_s
    return s
