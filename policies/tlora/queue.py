"""tLoRA's queue as arrays: the queue order and the join-relevant index of the queued jobs, so that
a decision's cost does not grow with the queue (issue 20).

A decision of ``tlora`` walks the queue in its order (``tlora_sim.policies.ordering``). Two facts
make most of that walk unnecessary, without changing a decision:

* once GPU admission closes (the first head that can neither join a group nor get GPUs), a later
  head can only *join* a group, and whether it finds a join target depends on its *shape* alone
  (cost-model member, GPU count, base model, tolerated slowdown, isolated step time) and on the
  plan, which changes only when a job is placed. So after admission closes the walk visits one
  head per shape, the first of that shape in queue order, and revisits the shapes that found
  nothing only after a placement (from the next job of the shape after it);
* across decisions, a shape that found no target (unable to start alone) keeps that answer while
  its kind's running groups are unchanged and nothing of the kind is planned
  (``QueueTable.no_target_at``, the stamp ``TLoRA._kind_base``): the walk leaves such shapes
  out with one array comparison, so a decision costs nothing per queued shape of a kind that did
  not change (``TLoRA._join_target`` would answer None from its memo);
* the order itself is a sort of numbers the policy already has per job (submit time, isolated
  runtime, tolerated slowdown, index), done by ``numpy`` over arrays kept per job index instead of
  a Python sort over ``Job`` objects (one ``argsort`` where the first key has no ties, else
  ``lexsort``); the walk's per-shape questions (first waiting job of each shape, the next one
  after a placement) read one stable sort of the shape ids per decision.

``QueueTable`` keeps the per-job arrays for the lifetime of a simulation (a job's attributes never
change; rows are filled the first time a job is seen); ``QueueOrder`` is one decision's view: the
queue order, each position's job, kind (base model, GPU count) and shape, and the positions of each
kind and each shape in queue order. ``QueueWalk._group_queue_indexed`` reads it; its decisions
are those of the plain walk, ``QueueWalk._group_queue`` (``tests/test_tlora_queue.py`` compares
whole simulations under every queue discipline).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from tlora_sim.policies.ordering import AGING_FACTOR
from tlora_sim.policies.tlora.tables import job_shape
from tlora_sim.sim.core.jobs import Job


class QueueTable:
    """Per-job arrays by ``Job.index``, filled the first time a job is seen: submit time (s),
    isolated runtime (s), tolerated slowdown, GPU count, kind id and shape id (ids in first-seen
    order; ``kind_key``/``shape_key`` give the tuples back).

    A job's attributes are fixed for a simulation, so a row is never refreshed; the owner makes a
    new table when it starts serving another simulation."""

    def __init__(self, bound_of=None) -> None:
        """``bound_of``: a job's largest tolerated step time (s; ``TLoRA.job_bound_s``); None:
        max_slowdown x its eager isolated step time."""
        self.bound_fn = bound_of
        self.cap = 0
        self.seen = np.zeros(0, bool)
        self.submit = np.zeros(0)
        self.runtime = np.zeros(0)
        self.slowdown = np.zeros(0)
        self.gpus = np.zeros(0, np.int64)
        self.kind = np.zeros(0, np.int64)
        self.shape = np.zeros(0, np.int64)
        self.kind_ids: dict[tuple, int] = {}
        self.kind_key: list[tuple] = []
        self.shape_ids: dict[tuple, int] = {}
        self.shape_key: list[tuple] = []
        #: per shape id: the stamp of its kind's running groups (``TLoRA._join_target``'s ``base``)
        #: at which the shape, unable to start alone, last found no join target with nothing of
        #: its kind planned; -2 if never (stamps are >= -1)
        self.no_target_at = np.zeros(0, np.int64)
        #: per shape id: its join-memo key unable to start alone (``job_shape(job, False)``), its
        #: tightest bound (max_slowdown x isolated step time, s) and isolated step time (s): what
        #: the column screens read per waiting shape (``tlora_column``; the member: ``shape_key[s][0]``)
        self.jkey_of: list[tuple] = []
        self.bound_of = np.zeros(0)
        self.iso_of = np.zeros(0)

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self.cap, 1024)
        for name in ("seen", "submit", "runtime", "slowdown", "gpus", "kind", "shape"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self.cap = cap

    def _add(self, j: Job) -> None:
        i = j.index
        kind = (j.model, j.num_gpus)
        shape = (j.member, j.num_gpus, j.model, j.max_slowdown, j.isolated_step_time_s)
        k = self.kind_ids.get(kind)
        if k is None:
            k = self.kind_ids[kind] = len(self.kind_key)
            self.kind_key.append(kind)
        s = self.shape_ids.get(shape)
        if s is None:
            s = self.shape_ids[shape] = len(self.shape_key)
            self.shape_key.append(shape)
            if s >= len(self.no_target_at):
                cap = max(1024, 2 * len(self.no_target_at))
                for name, fill in (("no_target_at", -2), ("bound_of", 0.0), ("iso_of", 0.0)):
                    old = getattr(self, name)
                    grown = np.full(cap, fill, old.dtype)
                    grown[: len(old)] = old
                    setattr(self, name, grown)
            self.jkey_of.append(job_shape(j, False))
            self.bound_of[s] = j.max_slowdown * j.isolated_step_time_s if self.bound_fn is None else self.bound_fn(j)
            self.iso_of[s] = j.isolated_step_time_s
        self.submit[i] = j.submit_time_s
        self.runtime[i] = j.isolated_runtime_s
        self.slowdown[i] = j.max_slowdown
        self.gpus[i] = j.num_gpus
        self.kind[i] = k
        self.shape[i] = s
        self.seen[i] = True

    def order(self, queue: Sequence[Job], how: str, now_s: float) -> "QueueOrder":
        """The queue in ordering ``how`` (``fifo``/``backfill``: as given; ``urgency``; ``srpt``),
        the same order as ``ordering.order_queue`` (every key ends with the unique job index).
        Queues of at most ``SHORT`` jobs are sorted in Python (``_order_short``), longer ones by
        numpy over the table's arrays."""
        n = len(queue)
        if n <= SHORT:
            got = self._order_short(queue, how, now_s)
            if got is not None:
                return got
        keys = getattr(queue, "indices", None)  # an engine snapshot's queue: its keys are the indices
        idx = keys() if keys is not None else np.fromiter((j.index for j in queue), np.int64, n)
        if n and int(idx.max()) >= self.cap:
            self._grow(int(idx.max()) + 1)
        by_index = getattr(queue, "by_index", None)
        for p in np.flatnonzero(~self.seen[idx]).tolist():  # jobs seen for the first time
            self._add(queue[p] if by_index is None else by_index(int(idx[p])))
        if how == "urgency":  # key (-urgency, -(max_slowdown - 1), index), urgency = max(now - submit, 0) / runtime
            urg = np.maximum(now_s - self.submit[idx], 0.0) / self.runtime[idx]
            pos = _sort_first(-urg, lambda: (idx, -(self.slowdown[idx] - 1.0), -urg))
        elif how in ("srpt", "sjf"):
            run = self.runtime[idx]
            pos = _sort_first(run, lambda: (idx, run))
        elif how == "srpt-aged":  # key (starved?, -urgency if starved else runtime, index)
            run = self.runtime[idx]
            urg = np.maximum(now_s - self.submit[idx], 0.0) / run
            fresh = urg <= AGING_FACTOR
            pos = np.lexsort((idx, np.where(fresh, run, -urg), fresh))
        else:
            pos = np.arange(n)
        return QueueOrder(self, queue, idx[pos], pos)


    def _order_short(self, queue: Sequence[Job], how: str, now_s: float) -> "QueueOrder | None":
        """``order`` by a Python sort of per-job key tuples (a short queue: numpy's per-call cost
        exceeds the sort). The keys are those ``order`` sorts with ``lexsort``, computed with the
        same float operations, and the job index (unique) ends each, so both give the one order
        the keys define; None (use the numpy path) where a key is NaN or a runtime not positive,
        whose order ``lexsort`` defines differently from Python's comparisons."""
        jobs = list(queue)
        if not jobs:
            return None
        cap = self.cap
        for j in jobs:
            i = j.index
            if i >= cap:
                self._grow(i + 1)
                cap = self.cap
            if not self.seen[i]:
                self._add(j)
        if how == "urgency":  # (-urgency, -(max_slowdown - 1), index), urgency = max(now - submit, 0) / runtime
            keys = []
            for p, j in enumerate(jobs):
                run, wait, sd = j.isolated_runtime_s, now_s - j.submit_time_s, j.max_slowdown
                if not run > 0.0 or wait != wait or sd != sd or run == float("inf"):
                    return None
                keys.append((-((wait if wait > 0.0 else 0.0) / run), -(sd - 1.0), j.index, p))
        elif how in ("srpt", "sjf"):
            keys = []
            for p, j in enumerate(jobs):
                run = j.isolated_runtime_s
                if run != run:
                    return None
                keys.append((run, j.index, p))
        elif how == "srpt-aged":  # (0, -urgency, index) if starved, else (1, runtime, index)
            keys = []
            for p, j in enumerate(jobs):
                run, wait = j.isolated_runtime_s, now_s - j.submit_time_s
                if not run > 0.0 or wait != wait or run == float("inf"):
                    return None
                u = (wait if wait > 0.0 else 0.0) / run
                keys.append((0, -u, j.index, p) if u > AGING_FACTOR else (1, run, j.index, p))
        else:
            keys = [(p, j.index, p) for p, j in enumerate(jobs)]
        keys.sort()
        pos = np.fromiter((k[-1] for k in keys), np.int64, len(keys))
        index = np.fromiter((k[-2] for k in keys), np.int64, len(keys))
        out = QueueOrder(self, queue, index, pos)
        out._min_gpus = min(j.num_gpus for j in jobs)
        return out


SHORT = 24
"""Longest queue ``QueueTable.order`` sorts in Python (``_order_short``): below, numpy's fixed cost
per call exceeds a Python sort of key tuples."""


def _sort_first(primary: np.ndarray, keys) -> np.ndarray:
    """``numpy.lexsort(keys())`` (whose last key is ``primary``): one plain argsort of ``primary``
    where its values are distinct and not NaN (the later keys then never decide), else the full
    lexsort."""
    pos = np.argsort(primary)
    v = primary[pos]
    if len(v) < 2 or not (v[1:] == v[:-1]).any() and not np.isnan(v[-1]):
        return pos  # NaNs sort last: v[-1] is NaN exactly when there is one
    return np.lexsort(keys())


class QueueOrder:
    """One decision's queue in order. Position ``p`` (0 = first in order) holds job ``job(p)``
    (index ``index[p]``); ``kind[p]``/``shape[p]`` are its ids in the owning ``QueueTable``.
    ``kind_positions(k)`` and ``shape_positions(s)`` are the positions of kind/shape id ``k``/``s``
    in ascending order (computed once per decision, on first use)."""

    def __init__(self, table: QueueTable, queue: Sequence[Job], index: np.ndarray, pos: np.ndarray) -> None:
        self.table = table
        self.queue = queue
        self.index = index
        by_index = getattr(queue, "by_index", None)  # an engine snapshot's queue: jobs by index, no copy
        self._by_index = by_index
        self._pos = None if by_index is not None else pos.tolist()
        self.kind = table.kind[index]
        self.shape = table.shape[index]
        self._kinds: dict[int, list[int]] = {}
        self._by_shape: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def job(self, p: int) -> Job:
        """The job at position ``p``."""
        if self._pos is None:
            return self._by_index(int(self.index[p]))
        return self.queue[self._pos[p]]

    _min_gpus = None

    def min_gpus(self) -> int | None:
        """Fewest GPUs any queued job asks for (None for an empty queue)."""
        if self._min_gpus is not None:
            return self._min_gpus
        return int(self.table.gpus[self.index].min()) if len(self.index) else None

    def kind_positions(self, k: int) -> list[int]:
        """Positions of kind id ``k``, ascending."""
        got = self._kinds.get(k)
        if got is None:
            got = self._kinds[k] = np.flatnonzero(self.kind == k).tolist()
        return got

    def _shape_sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions ordered by (shape id, position), their shape ids, shape id x len + position:
        ascending, for ``searchsorted``), one stable sort per decision (radix on 16-bit ids)."""
        if self._by_shape is None:
            shape, n = self.shape, len(self.shape)
            small = shape.astype(np.int16) if n and int(shape.max()) < 32768 else shape
            perm = np.argsort(small, kind="stable")  # ties (equal ids) keep position order
            ids = shape[perm]
            self._by_shape = (perm, ids, ids * max(n, 1) + perm)
        return self._by_shape

    def first_of_shapes(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """(first position >= ``start``, shape id), two arrays ordered by shape id, for every
        shape present from ``start`` on."""
        perm, ids, _ = self._shape_sorted()
        if start:
            keep = perm >= start
            perm, ids = perm[keep], ids[keep]
        if not len(ids):
            return perm, ids
        head = np.empty(len(ids), bool)
        head[0] = True
        np.not_equal(ids[1:], ids[:-1], out=head[1:])
        return perm[head], ids[head]

    def shape_positions(self, s: int) -> np.ndarray:
        """Positions of shape id ``s``, ascending."""
        perm, ids, _ = self._shape_sorted()
        lo, hi = np.searchsorted(ids, s, "left"), np.searchsorted(ids, s, "right")
        return perm[lo:hi]

    def next_of_shapes(self, shapes: list[int], after: int, placed: set[int]) -> list[tuple[int, int]]:
        """(first position > ``after`` whose job is not in ``placed`` (job indices), shape id) for
        each of ``shapes`` that has one, in the order of ``shapes``: one ``searchsorted`` for all."""
        if not shapes:
            return []
        perm, ids, key = self._shape_sorted()
        sh = np.asarray(shapes, np.int64)
        k = np.searchsorted(key, sh * max(len(self.shape), 1) + after, "right")
        out = []
        index, m = self.index, len(ids)
        for d, i in zip(shapes, k.tolist()):
            while i < m and ids[i] == d and int(index[perm[i]]) in placed:
                i += 1
            if i < m and ids[i] == d:
                out.append((int(perm[i]), d))
        return out


class QueueWalk:
    """tLoRA's walk down the queue, step 2 of its decision (a mixin: it reads the policy's config
    and join search): the plain walk and the indexed one, with the same decisions; see the module
    docstring for why the indexed walk may skip what it skips."""

    def _group_queue(self, snap, plan, queue: list[Job]) -> None:
        """The plain walk (hand-built snapshots without the engine's kind index, and the reference
        the tests compare the indexed walk with): every head in ``queue`` order, every decision."""
        placed: set[int] = set()
        admission_open = True
        buckets: dict[tuple[str, int], list[Job]] = {}
        for j in queue:
            buckets.setdefault((j.model, j.num_gpus), []).append(j)
        cursor = {k: 0 for k in buckets}
        # A job shaped like one that found no target, with nothing planned since, finds none either.
        no_target: dict[tuple, int] = {}
        for head in queue:
            if head.index in placed:
                continue
            kind = (head.model, head.num_gpus)
            can_start = admission_open and plan.free.find(head.num_gpus) is not None
            if not self.config.grouping:
                if can_start:
                    plan.start(head)
                else:
                    admission_open = False
                continue
            shape = (head.member, head.num_gpus, head.model, head.max_slowdown, head.isolated_step_time_s, can_start)
            target = None
            if no_target.get(shape) != plan.version:
                target = self._join_target(snap, plan, head, can_start)
                if target is None:
                    no_target[shape] = plan.version
            if target is None:
                if not can_start:
                    admission_open = False
                    continue
                target = plan.start(head)
            else:
                plan.join(target, head)
            placed.add(head.index)
            bucket, c = buckets[kind], cursor[kind]
            while c < len(bucket) and bucket[c].index in placed:
                c += 1
            cursor[kind] = c
            cands = [j for j in bucket[c:c + 2 * self.config.window] if j.index not in placed][: self.config.window]
            self._join_window(snap, plan, target, cands, placed, admission_open)

    def _none_for(self, snap, plan, q: QueueOrder, kind: tuple, shapes: list[tuple[int, int]],
                  no_target: dict) -> list[bool]:
        """For shapes of ``kind`` (position of a job of each, shape id) unable to start alone:
        whether each surely has no join target now, all at once where the kind's waiting shapes
        are many (``ColumnScreen._bulk_no_target``), else one by one
        (``JoinSearch._no_target_by_member``). Each such answer is recorded as ``target_of``
        records one (``no_target``, ``QueueTable.no_target_at``, ``_target_memo``), so the walk
        treats the shape as asked."""
        sids = [s for _, s in shapes]
        bulk = self._bulk_no_target(snap, plan, kind, sids)
        kv = plan.kind_version.get(kind, 0)
        out = [False] * len(shapes)
        rest = range(len(shapes))
        if bulk is not None:  # the shapes answered at once: recorded at once
            current, sure, valid, covered, sids = bulk
            got = current | sure
            rest = np.flatnonzero(~got).tolist()
            out = got.tolist()
            done = sids[got]
            for s in done.tolist():
                no_target[2 * s] = kv
            if not kv:
                q.table.no_target_at[done] = valid  # with nothing planned, the kind's last change
            if sure.any():
                self._target_memo.put_none(self._shape_mids(kind, sids[sure]), valid, covered)
            self.shapes_in_bulk += len(done)
            self.shapes_by_member += len(done)
        jkey_of = q.table.jkey_of
        for i in rest:
            pos, s = shapes[i]
            jkey = jkey_of[s]
            ans = self._no_target_by_member(snap, plan, q.job(pos), kind, jkey)
            if ans is None:
                continue
            valid, covered = ans
            no_target[2 * s] = kv
            if not kv:
                q.table.no_target_at[s] = valid
            if covered is not None:
                self._target_memo.put(self._target_memo.key(kind, jkey), valid, None, covered)
            self.shapes_by_member += 1
            out[i] = True
        return out

    def _group_queue_indexed(self, snap, plan, q: QueueOrder) -> None:
        self._planned_all = {}  # (id, size) of a planned group -> (it, its ``_refused_all`` answers)
        self._columns_close()
        placed: set[int] = set()
        # 2 x shape id + can_start -> its kind's plan version when it found no target: a join
        # target depends only on the job's shape and the groups of its kind (``Planner.kind_version``)
        no_target: dict[int, int] = {}
        kind_version = plan.kind_version
        cursor: dict[int, int] = {}
        kind_key = q.table.kind_key
        grouping = self.config.grouping

        nt = q.table.no_target_at

        def target_of(head: Job, key: int, kind: tuple, can_start: bool, s: int):
            """``head``'s join target, unless its shape (id ``s``; ``key`` = 2 s + can_start) found
            none since ``kind`` last changed."""
            if no_target.get(key) == kind_version.get(kind, 0):
                return None
            target = self._join_target(snap, plan, head, can_start)
            if target is None:
                kv = no_target[key] = kind_version.get(kind, 0)
                if not kv and not can_start:
                    nt[s] = self._kind_base(kind)
            return target

        n, p = len(q), 0
        # while GPU admission is open every head is placed or closes it: O(placements)
        while p < n:
            head = q.job(p)
            p += 1
            if head.index in placed:
                continue
            can_start = plan.free.find(head.num_gpus) is not None
            if not grouping:
                if not can_start:
                    return  # admission closed, and without grouping nothing else can be placed
                plan.start(head)
                continue
            s = int(q.shape[p - 1])
            target = target_of(head, 2 * s + can_start, kind_key[q.kind[p - 1]], can_start, s)
            if target is None:
                if not can_start:
                    break  # admission closes
                target = plan.start(head)
            else:
                plan.join(target, head)
            placed.add(head.index)
            self._join_followers(snap, plan, q, target, q.kind[p - 1], cursor, placed, True)
        else:
            return
        # admission closed: only joins remain; one head per shape until its kind changes
        heap: list[tuple[int, int]] = []
        dormant: dict[tuple, list[int]] = {}  # kind -> shapes that found no target at its version
        first, ids = q.first_of_shapes(p)
        self._columns_open(q, first, ids)  # closed when the next walk begins
        # asleep: shapes whose last answer, unable to start alone, was "no target" when their kind's
        # running groups were as they are now and nothing of the kind is planned in this decision:
        # ``_join_target`` would answer None from its memo, so they are not asked (a vectorised
        # test: a decision then costs nothing per queued shape of a kind that did not change)
        kinds_of = q.kind[first]
        quiet = np.full(len(kind_key), -3, np.int64)
        for k in np.unique(kinds_of).tolist():
            if not kind_version.get(kind_key[k], 0):
                quiet[k] = self._kind_base(kind_key[k])
        asleep = nt[ids] == quiet[kinds_of]
        asleep_ids, asleep_kinds = ids[asleep], kinds_of[asleep]
        self.shapes_asleep += len(asleep_ids)
        awake: dict[tuple, list[tuple[int, int]]] = {}  # kind -> (first position, shape id)
        for first_p, s, k in zip(first[~asleep].tolist(), ids[~asleep].tolist(), kinds_of[~asleep].tolist()):
            kind = kind_key[k]
            if no_target.get(2 * s) == kind_version.get(kind, 0):
                dormant.setdefault(kind, []).append(s)
            else:
                awake.setdefault(kind, []).append((first_p, s))
        for kind, lst in awake.items():
            for (first_p, s), none in zip(lst, self._none_for(snap, plan, q, kind, lst, no_target)):
                if none:
                    dormant.setdefault(kind, []).append(s)
                else:
                    heap.append((first_p, s))
        heapq.heapify(heap)
        while heap:
            p, s = heapq.heappop(heap)
            head = q.job(p)
            if head.index in placed:
                for nxt in q.next_of_shapes([s], p, placed):
                    heapq.heappush(heap, nxt)
                continue
            kind = kind_key[q.kind[p]]
            target = target_of(head, 2 * s, kind, False, s)
            if target is None:
                dormant.setdefault(kind, []).append(s)
                continue
            plan.join(target, head)
            placed.add(head.index)
            self._join_followers(snap, plan, q, target, q.kind[p], cursor, placed, False)
            # the kind changed: its shapes are asked again from here on
            woken = dormant.pop(kind, []) + [s]
            if len(asleep_ids):
                sel = asleep_kinds == q.kind[p]
                if sel.any():
                    woken += asleep_ids[sel].tolist()
                    asleep_kinds[sel] = -1
            lst = q.next_of_shapes(woken, p, placed)
            for (nxt, d), none in zip(lst, self._none_for(snap, plan, q, kind, lst, no_target)):
                if none:
                    dormant.setdefault(kind, []).append(d)  # as if asked now: no target
                else:
                    heapq.heappush(heap, (nxt, d))

    def _join_followers(self, snap, plan, q: QueueOrder, target, kind: int, cursor: dict[int, int],
                        placed: set[int], admission_open: bool) -> None:
        """After a head is placed in ``target``: the first ``window`` unplaced jobs of its kind in
        queue order (from the kind's first unplaced one) join as far as ``binary_cut`` allows."""
        if len(placed) >= len(q):
            return  # every queued job is placed: no follower left
        pos = q.kind_positions(int(kind))
        c = cursor.get(kind, 0)
        while c < len(pos) and q.index[pos[c]] in placed:
            c += 1
        cursor[kind] = c
        w = self.config.window
        cands = [j for j in (q.job(x) for x in pos[c:c + 2 * w]) if j.index not in placed][:w]
        self._join_window(snap, plan, target, cands, placed, admission_open)

    def _join_window(self, snap, plan, target, cands: list[Job], placed: set[int], admission_open: bool) -> None:
        """The first k of ``cands`` (later queued jobs of the head's kind, in queue order) join
        ``target``, k as large as ``binary_cut`` allows (each counted as 1 apart if it could start
        alone now)."""
        if cands:
            free_now = {j.index: admission_open and plan.free.find(j.num_gpus) is not None for j in cands}
            base = self.collective_rate(target.members, target.step_time_s(snap, self.plan))
            k = self.binary_cut(snap, target, cands, base, free_now)
            for j in cands[:k]:
                plan.join(target, j)
                placed.add(j.index)
