"""tLoRA's speed machinery as one object (issues 6 and 20): ``TLoRAIndex`` keeps the policy's
picture of the running groups, per-kind arrays of them (``tables.KindTable``), the kept join answers
(``tables.TargetMemo``, per-group memos), and screens candidates with the batch cost model; none of
it changes a decision: ``reference.py`` (the plain reading of ``rules.py``) decides the same.

What the policy asks of it (``policy.TLoRA``):

* ``note_changes(snap, changed)``: which running groups changed as grouping sees them (members,
  nano-batch count) since the previous decision, from ``Snapshot.changed``; stamps per decision;
* ``join_target(snap, plan, job, can_start)``: ``rules.residual_target`` (or
  ``rules.throughput_target``) over the job's kind, answered from memos where nothing it depends
  on changed, large kinds screened with the batch cost model first;
* ``consolidate(snap, plan, smallest_wait)``: ``rules.consolidate``, asking only pairs where one
  side changed since it was last refused (``pair_candidates``: the pairs left, batch-screened);
* ``no_target(snap, plan, job, kind, jkey)``: whether a waiting shape surely has no target, read
  from kept answers without asking the join test (the indexed walk, ``walk.py``);
* ``prune(snap)``: bound the memos' sizes.

A refused merge stays refused until one side changes; a join answer for a job shape stands until
its kind changes; the index reads the policy's join test (``TLoRA.merge_ok``, ``TLoRA.merged``)
and nothing else of it. With the regroup pause priced the join test's pause test
(``rules.budget_ok``) depends on the time and on a newcomer's step count, which those keys leave
out: a refusal is kept only when the pause test did not refuse on the way (``keeps``, read from
``TLoRA.budget_refusals``), no acceptance is kept, a kept target's pause test is run again before
it is returned, and a "no target" that rested on the pause test is not recorded for the shape (the
walk asks the shape's next job too, ``walk.walk``). A waiting shape that had no target is left unasked when every group
changed since refuses its cost-model member outright (``no_target``: the merged step
time over the group's own bound, size or memory, one question per group state and member however
many shapes share it). Column screens on long queues: ``columns.ColumnScreens``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.tlora.columns import ColumnScreens
from tlora_sim.policies.tlora.rules import collective_rate
from tlora_sim.policies.tlora.tables import AFTER_RUNNING, ARRAY_MIN, PAIR_SCREEN_MIN, KindTable, TargetMemo, \
    batch_refusals, group_features, group_memo, job_shape
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Snapshot

SCREEN_MIN = 6
"""Fewest changed groups a kept "no join target" answer must re-check before they are screened
with the batch cost model together (below, asking ``merge_ok`` of each is cheaper)."""


class TLoRAIndex:
    """The incremental index of one ``TLoRA`` object for one simulation (see module docstring).

    Args:
        policy: the policy whose join test it reads: ``config``, ``plan``, ``job_bound_s``,
            ``merge_ok``, ``merged`` and ``promise`` (``Promise.note_group``).
    """

    def __init__(self, policy) -> None:
        self.pol = policy
        self.config = policy.config
        self.plan = policy.plan
        self.job_bound_s = policy.job_bound_s
        self.pause_priced = policy.promise.pause_priced
        self._join_memo: dict[int, tuple[tuple, dict]] = {}
        self._scan_memo: dict[int, tuple[tuple, dict]] = {}
        self.target_memo = TargetMemo()  # (kind, job shape) -> (validity, answer, running-groups stamp it covers)
        self._batches: dict[tuple, tuple] = {}  # (cost model id, GPU, kind) -> (cost model, FusedBatch or None)
        self._feats: dict[int, tuple] = {}  # group id -> (membership version, batch, (feature row, Σ T_iso))
        self._tables: dict[tuple, KindTable] = {}  # kind -> its running groups as arrays (``note_changes``)
        self._job_rows: dict[tuple, tuple] = {}  # (batch id, job shape) -> (batch, feature row)
        # consolidation's change tracking (``note_changes``)
        self.stamp = 0
        self._sig: dict[int, tuple] = {}  # group id -> (members, membership version, nano-batches, placement)
        # group id -> the group as grouping judges it: membership version, nano-batch count,
        # cached step time and bound (``Planner`` clones its copies from these)
        self.protos: dict[int, PlannedGroup] = {}
        # group id -> (member indices, step time, nano-batches, micro-batches, paused until), as of
        # its last change: what the tuner reads each tick without re-reading unchanged groups
        self.live: dict[int, tuple] = {}
        self._recent: dict[tuple[str, int], dict[int, int]] = {}  # kind -> {group id: stamp of last change}
        self.kind_of: dict[int, tuple[str, int]] = {}
        self._kind_checked: dict[tuple[str, int], tuple[float, int]] = {}
        self._planned_all: dict[tuple, tuple] = {}
        self.columns = ColumnScreens(self)
        self.shapes_asleep = 0  # queued shapes a walk did not ask (their kept answer stood): a statistic
        self.shapes_by_member = 0  # queued shapes found without a join target unasked (by member or in bulk)
        self.shapes_in_bulk = 0  # of those, found by one vector test for all the kind's shapes

    def keeps(self, ok, before: int) -> bool:
        """Whether ``merge_ok``'s answer ``ok`` (a bool, or a gain: -inf is a refusal), given while
        the policy's ``budget_refusals`` moved from ``before``, may be kept across time and across
        jobs of one shape: always without the pause priced; with it, only a refusal reached without
        the pause test refusing (size, bounds, memory, collective rate: none of them depends on the
        time or on a newcomer's step count, and a group's step time only grows as members join).
        An acceptance is not kept then: the pause test must pass each time it is read."""
        if not self.pause_priced:
            return True
        return (ok is False or ok == float("-inf")) and self.pol.budget_refusals == before

    def table(self, kind: tuple) -> KindTable | None:
        """The running groups of ``kind`` as arrays (None: none seen yet)."""
        return self._tables.get(kind)

    def recent(self, kind: tuple) -> dict[int, int] | None:
        """Group id -> decision stamp of its last change, oldest first, for the running groups of
        ``kind`` (None: none seen yet)."""
        return self._recent.get(kind)

    def begin_walk(self) -> None:
        """A queue walk begins: forget the planned groups' answers of the previous one."""
        self._planned_all = {}

    def prune(self, snap: Snapshot) -> None:
        """Drop the per-group memos of closed groups once they outgrow the running groups, and
        forget kept join answers and job rows past 4096 of them."""
        for memo in (self.pol.merge_memo, self._join_memo, self._scan_memo, self._feats):
            if len(memo) > 2 * len(snap.groups) + 64:
                for gid in [gid for gid in memo if gid not in snap.groups]:
                    del memo[gid]
        if len(self.target_memo) > 4096:
            self.target_memo.clear()
        if len(self._job_rows) > 4096:
            self._job_rows.clear()

    def note_changes(self, snap: Snapshot, changed_ids=None) -> None:
        """Record which running groups changed *as grouping sees them* since the previous decision
        (their members or their nano-batch count; a regroup pause alone is no change), refresh the
        policy's picture of them, and log the change per kind in the order it happened (a stamp per
        decision) for ``consolidate`` and ``join_target``. With no ``Snapshot.changed`` every
        group is looked at."""
        self.stamp += 1
        changed = set(changed_ids) if changed_ids is not None else set(snap.groups) | set(self._sig)
        for gid in changed:
            if gid not in snap.groups:
                kind = self.kind_of.pop(gid, None)
                self.live.pop(gid, None)
                self._sig.pop(gid, None)
                self.protos.pop(gid, None)
                if kind is not None:
                    self._recent[kind].pop(gid, None)
                    self._tables[kind].drop(gid)
                continue
            g = snap.groups[gid]
            kind = (g.model, g.n_gpus)
            prev = self.kind_of.get(gid)
            if prev != kind:  # new group (or, on hand-built snapshots, an id reused for another kind)
                if prev is not None:
                    self._recent[prev].pop(gid, None)
                    self._sig.pop(gid, None)
                    self._tables[prev].drop(gid)
                self.kind_of[gid] = kind
            members = tuple(g.members)  # the Job objects: compared by identity first, then by value
            self.live[gid] = (members, g.step_time_s, g.nano_batches, g.micro_batches, g.paused_until_s)
            self.pol.promise.note_group(gid, members)
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
                proto = self.protos[gid]
                proto.nano_batches = nano
                step = g.step_time_s if engine_step else \
                    snap.step_time_s(g.model, [j.member for j in members], g.n_gpus, self.plan, nano)
                proto.know_step_time(step, bound_s=proto.cached[2])
                self._tables[kind].retime(gid, step, nano)
            else:
                version = 0 if old is None else old[1] + (old[0] != members)
                self._sig[gid] = (members, version, nano, g.placement)
                proto = PlannedGroup(gid, version, g.model, g.n_gpus, g.placement, list(g.members), nano_batches=nano,
                                     bound_of=self.job_bound_s)
                if engine_step:
                    proto.know_step_time(g.step_time_s)
                step = proto.step_time_s(snap, self.plan)  # cached above, else predicted now
                self.protos[gid] = proto
                tab = self._tables.get(kind)
                if tab is None:
                    tab = self._tables[kind] = KindTable(self._batch(snap, kind))
                feats = self._features(tab.batch, proto) if tab.batch is not None else None
                iso = feats[1] if feats is not None else sum(j.isolated_step_time_s for j in proto.members)
                tab.put(gid, len(proto.members), step, proto.cached[2], iso, nano,
                        None if feats is None else feats[0],
                        tuple(j.member for j in proto.members) if tab.multi else ())
            rec = self._recent.setdefault(kind, {})
            rec.pop(gid, None)
            rec[gid] = self.stamp
            tab = self._tables[kind]
            tab.stamp[tab.slot[gid]] = self.stamp

    def consolidate(self, snap: Snapshot, plan: Planner, smallest_wait: int | None) -> None:
        """Merge running groups pairwise; each group tries partners on its node, then its rack,
        then the cluster (smaller groups move into larger ones).

        Groups go in (size, id) order; each moves into the first partner in (tier, -size, id)
        order that ``merge_ok`` allows. A pair that was refused stays refused while neither group
        changes as grouping sees it (members, nano-batch count: ``note_changes``), since
        ``merge_ok`` is a pure function of the two groups and of whether the freed GPUs could serve
        the queue; so a group examines only the partners that changed since it was last refused
        everywhere, and a kind where nothing changed is skipped without reading its groups.
        The pairs left are screened at once (``pair_candidates``: the size and bound tests, and
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
                views = [self.protos[gid] for gid in snap.kinds.get(kind, ())]
            else:
                views = [g for g in plan.of_kind(kind) if g.group_id is not None and not g.added]
            views.sort(key=lambda g: (len(g.members), g.group_id))
            at = self._tables[kind].slots([v.group_id for v in views])
            cands = self.pair_candidates(kind, views, at, freed_value)
            merged_into: list[PlannedGroup] = []  # groups given members in this tick
            screens: dict[int, np.ndarray | None] = {}  # their screens over the sources (``_screen_column``)
            consumed: set[int] = set()  # ids of groups merged away or given members
            refused: list[int] = []  # sources every partner refused (indices into views)
            timed = False  # a source was refused by the pause test (a refusal that may not stand)
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
                    rate_src = collective_rate(src.members, src.step_time_s(snap, self.plan))
                    extra = list(src.members)
                    key = tuple(j.member for j in extra)
                    before = self.pol.budget_refusals
                    for d in partners:
                        apart = rate_src + collective_rate(d.members, d.step_time_s(snap, self.plan)) - freed_value
                        if self.pol.merge_ok(snap, d, extra, apart, bound_extra=bound_src, key=key):
                            best = d
                            break
                    if best is None and self.pol.budget_refusals != before:
                        timed = True  # refused by the pause test: asked again on the next tick
                        continue
                if best is not None:
                    plan.merge(src, best)
                    consumed.update((gid, best.group_id))
                    if best not in merged_into:
                        merged_into.append(best)
                    screens[best.group_id] = self._screen_column(snap, kind, at, best, freed_value)
                else:
                    refused.append(i)
            tab = self._tables[kind]
            (tab.chk_hi if freed_value else tab.chk_lo)[at[refused]] = self.stamp
            if not merged_into and not timed:
                self._kind_checked[kind] = (freed_value, last)
        # the removals in the (size, id) order of a scan over every group (engine event order)
        plan.removed_groups.sort(key=lambda g: (len(g.removed), g.group_id))

    def pair_candidates(self, kind: tuple, views: list[PlannedGroup], at: np.ndarray,
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

    def kind_base(self, kind: tuple) -> int:
        """The decision stamp of the last change to ``kind``'s running groups as grouping sees
        them (-1 if it has none): a join answer that depends only on those groups stands while
        this is unchanged and nothing of the kind is planned."""
        recent = self._recent.get(kind)
        return next(reversed(recent.values())) if recent else -1

    def memo_state(self, plan: Planner, kind: tuple) -> tuple:
        """(planned changes to ``kind`` in this decision (``Planner.kind_version``), its running
        groups' change log (``_recent``), the validity a ``_target_memo`` answer needs now, the
        stamp of the running groups' last change)."""
        kv = plan.kind_version.get(kind, 0)
        base = self.kind_base(kind)
        return kv, self._recent.get(kind), ((plan.serial, kv) if kv else base), base

    @staticmethod
    def covered(plan: Planner, recent: dict | None, base: int, kv: int) -> int:
        """The running-groups stamp an answer given now covers: ``base``, or before the first
        running group this decision changed (answers about planned copies say nothing of the
        running groups they were made from)."""
        if kv and recent:
            touched = [recent[gid] for gid in plan.touched_ids() if gid in recent]
            if touched:
                return min(base, min(touched) - 1)
        return base

    def join_target(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool) -> PlannedGroup | None:
        """The running or planned group with the most residual capacity that ``job`` may join
        (ties: the earliest in start/plan order). Groups are tried in order of residual capacity
        left for the job (from each group's cached step time and bound), so ``merge_ok`` runs only
        until the first that accepts; a running group unchanged in this decision keeps its answer
        for the job's shape (memoised per group as grouping sees it, ``note_changes``)."""
        if snap.kinds is None:
            return self._join_target_scan(snap, plan.candidates(job), job, can_start)
        kind = (job.model, job.num_gpus)
        jkey = job_shape(job, can_start)
        # the answer for this job shape stands while nothing of its kind changed (queued jobs of one
        # shape are asked about again and again while they wait)
        kv, recent, valid, base = self.memo_state(plan, kind)
        memo = self.target_memo
        mid = memo.key(kind, jkey)
        hit = memo.get(mid)
        if hit is not None and hit[0] == valid:
            x = hit[1]
            if x is None:
                return x
            g = x if isinstance(x, PlannedGroup) else plan.group(x) if x in snap.kinds.get(kind, ()) else None
            # with the pause priced the kept target must still pass the pause test: the groups ranked
            # before it refused it by time-independent tests (``keeps``), so it stays the answer if so
            if g is not None and (not self.pause_priced or self._join_answer(snap, g, job, can_start)[1]):
                return g
        base = self.covered(plan, recent, base, kv)
        before = self.pol.budget_refusals
        if hit is not None and hit[1] is None \
                and self._still_no_target(snap, plan, job, can_start, kind, recent, hit[2], jkey, kv):
            if self.pol.budget_refusals == before:
                memo.put(mid, valid, None, base)
            return None
        best = self._join_target_search(snap, plan, job, can_start, kind, jkey)
        if self.pol.budget_refusals == before:  # else the answer rests on a pause test: not kept
            ans = best if best is None or best.group_id is None else best.group_id
            memo.put(mid, valid, ans, base)
        return best

    def _still_no_target(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                         recent: dict[int, int] | None, since: int, jkey: tuple, kv: int, *,
                         by_member: bool = False) -> bool:
        """Whether a job shape that had no join target when the running groups of its kind were as
        of decision stamp ``since`` (and nothing of the kind was planned after the answer, or the
        answer was given earlier in this decision) still has none, asking only the groups that
        changed since: the running groups changed after ``since`` (``recent``: group id -> stamp
        of its last change, oldest first) and, when this decision planned changes to the kind
        (``kv`` > 0), its joined and newly planned groups as planned. ``merge_ok`` is a pure
        function of a group as grouping sees it and of the job's shape, so every other group
        still refuses, and a closed or merged-away group offers nothing: only a changed group that
        now accepts can give a target (then the caller searches in full).

        ``by_member``: ask no ``merge_ok``; a group counts as refusing only by its memoised answer,
        its residual capacity or ``_refused_all`` (False then means "not sure")."""
        bound_job = self.job_bound_s(job)
        bonus = 1.0 if can_start else 0.0
        seen: set[int] = set()  # kept only when kv (read below only then)
        ask: list[tuple[int, dict]] = []  # changed running groups whose answer is not memoised

        def accepts(g: PlannedGroup) -> bool:  # a planned group (given members or started now)
            if by_member:
                return not self._planned_refuses(snap, plan, g, job, bound_job, kind, jkey)
            return self._join_answer(snap, g, job, can_start)[1]

        # this loop is hot on long queues: the planner's sets and the memo read directly
        # (``Planner.removed``/``joined``, ``group_memo`` without making an entry for a lookup)
        protos, memo, removed, joined = self.protos, self._join_memo, plan.removed_ids, plan.joined_groups
        for gid, stamp in reversed(recent.items()) if recent else ():
            if stamp <= since:
                break
            if kv:
                seen.add(gid)
            proto = protos.get(gid)
            if proto is None or gid in removed:
                continue
            if kv and gid in joined:
                if accepts(plan.group(gid)):
                    return False
                continue
            _, step, bound = proto.cached
            if (bound_job if bound_job < bound else bound) - step <= 0:  # min(bound, bound_job)
                continue
            ent = memo.get(gid)
            ok = ent[1].get(jkey) if ent is not None and ent[0] == (proto.version, proto.nano_batches) else None
            if ok:
                return False
            if ok is None:
                if not by_member:
                    ask.append((gid, group_memo(memo, proto)))
                else:
                    answers = group_memo(memo, proto)
                    self.columns.running(snap, plan, kind, gid, answers)  # long queues: every waiting shape at once
                    if answers.get(jkey) is not False and not self._refused_all(snap, proto, job, answers):
                        return False
        tab = self._tables.get(kind)
        if tab is not None and tab.batch is not None and len(ask) >= SCREEN_MIN \
                and (row := self._job_row(tab.batch, job)) is not None:
            # the batch cost model's certain refusals need no ``merge_ok`` (as in ``_join_order_table``)
            at = tab.slots([gid for gid, _ in ask])
            out = tab.known[at] & self._batch_refuses(tab, at, row, job, bonus)
            keep = []
            for a, r in zip(ask, out.tolist()):
                if r:
                    a[1][jkey] = False  # kept: merge_ok's answer, as certain
                else:
                    keep.append(a)
            ask = keep
        for gid, answers in ask:
            # an unchanged running group: its picture answers as its planned copy would (no copy made)
            before = self.pol.budget_refusals
            ok = accepts(protos[gid])
            if self.keeps(ok, before):
                answers[jkey] = ok
            if ok:
                return False
        if kv:
            for gid in plan.touched_ids():
                if gid not in seen and not plan.removed(gid) and self.kind_of.get(gid) == kind \
                        and accepts(plan.group(gid)):
                    return False
            if any(accepts(g) for g in plan.new_of_kind(kind)):
                return False
        return True

    def _refused_all(self, snap: Snapshot, g: PlannedGroup, job: Job, answers: dict) -> bool:
        """Whether ``g`` refuses every job whose cost-model member is ``job.member``, whatever the
        job's own bound and isolated step time: ``merge_ok``'s size test, or the merged step time
        over ``g``'s own bound (the bound of the merge is at most that), or memory. Kept in
        ``answers`` (the group state's memo) under ("all", member): one cost-model question per
        group state and member, however many waiting shapes share the member."""
        key = ("all", job.member)
        hit = answers.get(key)
        if hit is None:
            if len(g.members) + 1 > self.config.max_group_size:
                hit = True
            else:
                bound = g.slowdown_bound_s(snap, self.plan)
                step, fits = self.pol.merged(snap, g, [job], bound)
                hit = step > bound * (1 + 1e-12) or not fits
            answers[key] = hit
        return hit

    def _planned_refuses(self, snap: Snapshot, plan: Planner, g: PlannedGroup, job: Job, bound_job: float,
                         kind: tuple, jkey: tuple) -> bool:
        """Whether planned group ``g`` (given members or started in this decision) surely refuses
        ``job`` (shape ``jkey`` of ``kind``): no residual capacity for it, its column's refusal
        (``columns.ColumnScreens``), or ``_refused_all`` (kept per planned state, for the decision)."""
        if self._slack(snap, g, bound_job) <= 0 or self.columns.refuses(snap, plan, g, kind, jkey):
            return True
        state = (id(g), len(g.members))
        answers = self._planned_all.get(state)
        if answers is None or answers[0] is not g:
            answers = self._planned_all[state] = (g, {})
        return self._refused_all(snap, g, job, answers[1])

    def no_target(self, snap: Snapshot, plan: Planner, job: Job, kind: tuple,
                             jkey: tuple) -> tuple | None:
        """For a waiting shape unable to start alone (``jkey``, of ``job``): whether ``join_target``
        would surely answer None, read without asking ``merge_ok`` about each group: its kept
        answer is "no target" and every group ``_still_no_target`` would ask refuses it by its
        memoised answer, by residual capacity, or by ``_refused_all``. Returns (validity, stamp
        the answer covers) for ``_target_memo`` (the stamp None: the kept answer is current),
        or None when unsure (then the shape is asked as before): ``_still_no_target`` over the same
        groups with ``by_member``; a refusal read there is one ``merge_ok`` gives."""
        hit = self.target_memo.get(self.target_memo.key(kind, jkey))
        if hit is None or hit[1] is not None:
            return None
        kv, recent, valid, base = self.memo_state(plan, kind)
        if hit[0] == valid:
            return valid, None
        if not self._still_no_target(snap, plan, job, False, kind, recent, hit[2], jkey, kv, by_member=True):
            return None
        return valid, self.covered(plan, recent, base, kv)

    def _join_target_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                            jkey: tuple) -> PlannedGroup | None:
        """``join_target`` without its per-shape memo, by the configured join rule."""
        if self.config.join_rule == "throughput":
            return self._throughput_search(snap, plan, job, can_start, kind, jkey)
        return self._residual_search(snap, plan, job, can_start, kind, jkey)

    def _residual_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                         jkey: tuple) -> PlannedGroup | None:
        """tLoRA's join rule: running groups of the kind in start order,
        then the groups planned in this decision, ranked by residual capacity for ``job``; the first
        that ``merge_ok`` accepts. Running groups unchanged in this decision are read from the
        kind's table, and those the batch cost model refuses by more than its margin are passed
        over unasked (``tlora_sim.sim.costmodel.profiled.formula``); ``merge_ok``'s answers for the rest are memoised per
        unchanged group and ``jkey``."""
        bound_job = self.job_bound_s(job)
        bonus = 1.0 if can_start else 0.0
        order = self._join_order(snap, plan, job, kind, bound_job, bonus)
        for i, g in enumerate(plan.new_of_kind(kind)):  # after every running group
            sl = self._slack(snap, g, bound_job)
            if sl > 0:
                order.append((-sl, AFTER_RUNNING + i, g, None))
        order.sort(key=lambda t: (t[0], t[1]))
        for _, _, x, proto in order:
            answers = ok = None
            if proto is not None:  # an unchanged running group: its answer for this job shape is kept
                answers = group_memo(self._join_memo, proto)
                ok = answers.get(jkey)
                if ok is False:
                    continue
            g = x if isinstance(x, PlannedGroup) else plan.group(x)
            if ok is None:
                before = self.pol.budget_refusals
                ok = self.pol.merge_ok(snap, g, [job], collective_rate(g.members, g.step_time_s(snap, self.plan))
                                   + bonus)
                if answers is not None and self.keeps(ok, before):
                    answers[jkey] = ok
            if ok:
                return g
        return None

    def _join_order(self, snap: Snapshot, plan: Planner, job: Job, kind: tuple, bound_job: float,
                    bonus: float) -> list[tuple]:
        """The running groups of ``kind`` that may take ``job`` (bound ``bound_job``; ``bonus``: its
        value apart), as (-slack, start rank, group id, proto or None if changed in this decision):
        ``_join_order_scan`` for small kinds, ``_join_order_table`` (batch-screened) from
        ``ARRAY_MIN`` groups up. Groups left out have no residual capacity for the job or are
        refused by the batch screen: ``merge_ok`` would refuse them."""
        tab = self._tables.get(kind)
        if tab is None or not tab.slot:
            return []
        if len(tab.slot) < ARRAY_MIN:
            return self._join_order_scan(snap, plan, kind, bound_job)
        return self._join_order_table(snap, plan, job, kind, tab, bound_job, bonus)

    def _join_order_scan(self, snap: Snapshot, plan: Planner, kind: tuple, bound_job: float) -> list[tuple]:
        """The running groups of ``kind`` with residual capacity left for a job of bound
        ``bound_job``, as (-slack, start rank, group id, proto or None if changed in this decision),
        by a scan (cheaper than the table for a few groups)."""
        order = []
        for gid in snap.kinds.get(kind, ()):
            if plan.removed(gid):
                continue
            proto = None if plan.joined(gid) else self.protos.get(gid)
            if proto is not None:  # the cached (step, bound) read directly: this loop is hot on long queues
                _, step, bound = proto.cached
                slack = min(bound, bound_job) - step
            else:
                slack = self._slack(snap, plan.group(gid), bound_job)
            if slack > 0:
                order.append((-slack, gid, gid, proto))
        return order

    def _join_order_table(self, snap: Snapshot, plan: Planner, job: Job, kind: tuple, tab: "KindTable",
                          bound_job: float, bonus: float) -> list[tuple]:
        """``_join_order_scan`` from the kind's table, leaving out the groups the batch cost model
        refuses ``job`` by more than its margin (``tlora_sim.sim.costmodel.profiled.formula``): they would be refused."""
        slack = np.minimum(tab.bound, bound_job) - tab.step
        live = tab.alive & (slack > 0)
        planned = [gid for gid in plan.touched_ids() if self.kind_of.get(gid) == kind]
        for gid in planned:  # joined or merged away in this decision: read as planned, below
            live[tab.slot[gid]] = False
        idx = np.flatnonzero(live)
        if tab.batch is not None and (row := self._job_row(tab.batch, job)) is not None:
            k = idx[tab.known[idx]]
            live[k[self._batch_refuses(tab, k, row, job, bonus)]] = False
            idx = np.flatnonzero(live)
        protos = self.protos
        order = [(-sl, gid, gid, protos[gid]) for sl, gid in zip(slack[idx].tolist(), tab.gid[idx].tolist())]
        for gid in planned:
            if not plan.removed(gid):
                sl = self._slack(snap, plan.group(gid), bound_job)
                if sl > 0:
                    order.append((-sl, gid, gid, None))
        return order

    def _batch_refuses(self, tab: "KindTable", at: np.ndarray, row: np.ndarray, job: Job, bonus: float) -> np.ndarray:
        """Which of the groups in the kind's table slots ``at`` (rows known) the batch cost model
        refuses ``job`` (feature ``row``; ``bonus``: its value apart) by more than its margin
        (``tables.refused``): ``merge_ok`` would refuse them."""
        extra = (job.member,)
        return batch_refusals(tab.batch, tab.batch.merge(tab.rows[at], row), tab.nano[at],
                              np.minimum(tab.bound[at], self.job_bound_s(job)),
                              tab.iso[at] + job.isolated_step_time_s, tab.rate[at] + bonus + self.config.min_gain,
                              lambda i: tab.members[at[i]] + extra)

    def _slack(self, snap: Snapshot, g: PlannedGroup, bound_job: float) -> float:
        """Residual capacity (s) left in ``g`` for a job whose own bound is ``bound_job`` (s):
        min(g's bound, bound_job) - g's step time."""
        return min(g.slowdown_bound_s(snap, self.plan), bound_job) - g.step_time_s(snap, self.plan)

    def _join_answer(self, snap: Snapshot, g: PlannedGroup, job: Job, can_start: bool) -> tuple[float, bool]:
        """(residual capacity left for ``job`` in ``g`` (s), whether ``job`` may join ``g``)."""
        slack = self._slack(snap, g, self.job_bound_s(job))
        ok = slack > 0 and self.pol.merge_ok(snap, g, [job], collective_rate(g.members, g.step_time_s(snap, self.plan))
                                         + (1.0 if can_start else 0.0))
        return slack, ok

    def _join_target_scan(self, snap: Snapshot, cands, job: Job, can_start: bool) -> PlannedGroup | None:
        """The join target by a scan over ``cands`` (snapshots without the engine's kind index), by
        the configured join rule."""
        if self.config.join_rule == "throughput":
            jkey = job_shape(job, can_start)
            return self._best_gain(snap, [(g, g if g.group_id is not None and not g.added else None)
                                          for g in cands], job, can_start, jkey)
        return self._residual_scan(snap, cands, job, can_start)

    def _residual_scan(self, snap: Snapshot, cands, job: Job, can_start: bool) -> PlannedGroup | None:
        """tLoRA's join rule by a scan over ``cands``: the most residual capacity."""
        best, best_slack = None, 0.0
        jkey = job_shape(job, can_start)
        for g in cands:
            if g.group_id is not None and not g.added:
                # unchanged running group: (slack, ok) is a pure function of its version and the job's shape
                answers = group_memo(self._scan_memo, g)
                hit = answers.get(jkey)
                if hit is None:
                    before = self.pol.budget_refusals
                    hit = self._join_answer(snap, g, job, can_start)
                    if self.keeps(hit[1], before):
                        answers[jkey] = hit
                slack, ok = hit
                if ok and slack > best_slack:
                    best, best_slack = g, slack
                continue
            slack = self._slack(snap, g, self.job_bound_s(job))
            if slack <= 0 or slack <= best_slack:
                continue
            apart = collective_rate(g.members, g.step_time_s(snap, self.plan)) + (1.0 if can_start else 0.0)
            if self.pol.merge_ok(snap, g, [job], apart):
                best, best_slack = g, slack
        return best

    # ---- the throughput rule (ours) ----------------------------------------------------------------
    def _throughput_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                           jkey: tuple) -> PlannedGroup | None:
        """The group of ``kind`` where ``job`` raises collective throughput most (ties: the earliest
        in start/plan order). Running groups unchanged in this decision are read as the policy's
        own picture of them (no planned copy) and keep their gain for the job's shape, memoised per
        membership version and nano-batch count (``join_target`` keeps the answer per kind)."""
        # the running groups that may take the job, unchanged ones with their picture (the others
        # would refuse it: gain -inf), in start order
        order = self._join_order(snap, plan, job, kind, self.job_bound_s(job),
                                 1.0 if can_start else 0.0)
        running = [(gid, proto) if proto is not None else (plan.group(gid), None)
                   for _, gid, _, proto in sorted(order, key=lambda t: t[1])]
        best = self._best_gain(snap, running + [(g, None) for g in plan.new_of_kind(kind)], job, can_start, jkey)
        return plan.group(best) if isinstance(best, int) else best

    def _best_gain(self, snap: Snapshot, cands: list[tuple], job: Job, can_start: bool, jkey: tuple):
        """The first of ``cands`` with the largest positive gain (``_gain``). ``cands``: (group or
        running group id with its unchanged view; a group with None), in start/plan order; a group
        id is resolved by the caller."""
        best, best_gain = None, 0.0
        for x, view in cands:
            if view is None:
                gain = self._gain(snap, x, job, can_start)
            else:
                gains = group_memo(self._scan_memo, view)
                gain = gains.get(jkey)
                if gain is None:
                    before = self.pol.budget_refusals
                    gain = self._gain(snap, view, job, can_start)
                    if self.keeps(gain, before):
                        gains[jkey] = gain
            if gain > best_gain:
                best, best_gain = x, gain
        return best

    def _gain(self, snap: Snapshot, g: PlannedGroup, job: Job, can_start: bool) -> float:
        """Rise of collective throughput if ``job`` joins ``g`` over the two apart (the job counted
        as 1 if it could start alone now); -inf if ``merge_ok`` refuses the join."""
        apart = collective_rate(g.members, g.step_time_s(snap, self.plan)) + (1.0 if can_start else 0.0)
        if not self.pol.merge_ok(snap, g, [job], apart):
            return float("-inf")
        new_step, _ = self.pol.merged(snap, g, [job])
        return collective_rate(g.members + [job], new_step) - apart
