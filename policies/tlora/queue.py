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
  (``QueueTable.no_target_at``, the stamp ``TLoRAIndex.kind_base``): the walk leaves such shapes
  out with one array comparison, so a decision costs nothing per queued shape of a kind that did
  not change (``TLoRAIndex.join_target`` would answer None from its memo);
* the order itself is a sort of numbers the policy already has per job (submit time, isolated
  runtime, tolerated slowdown, index), done by ``numpy`` over arrays kept per job index instead of
  a Python sort over ``Job`` objects (one ``argsort`` where the first key has no ties, else
  ``lexsort``); the walk's per-shape questions (first waiting job of each shape, the next one
  after a placement) read one stable sort of the shape ids per decision.

``QueueTable`` keeps the per-job arrays for the lifetime of a simulation (a job's attributes never
change; rows are filled the first time a job is seen); ``QueueOrder`` is one decision's view: the
queue order, each position's job, kind (base model, GPU count) and shape, and the positions of each
kind and each shape in queue order. ``walk.walk`` reads it; its decisions are those of the plain
walk, ``rules.walk_queue`` (``tests/policies/test_tlora_queue.py`` compares whole simulations under every
queue discipline).
"""

from __future__ import annotations

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
        #: per shape id: the stamp of its kind's running groups (``TLoRAIndex.join_target``'s ``base``)
        #: at which the shape, unable to start alone, last found no join target with nothing of
        #: its kind planned; -2 if never (stamps are >= -1)
        self.no_target_at = np.zeros(0, np.int64)
        #: per shape id: its join-memo key unable to start alone (``job_shape(job, False)``), its
        #: tightest bound (max_slowdown x isolated step time, s) and isolated step time (s): what
        #: the column screens read per waiting shape (``columns.ColumnScreens``; the member: ``shape_key[s][0]``)
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
        if how == "urgency":  # key (-urgency, runtime, -(max_slowdown - 1), index), urgency = max(now - submit, 0) / runtime
            run = self.runtime[idx]  # runtime second: the order at wait 0+ (``ordering`` module docstring)
            urg = np.maximum(now_s - self.submit[idx], 0.0) / run
            pos = sort_first(-urg, lambda: (idx, -(self.slowdown[idx] - 1.0), run, -urg))
        elif how in ("srpt", "sjf"):
            run = self.runtime[idx]
            pos = sort_first(run, lambda: (idx, run))
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
        if how == "urgency":  # (-urgency, runtime, -(max_slowdown - 1), index), urgency = max(now - submit, 0) / runtime
            keys = []
            for p, j in enumerate(jobs):
                run, wait, sd = j.isolated_runtime_s, now_s - j.submit_time_s, j.max_slowdown
                if not run > 0.0 or wait != wait or sd != sd or run == float("inf"):
                    return None
                keys.append((-((wait if wait > 0.0 else 0.0) / run), run, -(sd - 1.0), j.index, p))
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


def sort_first(primary: np.ndarray, keys) -> np.ndarray:
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
