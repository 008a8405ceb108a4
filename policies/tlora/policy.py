"""``tlora``: residual-capacity-aware grouping into elastic shared super-models (tLoRA,
arXiv 2602.07263), with rank-aware nano-batching: the rules of ``rules.py`` wired to the speed
machinery of ``index.py``.

Each decision (``TLoRA.decide``):

1. **Queue order**: by urgency, then isolated runtime (the order at wait 0+), then tolerated
   slowdown (``order="urgency"``; ``rules.queue_order``, here an array sort, ``queue.QueueTable``).
2. **Consolidation** on policy ticks (``rules.consolidate``; ``TLoRAIndex.consolidate``): running
   groups of one kind merge pairwise where the merge keeps every bound and beats the two apart
   plus the value of the freed GPUs; pairs on one node first, then within a rack, then across
   the cluster.
3. **Grouping from the head** (``rules.walk_queue``; ``walk.walk``): each head joins the running
   or planned group with the most residual capacity that accepts it (``rules.residual_target``;
   ``TLoRAIndex.join_target``), else starts on free GPUs while GPU admission is open; after each
   placement a binary cut over the next jobs of its kind finds the largest prefix that may join
   (``rules.join_window``).
4. **Nano-batching** (``rules.settle_nano``; ``tune.Tuners``): each group's nano-batch count
   follows ``NanoBatchTuner`` (AIMD), once per tick.
5. EASY backfilling (``ordering.backfill_starts``), and the first starts the promise's pause test
   reads (``promise.Promise``).

The decisions are those of ``tlora-ref`` (``reference.py``: the rules alone, every group and pair
examined in every decision): ``tests/policies/test_tlora_reference.py`` and ``tests/policies/test_tlora_incremental.py``
compare whole simulations, and the replay benchmark's output hashes match those from before the
index. With ``grouping=False`` only the ordering and the fused kernel remain: every job runs alone
(the ablation that separates the gain of grouping from the gain of ordering).
"""

from __future__ import annotations

from typing import Sequence

from tlora_sim.policies.ordering import backfill_starts, order_queue
from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora import rules
from tlora_sim.policies.tlora.config import NANO_PLANS, TLoRAConfig, adopt
from tlora_sim.policies.tlora.index import TLoRAIndex
from tlora_sim.policies.tlora.promise import Promise
from tlora_sim.policies.tlora.queue import QueueTable
from tlora_sim.policies.tlora.tune import Tuners
from tlora_sim.policies.tlora.walk import walk
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, Snapshot

__all__ = ["TLoRA", "TLoRAConfig"]


@register("tlora", TLoRAConfig, "tLoRA: urgency-ordered, residual-capacity-aware elastic super-models, "
                                 "binary-cut grouping, node/rack/cluster tiers, AIMD nano-batching")
class TLoRA:
    """Residual-capacity-aware grouping (see module docstring).

    Attributes:
        config: its ``TLoRAConfig``; ``plan``, ``order``, ``backfill``, ``reference_plan``,
            ``timer_s``: what it derives from it (``config.Setup``).
        promise: the promise's state (``promise.Promise``); ``job_bound_s`` is its bound.
        index: the speed machinery (``index.TLoRAIndex``); ``tuners``: the nano-batch tuners.
        index_queue: walk the queue through the index on engine snapshots (False: the plain
            ``rules.walk_queue``, same decisions).
        defer_idle: an engine decision with an empty queue between ticks returns no action at once
            and leaves its changed groups to be noted with the next decision's (False: note them
            now). Exact: such a decision can plan nothing and keeps no join answer, and the tuners and
            the index read a group's latest state, which changes only with the group marked changed
            again.
    """

    name = "tlora"
    plan = "fused"  # the default of ``plan_group``; each instance sets its own
    index_queue = True
    defer_idle = True

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        self.config = config or TLoRAConfig()
        self._setup = adopt(self, self.config)  # order, backfill, plan(s), reference_plan, timer_s
        self._reset()

    def _reset(self) -> None:
        """Forget every per-simulation memo and tuner (called at construction, and when time runs
        backwards: the policy object is serving a new simulation)."""
        self.promise = Promise(self.reference_plan, self._setup.pause_priced)
        self.job_bound_s = self.promise.job_bound_s
        self.merge_memo: dict[int, tuple[int, dict]] = {}  # group id -> (version, {nano: {members: (step, fits)}})
        self.index = TLoRAIndex(self)
        self.tuners = Tuners(self.plan, self.job_bound_s)
        self._pause_s = self.config.regroup_pause_s if self._setup.pause_priced else None
        self._last_tick = float("-inf")
        self._last_now = float("-inf")
        self._queue_table = QueueTable(self.job_bound_s)
        self._idle_changed: set[int] = set()  # groups changed in deferred idle decisions (``decide``)
        self.budget_refusals = 0
        """How many times ``merge_ok`` refused at the pause test (``Promise.budget_ok``): the only part
        of the join test that depends on the time and on the newcomers' step counts. The index keeps
        a refusal (or an answer built from refusals) only when this did not move while it was
        reached, and keeps no acceptance with the pause priced (``index.TLoRAIndex``)."""

    # ---- the rules, with the merged step times memoised -----------------------------------------
    collective_rate = staticmethod(rules.collective_rate)

    def merge_ok(self, snap: Snapshot, g: PlannedGroup, extra: list[Job], apart_rate: float, *,
                 bound_extra: float | None = None, key: tuple | None = None) -> bool:
        """``rules.merge_ok`` with this policy's terms and ``merged`` (``bound_extra``, ``key``: the
        newcomers' tightest bound and cost-model members, for a caller asking about them often)."""
        cfg = self.config
        return rules.merge_ok(snap, g, extra, apart_rate, plan=self.plan, max_group_size=cfg.max_group_size,
                              min_gain=cfg.min_gain, bound_of=self.job_bound_s, pause_s=self._pause_s,
                              budget=self._budget_ok, merged=self.merged, bound_extra=bound_extra, key=key)

    def _budget_ok(self, snap: Snapshot, members: list, step_s: float, pause_s: float) -> bool:
        """``Promise.budget_ok``, counting its refusals (``budget_refusals``)."""
        ok = self.promise.budget_ok(snap, members, step_s, pause_s)
        if not ok:
            self.budget_refusals += 1
        return ok

    def merged(self, snap: Snapshot, g: PlannedGroup, extra: Sequence[Job], bound_s: float = float("inf"),
               key: tuple | None = None) -> tuple[float, bool]:
        """``rules.merged_step``, memoised per running group membership version and nano-batch count,
        keeping every count the group ran at (the tuner's probes return to the best count, and the
        answers at it are still good; the cost model is pure, so the memo never changes an answer).
        Memory is predicted only when the step time is within ``bound_s``."""
        if key is None:
            key = tuple(j.member for j in extra)
        if g.group_id is None or g.added:
            return rules.merged_step(snap, g, extra, bound_s, key, plan=self.plan)
        ver, by_nano = self.merge_memo.get(g.group_id, (None, None))
        if ver != g.version:
            by_nano = {}
            self.merge_memo[g.group_id] = (g.version, by_nano)
        memo = by_nano.get(g.nano_batches)
        if memo is None:
            memo = by_nano[g.nano_batches] = {}
        hit = memo.get(key)
        if hit is not None and (hit[1] is not None or hit[0] > bound_s * (1 + rules.TOL)):
            return hit[0], bool(hit[1])
        members = [j.member for j in g.members] + list(key)
        step = snap.step_time_s(g.model, members, g.n_gpus, self.plan, g.nano_batches)
        fits = snap.fits_memory(g.model, members, g.n_gpus, self.plan) if step <= bound_s * (1 + rules.TOL) else None
        memo[key] = (step, fits)
        return step, bool(fits)

    # ---- decision ------------------------------------------------------------------------------
    def decide(self, snap: Snapshot) -> list[Action]:
        """Order, consolidate, group from the head, tune nano-batches, backfill (module docstring)."""
        if snap.now_s < self._last_now:
            self._reset()
        self._last_now = snap.now_s
        self.promise.use_cost_model(snap)
        tick = snap.now_s - self._last_tick >= self.config.tick_s
        if self.defer_idle and not tick and not snap.queue and snap.changed is not None:
            # nothing to walk and no tick: no action is possible, and every answer this decision
            # could keep is read later; its changes are noted with the next decision's
            self._idle_changed |= snap.changed
            self.index.stamp += 1
            return []
        changed = snap.changed
        if self._idle_changed:
            if changed is not None:
                changed = self._idle_changed | changed
            self._idle_changed = set()
        ix = self.index
        ix.note_changes(snap, changed)
        plan = Planner(snap, self.plan, ix.protos, bound_of=self.job_bound_s)
        ix.prune(snap)
        indexed = self.index_queue and snap.kinds is not None and bool(snap.queue)  # nothing to walk
        if indexed:
            order = self._queue_table.order(snap.queue, self.order, snap.now_s)
            smallest_wait = order.min_gpus()
        else:
            queue = order_queue(snap.queue, self.order, snap.now_s)
            smallest_wait = min((j.num_gpus for j in queue), default=None)
        if tick:
            self._last_tick = snap.now_s
            if self.config.grouping and self.config.consolidate:
                ix.consolidate(snap, plan, smallest_wait)
        if indexed:
            walk(ix, snap, plan, order)
        else:
            ix.begin_walk()
            ix.columns.close()
            rules.walk_queue(snap, plan, queue, grouping=self.config.grouping, window=self.config.window,
                             max_group_size=self.config.max_group_size,
                             target_of=lambda job, can_start: ix.join_target(snap, plan, job, can_start),
                             ok=self.merge_ok)
        actions = plan.actions()
        if self.config.nano_batching and self.plan in NANO_PLANS:
            actions += self.tuners.step(snap, tick, changed, {g.group_id for g in plan.removed_groups}
                                        | {g.group_id for g in plan.changed_groups()}, ix.live, ix.kind_of)
        if self.backfill != "none" and snap.queue:
            waiting = [order.job(p) for p in range(len(order))] if indexed else queue
            actions += backfill_starts(snap, actions, self.plan, queue=waiting, rule=self.backfill,
                                       backfill_order=self.config.backfill_order)
        self.promise.note_starts(snap, actions)
        return actions
