"""``tlora-ref``: tLoRA as the plain reading of ``rules.py``, with no memo and no index: every
running group is read from the snapshot, every candidate asked and every pair of groups examined
in every decision. It decides what ``tlora`` decides (``policy.py``, the same rules through the
speed machinery of ``index.py``), much more slowly on long queues and large clusters: the tests
and ``tlora-sim compare --policies tlora,tlora-ref`` check that the two agree.

Takes ``TLoRAConfig`` (the same options as ``tlora``, and ``join_rule="throughput"`` for the plain
reading of ``lookahead``).
"""

from __future__ import annotations

from functools import partial

from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.ordering import backfill_starts
from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora import rules
from tlora_sim.policies.tlora.config import NANO_PLANS, TLoRAConfig, adopt
from tlora_sim.policies.tlora.promise import Promise
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, SetExecution, Snapshot


@register("tlora-ref", TLoRAConfig, "tLoRA as its plain rules (policies/tlora/rules.py, no memo, no index): "
                                     "the reference tlora is checked against")
class TLoRAReference:
    """The plain tLoRA policy (see module docstring). Attributes as ``TLoRA``'s: ``config``,
    ``plan``, ``order``, ``backfill``, ``reference_plan``, ``plan_alone``, ``timer_s``, ``promise``;
    ``joins`` and ``merges`` count the joins into running groups and the merges it planned."""

    name = "tlora-ref"
    plan = "fused"

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        self.config = config or TLoRAConfig()
        s = adopt(self, self.config)  # order, backfill, plan(s), reference_plan, timer_s
        self._pause_s = self.config.regroup_pause_s if s.pause_priced else None
        self._pause_priced = s.pause_priced
        self.joins = self.merges = 0
        self._reset()

    def _reset(self) -> None:
        """Forget the previous simulation (time ran backwards)."""
        self.promise = Promise(self.reference_plan, self._pause_priced)
        self._tuners: dict[int, tuple[NanoBatchTuner, tuple]] = {}  # group id -> (tuner, members it tunes)
        self._last_tick = float("-inf")
        self._last_now = float("-inf")

    def _ok(self, snap: Snapshot, g: PlannedGroup, extra: list[Job], apart_rate: float) -> bool:
        cfg = self.config
        return rules.merge_ok(snap, g, extra, apart_rate, plan=self.plan, max_group_size=cfg.max_group_size,
                              min_gain=cfg.min_gain, bound_of=self.promise.job_bound_s, pause_s=self._pause_s,
                              budget=self.promise.budget_ok)

    def _target(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool) -> PlannedGroup | None:
        """The join target of ``job`` by the configured rule, over every group of its kind."""
        cands = plan.candidates(job)
        if self.config.join_rule == "throughput":
            best = rules.throughput_target(snap, cands, job, can_start, plan=self.plan, ok=self._ok,
                                           merged=partial(rules.merged_step, plan=self.plan))
        else:
            best = rules.residual_target(snap, cands, job, can_start, plan=self.plan,
                                         bound_job_s=self.promise.job_bound_s(job), ok=self._ok)
        if best is not None and best.group_id is not None:
            self.joins += 1
        return best

    def decide(self, snap: Snapshot) -> list[Action]:
        """Order, consolidate on ticks, group from the head, tune nano-batches on ticks, backfill."""
        if snap.now_s < self._last_now:
            self._reset()
        self._last_now = snap.now_s
        promise = self.promise
        promise.use_cost_model(snap)
        for gid, g in snap.groups.items():
            promise.note_group(gid, g.members)
        tick = snap.now_s - self._last_tick >= self.config.tick_s
        plan = Planner(snap, self.plan, bound_of=promise.job_bound_s)
        queue = rules.queue_order(snap, self.order)
        if tick:
            self._last_tick = snap.now_s
            if self.config.grouping and self.config.consolidate:
                rules.consolidate(snap, plan, min((j.num_gpus for j in queue), default=None), ok=self._ok)
                self.merges += len(plan.removed_groups)
        rules.walk_queue(snap, plan, queue, grouping=self.config.grouping, window=self.config.window,
                         max_group_size=self.config.max_group_size,
                         target_of=lambda job, can_start: self._target(snap, plan, job, can_start), ok=self._ok)
        actions = plan.actions()
        if self.config.nano_batching and self.plan in NANO_PLANS:
            skip = {g.group_id for g in plan.removed_groups} | {g.group_id for g in plan.changed_groups()}
            actions += self._tune(snap, tick, skip)
        if self.backfill != "none" and snap.queue:
            actions += backfill_starts(snap, actions, self.plan, queue=queue, rule=self.backfill,
                                       backfill_order=self.config.backfill_order)
        promise.note_starts(snap, actions)
        return actions

    def _tune(self, snap: Snapshot, tick: bool, skip: set) -> list[SetExecution]:
        """One AIMD step (``rules.settle_nano``) per running group on a tick, unless it is paused or
        changes membership in this decision (``skip``: measured from the next tick, with a fresh
        tuner); a tuner starts over when its group's members change."""
        out: list[SetExecution] = []
        kept = {}
        for gid, g in snap.groups.items():
            if gid in skip:
                continue
            members = tuple(g.members)
            tuner, seen = self._tuners.get(gid, (None, None))
            if tuner is None:
                tuner = NanoBatchTuner(n=g.nano_batches)
            elif seen != members:
                tuner.reset()
                tuner.n = g.nano_batches
            if tick and g.paused_until_s <= snap.now_s:
                nxt = rules.settle_nano(snap, (g.model, g.n_gpus), members, tuner, g.nano_batches, g.micro_batches,
                                        g.step_time_s, plan=self.plan, bound_of=self.promise.job_bound_s)
                if nxt != g.nano_batches:
                    out.append(SetExecution(gid, nano_batches=nxt, micro_batches=g.micro_batches))
            kept[gid] = (tuner, members)
        self._tuners = kept
        return out
