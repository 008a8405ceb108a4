"""Column screens for tLoRA's join search on long queues: one batch cost-model call per changed
group answers every waiting job shape of its kind at once.

When admission has closed, each waiting shape whose kind changed is checked against the groups
that changed since it last found no target (``TLoRAIndex.no_target``): the shapes x
changed groups questions grow with the queue, and on long queues most shapes have members of
their own, so even one question per group state and member is a cost-model call per shape. A
*column* screens one changed group against every waiting shape of its kind in one call of the
batch cost model (``tlora_sim.sim.costmodel.profiled.formula``) and keeps the certain refusals
(``tables.batch_refusals``: by more than the batch's margin), which are ``merge_ok``'s own
answers. With many waiting shapes of a kind, the walk first decides them all at once
(``bulk_no_target``): a shape whose kept answer is "no target" and that every group it would ask
refuses, by residual capacity or by the group's column (one boolean vector per changed group),
is left out without any question of its own; the rest go through the by-member check, which
reads the columns first. Columns are made only for kinds with at least
``COLUMN_MIN`` waiting shapes and for group states that a second shape asks about. Session 12
measured a first version that screened every changed group for every waiting shape in every
decision: slower on mid-length queues (load 1.2: 25.6 -> 27.9 s), so columns serve only the
bulk and by-member checks, where the alternative is a cost-model question per shape
(``bench/README.md``).
"""

from __future__ import annotations

import numpy as np

from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.tlora.tables import batch_refusals, group_features
from tlora_sim.sim.core.snapshot import Snapshot

COLUMN_MIN = 16
"""Fewest waiting shapes of a kind for which a changed group is screened as a column (fewer:
asking per shape costs less than the batch call)."""
COLUMN_AFTER = 1
"""A running group state's column is made for the by-member check once its memo holds this many
answers (so not on the first question about a fresh state, often the only one; measured best of
1 and 2 at load 2.0); a planned group's column is made on its first question."""
COLUMN_DONE = ("column",)
"""Key marking a running group's answers (``group_memo``) as screened for the shapes waiting then."""


class ColumnScreens:
    """The column screens of one ``index.TLoRAIndex`` (its tables, pictures of the running groups
    and kept answers, read through its public names). A walk opens the columns when admission
    closes (``open``) and closes them when the next one begins (``close``); in between,
    ``refuses``, ``running`` and ``bulk_no_target`` answer from them.

    Args:
        ix: the index (``table``, ``protos``, ``kind_of``, ``target_memo``, ``memo_state``,
            ``covered``, ``plan``, ``config``).
    """

    def __init__(self, ix) -> None:
        self.ix = ix
        self._col_q = None
        self.made = 0  # changed groups screened against every waiting shape at once: a statistic
        self._mid_of = np.full(0, -1, np.int64)  # queue-table shape id -> its target-memo id unable to start alone
        self._srows: dict = {}  # batch rows per waiting shape (``_shape_rows``)

    def open(self, q, first: np.ndarray, ids: np.ndarray) -> None:
        """The join-only phase of a walk over ``q`` (a ``QueueOrder``) begins: ``first`` and ``ids``
        (arrays of equal length) are the first position and shape id of every shape still queued."""
        self._col_q = (q, first, ids, q.kind[first])
        self._col_kinds: dict[tuple, tuple | None] = {}
        self._col_vec: dict[tuple, tuple] = {}
        self._col_at: dict[tuple, dict] = {}
        self._col_pos: dict[tuple, np.ndarray] = {}

    def waiting(self) -> tuple | None:
        """(the walk's ``QueueOrder``, first position of every shape still queued, their shape ids)
        while the columns are open, else None."""
        return None if self._col_q is None else self._col_q[:3]

    def close(self) -> None:
        """The walk ended: its columns (and the planned groups they describe) are dropped."""
        self._col_q = None
        self._col_kinds = {}
        self._col_vec = {}
        self._col_at = {}
        self._col_pos = {}

    def _shapes_of(self, kind: tuple, fb) -> tuple | None:
        """The waiting shapes of ``kind`` a column covers, as (job-shape keys, batch rows (W, WIDTH),
        tightest bounds (W,) s, isolated step times (W,) s, cost-model members, shape ids (W,));
        None when fewer than ``COLUMN_MIN`` of them have batch rows. Read from the queue table's
        per-shape arrays and ``_shape_rows`` (no per-job work)."""
        if kind in self._col_kinds:
            return self._col_kinds[kind]
        q, first, ids, kinds_of = self._col_q
        t = q.table
        kid = t.kind_ids.get(kind)
        got = None
        if kid is not None:
            sids = ids[kinds_of == kid]
            if len(sids) >= COLUMN_MIN:
                rows, have = self._shape_rows(fb, t, sids)
                sids, rows = sids[have], rows[have]
                if len(sids) >= COLUMN_MIN:
                    sl = sids.tolist()
                    jk, sk = t.jkey_of, t.shape_key
                    got = ([jk[s] for s in sl], rows, t.bound_of[sids], t.iso_of[sids], [sk[s][0] for s in sl], sids)
        self._col_kinds[kind] = got
        return got

    def _shape_rows(self, fb, t, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(batch feature rows (len(sids), WIDTH), whether each has one (len(sids),) bool) of shape
        ids ``sids`` of queue table ``t``: ``fb.row`` of each shape's member (as ``_job_row``), kept
        per shape for the simulation (a shape's member never changes)."""
        ent = self._srows.get(id(fb))
        if ent is None or ent[0] is not fb or ent[1] is not t:
            ent = self._srows[id(fb)] = [fb, t, None, np.zeros(0, np.int8)]
        need = int(sids.max()) + 1
        if need > len(ent[3]):
            state = np.zeros(max(need, 2 * len(ent[3]), 256), np.int8)
            state[: len(ent[3])] = ent[3]
            ent[3] = state
            if ent[2] is not None:
                mat = np.zeros((len(state), ent[2].shape[1]), ent[2].dtype)
                mat[: len(ent[2])] = ent[2]
                ent[2] = mat
        state = ent[3]
        for s in sids[state[sids] == 0].tolist():  # shapes seen for the first time
            row = fb.row([t.shape_key[s][0]])
            if row is None:
                state[s] = 2
                continue
            if ent[2] is None:
                ent[2] = np.zeros((len(state), len(row)), np.asarray(row).dtype)
            ent[2][s] = row
            state[s] = 1
        have = state[sids] == 1
        if ent[2] is None:
            return np.zeros((len(sids), 0)), have
        return ent[2][sids], have

    def _column_vector(self, snap: Snapshot, plan: Planner, kind: tuple, shapes: tuple, x) -> np.ndarray | None:
        """The column of group ``x`` (a running group id, unchanged in this decision, or a planned
        group) over the kind's waiting shapes ``shapes`` (``_shapes_of``): True where the batch
        refuses the shape for certain; kept for the walk. None where the batch cannot describe it."""
        planned = not isinstance(x, int)
        key = (id(x), len(x.members)) if planned else (x, self.ix.protos[x].version, self.ix.protos[x].nano_batches)
        got = self._col_vec.get(key)
        if got is not None and (not planned or got[0] is x):
            return got[1]
        tab = self.ix.table(kind)
        fb = tab.batch
        if planned:
            feats = group_features(fb, x.members)
            vec = None if feats is None else self._refusals(
                fb, shapes, feats[0], feats[1], x.step_time_s(snap, self.ix.plan), x.slowdown_bound_s(snap, self.ix.plan),
                x.nano_batches, tuple(j.member for j in x.members))
        else:
            i = tab.slot.get(x)
            vec = None if i is None or not tab.known[i] else self._refusals(
                fb, shapes, tab.rows[i], float(tab.iso[i]), float(tab.step[i]), float(tab.bound[i]), tab.nano[i],
                tab.members[i])
        self._col_vec[key] = (x, vec)
        return vec

    def _refusals(self, fb, shapes: tuple, row, iso: float, step: float, bound: float, nano, members: tuple) -> np.ndarray:
        """Which of ``shapes`` (shape (W,), bool) the batch refuses for certain to join a group
        (feature ``row``, Σ isolated step time ``iso`` s, step time ``step`` s, bound ``bound`` s,
        ``nano`` nano-batches, cost-model ``members``), unable to start alone (no bonus)."""
        keys, rows, bound_j, iso_j, mem_j = shapes[:5]
        self.made += 1
        return batch_refusals(fb, fb.merge(rows, row), np.full(len(keys), float(nano)),
                              np.minimum(bound_j, bound), iso_j + iso,
                              np.full(len(keys), iso / step + self.ix.config.min_gain),
                              lambda i: members + (mem_j[i],))

    def _column_index(self, kind: tuple, shapes: tuple) -> dict:
        """Job-shape key -> position in the kind's column vectors (``_shapes_of``), for the walk."""
        at = self._col_at.get(kind)
        if at is None:
            at = self._col_at[kind] = {k: i for i, k in enumerate(shapes[0])}
        return at

    def shape_mids(self, kind: tuple, sids: np.ndarray) -> np.ndarray:
        """The ``_target_memo`` ids of queue-table shapes ``sids`` (of ``kind``) unable to start
        alone, kept per shape id for the simulation."""
        t = self._col_q[0].table
        arr = self._mid_of
        if len(arr) < len(t.shape_key):
            arr = self._mid_of = np.concatenate([arr, np.full(max(len(t.shape_key), 2 * len(arr), 256) - len(arr), -1,
                                                              np.int64)])
        mids = arr[sids]
        for i in np.flatnonzero(mids < 0).tolist():  # shapes seen for the first time
            s = int(sids[i])
            mids[i] = arr[s] = self.ix.target_memo.key(kind, t.jkey_of[s])
        return mids

    def bulk_no_target(self, snap: Snapshot, plan: Planner, kind: tuple, sids: list[int]) -> tuple | None:
        """For waiting shapes of ``kind`` unable to start alone (``sids``: their ids in the walk's
        queue table, distinct): which surely have no join target now, decided for all at once. A
        shape qualifies when its kept answer is "no target" and every group ``_still_no_target``
        would ask refuses it by residual capacity or by the group's column (certain batch
        refusals). Returns None (no bulk answer: ask each shape as before) or (current, sure,
        validity, stamp covered, ``sids`` as an array): ``current`` (bool, per shape) where the
        kept answer stands as is, ``sure`` where it stands for the validity and covered stamp
        given (to record)."""
        tab = self.ix.table(kind)
        if self._col_q is None or tab is None or tab.batch is None or len(sids) < COLUMN_MIN:
            return None
        shapes = self._shapes_of(kind, tab.batch)
        if shapes is None:
            return None
        kv, recent, valid, base = self.ix.memo_state(plan, kind)
        covered = self.ix.covered(plan, recent, base, kv)
        at = self._col_pos.get(kind)
        if at is None:  # shape id -> position in the kind's column vectors (-1: not in them)
            at = self._col_pos[kind] = np.full(len(self._col_q[0].table.shape_key), -1, np.int64)
            at[shapes[5]] = np.arange(len(shapes[5]))
        memo = self.ix.target_memo
        sids = np.array(sids, np.int64)
        mids = self.shape_mids(kind, sids)
        none = memo.none[mids]
        current = none & (memo.valid[mids] == memo.code(valid))
        sure = np.zeros(len(sids), bool)
        pos = at[sids]
        cand = np.flatnonzero(none & ~current & (pos >= 0))
        if not len(cand):
            return current, sure, valid, covered, sids
        idx, since = pos[cand], memo.since[mids[cand]]
        bound_j = shapes[2][idx]
        ok = np.ones(len(cand), bool)  # surely no target so far
        lo = since.min()
        removed, joined, protos = plan.removed_ids, plan.joined_groups, self.ix.protos
        for gid, stamp in reversed(recent.items()) if recent else ():
            if stamp <= lo:
                break
            proto = protos.get(gid)
            if proto is None or gid in removed or (kv and gid in joined):
                continue  # joined groups: with the planned ones below
            _, step, bound = proto.cached
            asks = (since < stamp) & (np.minimum(bound_j, bound) - step > 0)
            if asks.any():
                vec = self._column_vector(snap, plan, kind, shapes, gid)
                ok &= ~asks | (vec[idx] if vec is not None else False)
                if not ok.any():
                    return current, sure, valid, covered, sids
        if kv:
            planned = [plan.group(gid) for gid in plan.touched_ids()
                       if not plan.removed(gid) and self.ix.kind_of.get(gid) == kind] + plan.new_of_kind(kind)
            for g in planned:
                asks = np.minimum(bound_j, g.slowdown_bound_s(snap, self.ix.plan)) - g.step_time_s(snap, self.ix.plan) > 0
                if asks.any():
                    vec = self._column_vector(snap, plan, kind, shapes, g)
                    ok &= ~asks | (vec[idx] if vec is not None else False)
                    if not ok.any():
                        return current, sure, valid, covered, sids
        sure[cand[ok]] = True
        return current, sure, valid, covered, sids

    def running(self, snap: Snapshot, plan: Planner, kind: tuple, gid: int, answers: dict) -> None:
        """Screen running group ``gid`` (unchanged in this decision) against the waiting shapes of
        ``kind``: its column's refusals go into ``answers`` (its ``group_memo``, as ``merge_ok``'s
        answers), once per group state."""
        if self._col_q is None or len(answers) < COLUMN_AFTER or COLUMN_DONE in answers:
            return
        tab = self.ix.table(kind)
        shapes = self._shapes_of(kind, tab.batch) if tab is not None and tab.batch is not None else None
        vec = self._column_vector(snap, plan, kind, shapes, gid) if shapes is not None else None
        if vec is None:
            return
        answers[COLUMN_DONE] = True
        keys = shapes[0]
        for i in np.flatnonzero(vec).tolist():
            answers.setdefault(keys[i], False)

    def refuses(self, snap: Snapshot, plan: Planner, g: PlannedGroup, kind: tuple, jkey: tuple) -> bool:
        """Whether the column of planned group ``g`` (given members or started in this decision, as
        planned now) refuses job shape ``jkey`` for certain; False without a column."""
        if self._col_q is None or jkey[-1]:
            return False
        tab = self.ix.table(kind)
        shapes = self._shapes_of(kind, tab.batch) if tab is not None and tab.batch is not None else None
        if shapes is None:
            return False
        i = self._column_index(kind, shapes).get(jkey)
        if i is None:
            return False
        vec = self._column_vector(snap, plan, kind, shapes, g)
        return vec is not None and bool(vec[i])
