"""``tlora``: residual-capacity-aware grouping into elastic shared super-models (tLoRA,
arXiv 2602.07263), with rank-aware nano-batching.

State a policy sees per job: its isolated step time, its tolerated slowdown (``Job.max_slowdown``:
step time in a group over isolated step time) and its urgency (``tlora_sim.policies.ordering``). A running
group's *residual capacity* is how much its step time may still grow before its tightest member
exceeds its bound: min_i max_slowdown_i x T_iso,i - T_group.

Each decision:

1. **Queue order**: by urgency, then residual capacity (``ordering="urgency"``).
2. **Grouping from the head**: for the first unplaced job, candidates are the later queued jobs
   with the same base model and GPU count (grouping never mixes base models). A *binary-cut
   search* over the candidate prefix finds the largest k such that the head plus the first k
   candidates, merged into the target, keep every member within its slowdown bound, fit in GPU
   memory, and raise predicted collective throughput. The target is the running group with the
   most residual capacity that can take the head (an elastic join: the group pauses for the
   regroup cost), else a new group on free GPUs if GPU admission is still open (GPU admission
   follows the queue order; a head that cannot get GPUs closes it, so joins never delay it).
   Collective throughput is Σ_i T_iso,i / T_group, progress in isolated-speed units per second;
   a merge must beat what the parts would do apart: the group's current value plus 1 for each
   joining job that could start alone on free GPUs now.
3. **Tiers, bottom-up**: on each policy tick, running groups of one base model and GPU count
   are merged pairwise where the merge keeps every bound and the merged throughput plus the
   value of the freed GPUs (1 if the queue holds a job that fits them) beats the two apart;
   pairs on one node are tried first, then within a rack, then across the cluster.
4. **Nano-batching**: each group's nano-batch count follows ``NanoBatchTuner`` (the published
   AIMD rule N <- N + 4 / N <- max(1, N // 2), fixed to compare against the best time seen and to
   re-probe), measured on the group's cost-model step time once per tick.

**Incremental work** (issue 6: a replay of a large cluster must not re-examine every pair of
groups on every tick). The policy keeps its own picture of each running group (members,
nano-batch count, step time, bound) and a per-kind log of which groups changed as grouping sees
them (``_note_changes``, from ``Snapshot.changed``). A refused merge stays refused until one side
changes; a join answer for a job shape stands until its kind changes; merged step times are kept
per membership and nano-batch count, so a tuner's probe that returns to the best count finds its
answers again. The running groups of each kind are also kept as arrays (``KindTable``, updated
as groups change), so the pairs a tick must examine are found with array operations, and under the
profiled model the batch form of its fused-plan step time (``tlora_sim.sim.costmodel.profiled.formula``; on
several GPUs ``profiled.multigpu``'s lower bound of the planner's step) evaluates every such pair,
or every join candidate of a large kind, in one call: candidates it refuses by more than its error
margin are refused without asking ``merge_ok``, which decides the rest as before. Once GPU
admission has closed, a waiting job shape that found no group is not asked again while its kind's
groups are unchanged (``QueueTable.no_target_at``), nor when every group changed since refuses its
cost-model member outright, whatever the job's own bound (``JoinSearch._no_target_by_member``;
on long queues a changed group is screened against every waiting shape in one batch call,
``tlora_column``). All of it is exact: the decisions are those of examining everything
(``tests/test_tlora_incremental.py`` compares whole simulations against the brute-force reading
under both cost models, and the replay benchmark's output hashes match those from before the
change).

With ``grouping=False`` only the ordering and the fused kernel remain: every job runs alone
(the ablation that separates the gain of grouping from the gain of ordering).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tlora_sim.policies.nanobatch import NanoBatchTuner

from tlora_sim.policies.discipline import check_order
from tlora_sim.policies.ordering import backfill_starts, order_queue, resolve_discipline
from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora.columns import ColumnScreen
from tlora_sim.policies.tlora.tables import PAIR_SCREEN_MIN, KindTable, TargetMemo, batch_refusals, group_features
from tlora_sim.policies.tlora.join import JOIN_RULES, JoinSearch
from tlora_sim.policies.tlora.promise import NANO_PLANS, SLOWDOWN_REFERENCES, Promise
from tlora_sim.policies.tlora.queue import QueueTable, QueueWalk
from tlora_sim.policies.tlora.tune import MAX_PROBES, PROBE_STEPS, NanoTuning  # noqa: F401 (re-exported)
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, Snapshot
from tlora_sim.sim.costmodel.interface import check_plan


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
            largest rise of collective throughput; ``tlora_join.py``).
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



@register("tlora", TLoRAConfig, "tLoRA: urgency-ordered, residual-capacity-aware elastic super-models, "
                                 "binary-cut grouping, node/rack/cluster tiers, AIMD nano-batching")
class TLoRA(Promise, JoinSearch, ColumnScreen, QueueWalk, NanoTuning):
    """Residual-capacity-aware grouping (see module docstring)."""

    name = "tlora"
    plan = "fused"  # the default of ``plan_group``; each instance sets its own
    index_queue = True
    """Walk the queue through ``QueueTable`` on engine snapshots (same decisions, cost flat in the
    queue length; False: the plain walk of ``_group_queue``, the reference the tests compare with)."""
    defer_idle = True
    """An engine decision with an empty queue between ticks returns no action at once and leaves
    its changed groups to be noted with the next decision's (``decide``; False: note them now, the
    reference the tests compare with). Exact: such a decision can plan nothing, keeps no join
    answer, and the tuners and the policy's picture of a group read its latest state, which only
    changes with the group marked changed again; stamps keep their order against every stamp an
    answer or a refusal was kept at."""

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        self.config = config or TLoRAConfig()
        if self.config.max_group_size < 1 or self.config.window < 0 or self.config.tick_s <= 0:
            raise InputError("tlora needs max_group_size >= 1, window >= 0, tick_s > 0", field="tlora")
        self.order, self.backfill = resolve_discipline(self.config.order, self.config.backfill,
                                                       self.config.ordering)
        self.plan = self.config.plan_group if self.config.grouping else self.config.plan_alone
        self.plan_alone = self.plan if self.config.grouping else self.config.plan_alone
        self.reference_plan = self.config.plan_alone if self.config.slowdown_reference == "own" else "alone"
        """The plan a job's tolerated slowdown is measured against (``alone``: its eager step)."""
        self._pause_priced = self.config.grouping and self.config.regroup_pause_s > 0
        if self.config.join_rule not in JOIN_RULES:
            raise InputError(f"unknown join rule {self.config.join_rule!r}; known: {', '.join(JOIN_RULES)}",
                             field="join_rule")
        self.timer_s = self.config.tick_s if (self.config.grouping or self.config.nano_batching) else None
        self._reset()

    def _reset(self) -> None:
        """Forget every per-simulation memo and tuner (called at construction, and when time runs
        backwards: the policy object is serving a new simulation)."""
        self._tuners: dict[int, tuple[NanoBatchTuner, float, tuple]] = {}
        self._steady: dict[int, tuple[int, int, float]] = {}  # group id -> (tick no., steady through tick no., step s)
        self._tick_no = 0  # ticks so far (``NanoTuning._tune``)
        self._memo: dict[int, tuple[tuple, dict]] = {}
        self._join_memo: dict[int, tuple[tuple, dict]] = {}
        self._scan_memo: dict[int, tuple[tuple, dict]] = {}
        self._target_memo = TargetMemo()  # (kind, job shape) -> (validity, answer, running-groups stamp it covers)
        self._mid_of = np.full(0, -1, np.int64)  # queue-table shape id -> its ``_target_memo`` id unable to start alone
        self._batches: dict[tuple, tuple] = {}  # (cost model id, GPU, kind) -> (cost model, FusedBatch or None)
        self._feats: dict[int, tuple] = {}  # group id -> (membership version, batch, (feature row, Σ T_iso))
        self._tables: dict[tuple, KindTable] = {}  # kind -> its running groups as arrays (``_note_changes``)
        self._job_rows: dict[tuple, tuple] = {}  # (batch id, job shape) -> (batch, feature row)
        # consolidation's change tracking (``_note_changes``)
        self._stamp = 0
        self._sig: dict[int, tuple] = {}  # group id -> (members, membership version, nano-batches, placement)
        # group id -> the group as grouping judges it: membership version, nano-batch count,
        # cached step time and bound (``Planner`` clones its copies from these)
        self._protos: dict[int, PlannedGroup] = {}
        # group id -> (member indices, step time, nano-batches, micro-batches, paused until), as of
        # its last change: what the tuner reads each tick without re-reading unchanged groups
        self._live: dict[int, tuple] = {}
        self._recent: dict[tuple[str, int], dict[int, int]] = {}  # kind -> {group id: stamp of last change}
        self._kind_of: dict[int, tuple[str, int]] = {}
        self._kind_checked: dict[tuple[str, int], tuple[float, int]] = {}
        self._last_tick = float("-inf")
        self._last_now = float("-inf")
        self._queue_table = QueueTable(self.job_bound_s)
        self._refs: dict[tuple, float] = {}  # (model, member, GPUs) -> isolated step time in ``reference_plan`` (s)
        self._ref_cm: tuple = (None, "")  # (cost model, GPU name) the reference steps are for
        self._started: dict[int, float] = {}  # job index -> first start (s), from this policy's own actions
        self._member_gid: dict[int, int] = {}  # job index -> the running group it was last seen in
        self._srows: dict = {}  # the column screens' batch rows per waiting shape (``ColumnScreen._shape_rows``)
        self.shapes_asleep = 0  # queued shapes a walk did not ask (their kept answer stood): a statistic
        self.shapes_by_member = 0  # queued shapes found without a join target unasked (by member or in bulk)
        self.columns_made = 0  # changed groups screened against every waiting shape at once (``tlora_column``)
        self.shapes_in_bulk = 0  # of those, found by one vector test for all the kind's shapes
        self._planned_all: dict[tuple, tuple] = {}
        self._idle_changed: set[int] = set()  # groups changed in deferred idle decisions (``decide``)

    # ---- predicates (pure) -------------------------------------------------------------------
    @staticmethod
    def collective_rate(members: list[Job], step_s: float) -> float:
        """Σ isolated step time / group step time: progress in isolated-speed units per second."""
        return sum(j.isolated_step_time_s for j in members) / step_s

    def merge_ok(self, snap: Snapshot, g: PlannedGroup, extra: list[Job], apart_rate: float, *,
                 bound_extra: float | None = None, key: tuple | None = None) -> bool:
        """Whether ``extra`` may join ``g``: size, every bound, memory, and throughput above ``apart_rate``.

        Cheap tests first: a group's step time only grows as members join, so a group already at
        the tightest bound of its members or of the newcomers cannot take them; memory is checked
        only for a step time within the bound. ``bound_extra`` (the newcomers' tightest bound,
        min max_slowdown x T_iso) and ``key`` (their cost-model members) may be passed in by a
        caller that tries the same newcomers against many groups.
        """
        members = g.members + extra
        if len(members) > self.config.max_group_size:
            return False
        if bound_extra is None:
            bound_extra = min(map(self.job_bound_s, extra))
        bound = min(g.slowdown_bound_s(snap, self.plan), bound_extra)
        if g.step_time_s(snap, self.plan) >= bound:
            return False
        step, fits = self._merged(snap, g, extra, bound, key)
        if step > bound * (1 + 1e-12) or not fits:
            return False
        if self.collective_rate(members, step) <= apart_rate + self.config.min_gain:
            return False
        # a group planned in this decision starts with its members: no regroup pause
        return not self._pause_priced or self.budget_ok(snap, members, step,
                                                        0.0 if g.group_id is None else self.config.regroup_pause_s)

    def _merged(self, snap: Snapshot, g: PlannedGroup, extra: list[Job],
                bound_s: float = float("inf"), key: tuple | None = None) -> tuple[float, bool]:
        """(step time, fits in memory) of ``g`` plus ``extra``; memoised per running group
        membership version and nano-batch count, keeping every count the group ran at (the tuner's
        probes return to the best count, and the answers at it are still good; the cost model is
        pure, so the memo never changes an answer). Memory is predicted only when the step time is
        within ``bound_s`` (else ``fits`` is reported False unpredicted)."""
        memo = None
        if key is None:
            key = tuple(j.member for j in extra)
        if g.group_id is not None and not g.added:
            ver, by_nano = self._memo.get(g.group_id, (None, None))
            if ver != g.version:
                by_nano = {}
                self._memo[g.group_id] = (g.version, by_nano)
            memo = by_nano.get(g.nano_batches)
            if memo is None:
                memo = by_nano[g.nano_batches] = {}
            hit = memo.get(key)
            if hit is not None and (hit[1] is not None or hit[0] > bound_s * (1 + 1e-12)):
                return hit[0], bool(hit[1])
        members = [j.member for j in g.members] + list(key)
        step = snap.step_time_s(g.model, members, g.n_gpus, self.plan, g.nano_batches)
        fits = snap.fits_memory(g.model, members, g.n_gpus, self.plan) if step <= bound_s * (1 + 1e-12) else None
        if memo is not None:
            memo[key] = (step, fits)
        return step, bool(fits)

    def binary_cut(self, snap: Snapshot, g: PlannedGroup, cands: list[Job], base_rate: float,
                   can_start: dict[int, bool]) -> int:
        """Largest k such that the first k of ``cands`` may join ``g`` (0 if none).

        Feasibility shrinks as k grows (each member adds step time), so the search halves the
        interval: O(log len(cands)) cost-model calls.
        """
        def ok(k: int) -> bool:
            apart = base_rate + sum(1.0 for j in cands[:k] if can_start.get(j.index))
            return self.merge_ok(snap, g, cands[:k], apart)

        lo, hi = 0, min(len(cands), self.config.max_group_size - len(g.members))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---- decision ------------------------------------------------------------------------------
    def decide(self, snap: Snapshot) -> list[Action]:
        """Order, group from the head, consolidate and tune nano-batches (see module docstring)."""
        if snap.now_s < self._last_now:
            self._reset()
        self._last_now = snap.now_s
        self._use_cost_model(snap)
        tick = snap.now_s - self._last_tick >= self.config.tick_s
        if self.defer_idle and not tick and not snap.queue and snap.changed is not None:
            # nothing to walk and no tick: no action is possible, and every answer this decision
            # could keep is read later; its changes are noted with the next decision's
            self._idle_changed |= snap.changed
            self._stamp += 1
            return []
        changed = snap.changed
        if self._idle_changed:
            if changed is not None:
                changed = self._idle_changed | changed
            self._idle_changed = set()
        self._note_changes(snap, changed)
        plan = Planner(snap, self.plan, self._protos, bound_of=self.job_bound_s)
        for memo in (self._memo, self._join_memo, self._scan_memo, self._feats):  # per group id: drop closed groups
            if len(memo) > 2 * len(snap.groups) + 64:
                for gid in [gid for gid in memo if gid not in snap.groups]:
                    del memo[gid]
        if len(self._target_memo) > 4096:
            self._target_memo.clear()
        if len(self._job_rows) > 4096:
            self._job_rows.clear()
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
                self._consolidate(snap, plan, smallest_wait)
        if indexed:
            self._group_queue_indexed(snap, plan, order)
        else:
            self._group_queue(snap, plan, queue)
        actions = plan.actions()
        if self.config.nano_batching and self.plan in NANO_PLANS:
            actions += self._tune(snap, tick, changed, skip={g.group_id for g in plan.removed_groups}
                                  | {g.group_id for g in plan.changed_groups()})
        if self.backfill != "none" and snap.queue:
            waiting = [order.job(p) for p in range(len(order))] if indexed else queue
            actions += backfill_starts(snap, actions, self.plan, queue=waiting, rule=self.backfill,
                                       backfill_order=self.config.backfill_order)
        self._note_starts(snap, actions)
        return actions

    def _note_changes(self, snap: Snapshot, changed_ids=None) -> None:
        """Record which running groups changed *as grouping sees them* since the previous decision
        (their members or their nano-batch count; a regroup pause alone is no change), refresh the
        policy's picture of them, and log the change per kind in the order it happened (a stamp per
        decision) for ``_consolidate`` and ``_join_target``. With no ``Snapshot.changed`` every
        group is looked at."""
        self._stamp += 1
        changed = set(changed_ids) if changed_ids is not None else set(snap.groups) | set(self._sig)
        for gid in changed:
            if gid not in snap.groups:
                kind = self._kind_of.pop(gid, None)
                self._live.pop(gid, None)
                self._sig.pop(gid, None)
                self._protos.pop(gid, None)
                if kind is not None:
                    self._recent[kind].pop(gid, None)
                    self._tables[kind].drop(gid)
                continue
            g = snap.groups[gid]
            kind = (g.model, g.n_gpus)
            prev = self._kind_of.get(gid)
            if prev != kind:  # new group (or, on hand-built snapshots, an id reused for another kind)
                if prev is not None:
                    self._recent[prev].pop(gid, None)
                    self._sig.pop(gid, None)
                    self._tables[prev].drop(gid)
                self._kind_of[gid] = kind
            members = tuple(g.members)  # the Job objects: compared by identity first, then by value
            self._live[gid] = (members, g.step_time_s, g.nano_batches, g.micro_batches, g.paused_until_s)
            if self._pause_priced:
                for j in members:
                    self._member_gid[j.index] = gid
            nano = g.nano_batches
            old = self._sig.get(gid)
            same = old is not None and old[0] == members and old[3] == g.placement
            if same and old[2] == nano:
                continue
            # an engine snapshot's step time is the very prediction grouping makes (same cost model,
            # members in the same order, plan and counts)
            engine_step = snap.changed is not None and g.micro_batches == 1 and g.plan == self.plan
            if same:  # the nano-batch count alone (a tuner's probe): same members, version and bound
                self._sig[gid] = (members, old[1], nano, g.placement)
                proto = self._protos[gid]
                proto.nano_batches = nano
                step = g.step_time_s if engine_step else \
                    snap.step_time_s(g.model, [j.member for j in members], g.n_gpus, self.plan, nano)
                proto.know_step_time(step, bound_s=proto._cached[2])
                self._tables[kind].retime(gid, step, nano)
            else:
                version = 0 if old is None else old[1] + (old[0] != members)
                self._sig[gid] = (members, version, nano, g.placement)
                proto = PlannedGroup(gid, version, g.model, g.n_gpus, g.placement, list(g.members), nano_batches=nano,
                                     bound_of=self.job_bound_s)
                if engine_step:
                    proto.know_step_time(g.step_time_s)
                step = proto.step_time_s(snap, self.plan)  # cached above, else predicted now
                self._protos[gid] = proto
                tab = self._tables.get(kind)
                if tab is None:
                    tab = self._tables[kind] = KindTable(self._batch(snap, kind))
                feats = self._features(tab.batch, proto) if tab.batch is not None else None
                iso = feats[1] if feats is not None else sum(j.isolated_step_time_s for j in proto.members)
                tab.put(gid, len(proto.members), step, proto._cached[2], iso, nano,
                        None if feats is None else feats[0],
                        tuple(j.member for j in proto.members) if tab.multi else ())
            rec = self._recent.setdefault(kind, {})
            rec.pop(gid, None)
            rec[gid] = self._stamp
            tab = self._tables[kind]
            tab.stamp[tab.slot[gid]] = self._stamp

    def _consolidate(self, snap: Snapshot, plan: Planner, smallest_wait: int | None) -> None:
        """Merge running groups pairwise; each group tries partners on its node, then its rack,
        then the cluster (smaller groups move into larger ones).

        Groups go in (size, id) order; each moves into the first partner in (tier, -size, id)
        order that ``merge_ok`` allows. A pair that was refused stays refused while neither group
        changes as grouping sees it (members, nano-batch count: ``_note_changes``), since
        ``merge_ok`` is a pure function of the two groups and of whether the freed GPUs could serve
        the queue; so a group examines only the partners that changed since it was last refused
        everywhere, and a kind where nothing changed is skipped without reading its groups.
        The pairs left are screened at once (``_pair_candidates``: the size and bound tests, and
        the batch cost model's refusals with a margin); ``merge_ok`` decides the rest in order,
        and the groups that received members in this tick are judged by ``merge_ok`` alone. The
        same merges as examining every pair, in O(changes) Python work. ``smallest_wait``: the
        fewest GPUs a queued job asks for (None: the queue is empty).
        """
        cluster = snap.cluster
        for kind, recent in [(k, rec) for k, rec in self._recent.items() if rec]:
            freed_value = 1.0 if smallest_wait is not None and smallest_wait <= kind[1] else 0.0
            last = next(reversed(recent.values()))
            chk = self._kind_checked.get(kind)
            if chk is not None and chk[1] == last and chk[0] >= freed_value:
                continue  # every pair of this kind was refused, at this freed value or a higher one, and none changed since
            if snap.kinds is not None:
                views = [self._protos[gid] for gid in snap.kinds.get(kind, ())]
            else:
                views = [g for g in plan.of_kind(kind) if g.group_id is not None and not g.added]
            views.sort(key=lambda g: (len(g.members), g.group_id))
            at = self._tables[kind].slots([v.group_id for v in views])
            cands = self._pair_candidates(kind, views, at, freed_value)
            merged_into: list[PlannedGroup] = []  # groups given members in this tick
            screens: dict[int, np.ndarray | None] = {}  # their screens over the sources (``_screen_column``)
            consumed: set[int] = set()  # ids of groups merged away or given members
            refused: list[int] = []  # sources every partner refused (indices into views)
            for i, view in enumerate(views):
                gid = view.group_id
                if gid in consumed:
                    continue
                if not merged_into and i not in cands:
                    refused.append(i)  # no partner left to ask
                    continue
                partners = [plan.group(views[j].group_id) for j in cands.get(i, ())
                            if views[j].group_id not in consumed]
                n_src = len(view.members)
                bound_src = view.slowdown_bound_s(snap, self.plan)
                # groups changed in this tick: merge_ok's cheap tests here, the batch screened the rest
                partners += [d for d in merged_into if (screens[d.group_id] is None or screens[d.group_id][i])
                             and n_src <= len(d.members) <= self.config.max_group_size - n_src
                             and d.step_time_s(snap, self.plan) < min(bound_src, d.slowdown_bound_s(snap, self.plan))]
                best = None
                if partners:
                    src = plan.group(gid)
                    node = src.placement[0][0]
                    rack = cluster.rack_of(node)
                    partners.sort(key=lambda d: (0 if d.placement[0][0] == node else
                                                 1 if cluster.rack_of(d.placement[0][0]) == rack else 2,
                                                 -len(d.members), d.group_id))
                    rate_src = self.collective_rate(src.members, src.step_time_s(snap, self.plan))
                    extra = list(src.members)
                    key = tuple(j.member for j in extra)
                    for d in partners:
                        apart = rate_src + self.collective_rate(d.members, d.step_time_s(snap, self.plan)) - freed_value
                        if self.merge_ok(snap, d, extra, apart, bound_extra=bound_src, key=key):
                            best = d
                            break
                if best is not None:
                    plan.merge(src, best)
                    consumed.update((gid, best.group_id))
                    if best not in merged_into:
                        merged_into.append(best)
                    screens[best.group_id] = self._screen_column(snap, kind, at, best, freed_value)
                else:
                    refused.append(i)
            tab = self._tables[kind]
            (tab.chk_hi if freed_value else tab.chk_lo)[at[refused]] = self._stamp
            if not merged_into:
                self._kind_checked[kind] = (freed_value, last)
        # the removals in the (size, id) order of a scan over every group (engine event order)
        plan.removed_groups.sort(key=lambda g: (len(g.removed), g.group_id))

    def _pair_candidates(self, kind: tuple, views: list[PlannedGroup], at: np.ndarray,
                         freed_value: float) -> dict[int, list[int]]:
        """For each source ``views[i]``, the partners (indices into ``views``, ascending) left to
        ask ``merge_ok`` about, as of the start of the tick: pairs where one side changed since
        the source was last refused everywhere, that pass ``merge_ok``'s size and bound tests,
        and that the batch cost model (``tlora_sim.sim.costmodel.profiled.formula``, where it applies) does not refuse by
        more than its margin (merged step time over the bound, or collective throughput short of
        what the two do apart). ``at``: the views' slots in the kind's table. Sources with no
        partner left are absent."""
        g = len(views)
        if g < 2:
            return {}
        tab = self._tables[kind]
        size, step, bound = tab.size[at], tab.step[at], tab.bound[at]
        # a source's pairs are asked again only where one side changed since it was last refused
        # everywhere at this freed value or a higher one (merge_ok's only use of the freed value
        # is the throughput a merge must beat, which is higher at a lower value; -1: never, or it
        # changed itself since). Freed values are 0 and 1.
        stamp = tab.stamp[at]
        chk = tab.chk_hi[at] if freed_value else np.maximum(tab.chk_hi[at], tab.chk_lo[at])
        since = np.where(stamp <= chk, chk, -1.0)
        cap = self.config.max_group_size
        mask = ((size[:, None] <= size[None, :]) & (size[None, :] <= cap - size[:, None])
                & (step[None, :] < np.minimum(bound[:, None], bound[None, :])) & (stamp[None, :] > since[:, None]))
        np.fill_diagonal(mask, False)
        src, dst = np.nonzero(mask)
        if src.size >= (PAIR_SCREEN_MIN if tab.multi else 1) and tab.batch is not None:
            known = tab.known[at[src]] & tab.known[at[dst]]
            s, d = at[src[known]], at[dst[known]]
            mem = tab.members
            refuse = batch_refusals(tab.batch, tab.batch.merge(tab.rows[d], tab.rows[s]), tab.nano[d],
                                    np.minimum(tab.bound[s], tab.bound[d]), tab.iso[s] + tab.iso[d],
                                    tab.rate[s] + tab.rate[d] - freed_value + self.config.min_gain,
                                    lambda i: mem[d[i]] + mem[s[i]])
            keep = np.ones(src.size, bool)
            keep[np.flatnonzero(known)[refuse]] = False
            src, dst = src[keep], dst[keep]
        out: dict[int, list[int]] = {}
        for i, j in zip(src.tolist(), dst.tolist()):
            out.setdefault(i, []).append(j)
        return out

    def _screen_column(self, snap: Snapshot, kind: tuple, at: np.ndarray, d: PlannedGroup,
                       freed_value: float) -> np.ndarray | None:
        """For group ``d``, just given members in this tick, whether ``merge_ok`` must still be
        asked about moving each source (the kind's table slots ``at``) into it: False where the
        batch cost model refuses the pair by more than its margin. None: no screen (the batch does
        not apply)."""
        tab = self._tables[kind]
        feats = None if tab.batch is None else group_features(tab.batch, d.members)
        if feats is None:
            return None
        row, iso = feats
        step, bound = d.step_time_s(snap, self.plan), d.slowdown_bound_s(snap, self.plan)
        into = tuple(j.member for j in d.members)
        refuse = batch_refusals(tab.batch, tab.batch.merge(tab.rows[at], row), d.nano_batches,
                                np.minimum(tab.bound[at], bound), tab.iso[at] + iso,
                                tab.rate[at] + iso / step - freed_value + self.config.min_gain,
                                lambda i: into + tab.members[at[i]])
        return ~(refuse & tab.known[at])

    def _batch(self, snap: Snapshot, kind: tuple) -> Any:
        """The batch cost model for groups of ``kind`` (None where it does not apply)."""
        key = (id(snap.cost_model), snap.cluster.gpu.name, kind)
        hit = self._batches.get(key)
        if hit is None or hit[0] is not snap.cost_model:
            fb = snap.cost_model.batch(kind[0], snap.cluster.gpu.name, kind[1]) \
                if self.plan == "fused" else None
            hit = self._batches[key] = (snap.cost_model, fb)
        return hit[1]

    def _features(self, fb: Any, g: PlannedGroup) -> tuple | None:
        """(batch feature row, Σ isolated step time) of a running group, kept per membership
        version; None if the batch cannot describe it."""
        hit = self._feats.get(g.group_id)
        if hit is None or hit[0] != g.version or hit[1] is not fb:
            hit = self._feats[g.group_id] = (g.version, fb, group_features(fb, g.members))
        return hit[2]

    def _job_row(self, fb: Any, job: Job) -> np.ndarray | None:
        """Batch feature row of one job (kept per batch and job shape)."""
        key = (id(fb), job.member)
        hit = self._job_rows.get(key)
        if hit is None or hit[0] is not fb:
            hit = self._job_rows[key] = (fb, fb.row([job.member]))
        return hit[1]
