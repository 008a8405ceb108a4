"""tLoRA's join search: which running or planned group a queued job joins.

Two rules, chosen by ``TLoRAConfig.join_rule``:

- ``residual`` (tLoRA, arXiv 2602.07263): the group with the most residual capacity left for the
  job (min over members of bound minus step time) that ``merge_ok`` accepts;
- ``throughput`` (ours, the ``lookahead`` configuration): the group where the job raises
  collective throughput most. Our rule, not the paper's: LoRA jobs' durations are predictable, so
  packing a small job where it costs least should beat packing it where there is most room.

Both read the incremental index (``tlora_index.py``): groups unchanged in a decision keep their
answers per job shape, and large kinds are screened with the batch cost model first. A waiting
shape that had no target is left unasked when every group changed since refuses its cost-model
member outright (``_no_target_by_member``: the merged step time over the group's own bound, size or
memory, one question per group state and member however many shapes share it): on long queues most
refusals are of that kind. The answers are those of asking every group
(``tests/test_tlora_incremental.py``, ``tests/test_tlora_queue.py``).
"""

from __future__ import annotations

import numpy as np

from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.tlora.tables import AFTER_RUNNING, ARRAY_MIN, KindTable, batch_refusals, group_memo, job_shape
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Snapshot

JOIN_RULES = ("residual", "throughput")
SCREEN_MIN = 6
"""Fewest changed groups a kept "no join target" answer must re-check before they are screened
with the batch cost model together (below, asking ``merge_ok`` of each is cheaper)."""


class JoinSearch:
    """The join-search half of ``TLoRA`` (a mixin: it reads the policy's config, memos and index)."""

    def _kind_base(self, kind: tuple) -> int:
        """The decision stamp of the last change to ``kind``'s running groups as grouping sees
        them (-1 if it has none): a join answer that depends only on those groups stands while
        this is unchanged and nothing of the kind is planned."""
        recent = self._recent.get(kind)
        return next(reversed(recent.values())) if recent else -1

    def _memo_state(self, plan: Planner, kind: tuple) -> tuple:
        """(planned changes to ``kind`` in this decision (``Planner.kind_version``), its running
        groups' change log (``_recent``), the validity a ``_target_memo`` answer needs now, the
        stamp of the running groups' last change)."""
        kv = plan.kind_version.get(kind, 0)
        base = self._kind_base(kind)
        return kv, self._recent.get(kind), ((plan.serial, kv) if kv else base), base

    @staticmethod
    def _covered(plan: Planner, recent: dict | None, base: int, kv: int) -> int:
        """The running-groups stamp an answer given now covers: ``base``, or before the first
        running group this decision changed (answers about planned copies say nothing of the
        running groups they were made from)."""
        if kv and recent:
            touched = [recent[gid] for gid in plan.touched_ids() if gid in recent]
            if touched:
                return min(base, min(touched) - 1)
        return base

    def _join_target(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool) -> PlannedGroup | None:
        """The running or planned group with the most residual capacity that ``job`` may join
        (ties: the earliest in start/plan order). Groups are tried in order of residual capacity
        left for the job (from each group's cached step time and bound), so ``merge_ok`` runs only
        until the first that accepts; a running group unchanged in this decision keeps its answer
        for the job's shape (memoised per group as grouping sees it, ``_note_changes``)."""
        if snap.kinds is None:
            return self._join_target_scan(snap, plan.candidates(job), job, can_start)
        kind = (job.model, job.num_gpus)
        jkey = job_shape(job, can_start)
        # the answer for this job shape stands while nothing of its kind changed (queued jobs of one
        # shape are asked about again and again while they wait)
        kv, recent, valid, base = self._memo_state(plan, kind)
        memo = self._target_memo
        mid = memo.key(kind, jkey)
        hit = memo.get(mid)
        if hit is not None and hit[0] == valid:
            x = hit[1]
            if x is None or isinstance(x, PlannedGroup):
                return x
            if x in snap.kinds.get(kind, ()):
                return plan.group(x)
        base = self._covered(plan, recent, base, kv)
        if hit is not None and hit[1] is None \
                and self._still_no_target(snap, plan, job, can_start, kind, recent, hit[2], jkey, kv):
            memo.put(mid, valid, None, base)
            return None
        best = self._join_target_search(snap, plan, job, can_start, kind, jkey)
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
        protos, memo, removed, joined = self._protos, self._join_memo, plan._removed_ids, plan._joined
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
            _, step, bound = proto._cached
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
                    self._column_running(snap, plan, kind, gid, answers)  # long queues: every waiting shape at once
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
            if answers.setdefault(jkey, accepts(protos[gid])):
                return False
        if kv:
            for gid in plan.touched_ids():
                if gid not in seen and not plan.removed(gid) and self._kind_of.get(gid) == kind \
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
                step, fits = self._merged(snap, g, [job], bound)
                hit = step > bound * (1 + 1e-12) or not fits
            answers[key] = hit
        return hit

    def _planned_refuses(self, snap: Snapshot, plan: Planner, g: PlannedGroup, job: Job, bound_job: float,
                         kind: tuple, jkey: tuple) -> bool:
        """Whether planned group ``g`` (given members or started in this decision) surely refuses
        ``job`` (shape ``jkey`` of ``kind``): no residual capacity for it, its column's refusal
        (``tlora_column``), or ``_refused_all`` (kept per planned state, for the decision)."""
        if self._slack(snap, g, bound_job) <= 0 or self._column_refuses(snap, plan, g, kind, jkey):
            return True
        state = (id(g), len(g.members))
        answers = self._planned_all.get(state)
        if answers is None or answers[0] is not g:
            answers = self._planned_all[state] = (g, {})
        return self._refused_all(snap, g, job, answers[1])

    def _no_target_by_member(self, snap: Snapshot, plan: Planner, job: Job, kind: tuple,
                             jkey: tuple) -> tuple | None:
        """For a waiting shape unable to start alone (``jkey``, of ``job``): whether ``_join_target``
        would surely answer None, read without asking ``merge_ok`` about each group: its kept
        answer is "no target" and every group ``_still_no_target`` would ask refuses it by its
        memoised answer, by residual capacity, or by ``_refused_all``. Returns (validity, stamp
        the answer covers) for ``_target_memo`` (the stamp None: the kept answer is current),
        or None when unsure (then the shape is asked as before): ``_still_no_target`` over the same
        groups with ``by_member``; a refusal read there is one ``merge_ok`` gives."""
        hit = self._target_memo.get(self._target_memo.key(kind, jkey))
        if hit is None or hit[1] is not None:
            return None
        kv, recent, valid, base = self._memo_state(plan, kind)
        if hit[0] == valid:
            return valid, None
        if not self._still_no_target(snap, plan, job, False, kind, recent, hit[2], jkey, kv, by_member=True):
            return None
        return valid, self._covered(plan, recent, base, kv)

    def _join_target_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                            jkey: tuple) -> PlannedGroup | None:
        """``_join_target`` without its per-shape memo, by the configured join rule."""
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
                ok = self.merge_ok(snap, g, [job], self.collective_rate(g.members, g.step_time_s(snap, self.plan))
                                   + bonus)
                if answers is not None:
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
            proto = None if plan.joined(gid) else self._protos.get(gid)
            if proto is not None:  # the cached (step, bound) read directly: this loop is hot on long queues
                _, step, bound = proto._cached
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
        planned = [gid for gid in plan.touched_ids() if self._kind_of.get(gid) == kind]
        for gid in planned:  # joined or merged away in this decision: read as planned, below
            live[tab.slot[gid]] = False
        idx = np.flatnonzero(live)
        if tab.batch is not None and (row := self._job_row(tab.batch, job)) is not None:
            k = idx[tab.known[idx]]
            live[k[self._batch_refuses(tab, k, row, job, bonus)]] = False
            idx = np.flatnonzero(live)
        protos = self._protos
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
        (``tlora_index.refused``): ``merge_ok`` would refuse them."""
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
        ok = slack > 0 and self.merge_ok(snap, g, [job], self.collective_rate(g.members, g.step_time_s(snap, self.plan))
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
                    hit = answers[jkey] = self._join_answer(snap, g, job, can_start)
                slack, ok = hit
                if ok and slack > best_slack:
                    best, best_slack = g, slack
                continue
            slack = self._slack(snap, g, self.job_bound_s(job))
            if slack <= 0 or slack <= best_slack:
                continue
            apart = self.collective_rate(g.members, g.step_time_s(snap, self.plan)) + (1.0 if can_start else 0.0)
            if self.merge_ok(snap, g, [job], apart):
                best, best_slack = g, slack
        return best

    # ---- the throughput rule (ours) ----------------------------------------------------------------
    def _throughput_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                           jkey: tuple) -> PlannedGroup | None:
        """The group of ``kind`` where ``job`` raises collective throughput most (ties: the earliest
        in start/plan order). Running groups unchanged in this decision are read as the policy's
        own picture of them (no planned copy) and keep their gain for the job's shape, memoised per
        membership version and nano-batch count (``TLoRA._join_target`` keeps the answer per kind)."""
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
                    gain = gains[jkey] = self._gain(snap, view, job, can_start)
            if gain > best_gain:
                best, best_gain = x, gain
        return best

    def _gain(self, snap: Snapshot, g: PlannedGroup, job: Job, can_start: bool) -> float:
        """Rise of collective throughput if ``job`` joins ``g`` over the two apart (the job counted
        as 1 if it could start alone now); -inf if ``merge_ok`` refuses the join."""
        apart = self.collective_rate(g.members, g.step_time_s(snap, self.plan)) + (1.0 if can_start else 0.0)
        if not self.merge_ok(snap, g, [job], apart):
            return float("-inf")
        new_step, _ = self._merged(snap, g, [job])
        return self.collective_rate(g.members + [job], new_step) - apart
