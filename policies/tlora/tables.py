"""The arrays and small pure helpers of tLoRA's index (``index.py``): the running groups of each kind
as arrays (``KindTable``), the kept join answers (``TargetMemo``), and the batch cost model's
certain refusals (``batch_refusals``) that the join search, consolidation and the column screens
share (issue 6's bookkeeping; none of it changes a decision).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tlora_sim.policies.planner import PlannedGroup
from tlora_sim.sim.core.jobs import Job


ARRAY_MIN = 32
"""Fewest running groups of a kind for which the join search reads the kind's table and screens
with the batch cost model (below, a scan with the memoised ``merge_ok`` answers is cheaper)."""
PAIR_SCREEN_MIN = 16
"""Fewest candidate pairs of a multi-GPU kind a tick screens with the batch (``PlannerBatch``):
below, asking ``merge_ok`` (whose merged step times are kept per group state) costs less than the
batch call. Measured (tlora, CPU s, same jobs.csv): synthetic-10k 4.8 with no multi-GPU pair
screen, 5.1 screening every pair, 4.9 from 16 pairs; the merged ITP trace on 142x8xH100 90.6, 74.4,
74.7 (64 pairs: 79.9). Either way the same merges."""
AFTER_RUNNING = 1 << 62
"""Rank of the first group planned in a decision, after every running group (whose rank is its id,
in start order) in the join-target order."""


class KindTable:
    """The running groups of one kind as arrays, one slot per group, kept up to date as groups
    change (``TLoRAIndex.note_changes``): members, step time (s), slowdown bound (s), Σ isolated step
    time (s), collective rate (Σ T_iso / step), nano-batches, group id, whether the slot is in use
    (``alive``), the batch cost model's feature rows (``known``: the slot's row describes its
    group), and each slot's cost-model members (``members``, for a batch whose ``local`` plan is
    placed member by member: ``batch_refusals``). ``slot`` maps group id -> slot.

    Consolidation's bookkeeping lives here too: ``stamp`` (the decision stamp of the group's last
    change as grouping sees it, ``TLoRAIndex.note_changes``), and ``chk_hi``/``chk_lo`` (the stamps at
    which the group, as a source, was last refused by every partner with freed GPUs worth 1 and 0;
    -1 if never: a refusal at 1 holds at 0, as ``merge_ok`` asks more of a merge there)."""

    def __init__(self, batch: Any, capacity: int = 16):
        self.batch = batch
        self.slot: dict[int, int] = {}
        self.members: list[tuple] = []
        self.multi = hasattr(batch, "local_step_times")  # a multi-GPU batch (``PlannerBatch``)
        self._free: list[int] = []
        self._alloc(capacity)

    def _alloc(self, cap: int) -> None:
        old = getattr(self, "size", None)
        new = {name: np.zeros(cap) for name in ("size", "step", "bound", "iso", "rate", "nano", "stamp")}
        new["chk_hi"] = np.full(cap, -1.0)
        new["chk_lo"] = np.full(cap, -1.0)
        new["known"] = np.zeros(cap, bool)
        new["alive"] = np.zeros(cap, bool)
        new["gid"] = np.full(cap, -1, np.int64)
        new["rows"] = np.zeros((cap, self.batch.WIDTH if self.batch is not None else 0))
        if old is not None:
            n = len(old)
            for name, arr in new.items():
                arr[:n] = getattr(self, name)
            self._free = list(range(cap - 1, n - 1, -1)) + self._free
        else:
            self._free = list(range(cap - 1, -1, -1))
        for name, arr in new.items():
            setattr(self, name, arr)
        self.members += [()] * (cap - len(self.members))

    def put(self, gid: int, size: int, step: float, bound: float, iso: float, nano: int,
            row: np.ndarray | None, members: tuple = ()) -> None:
        """Write group ``gid``'s state (a new group takes a free slot; ``members``: its cost-model
        members)."""
        i = self.slot.get(gid)
        if i is None:
            if not self._free:
                self._alloc(2 * len(self.size))
            i = self.slot[gid] = self._free.pop()
            self.chk_hi[i] = self.chk_lo[i] = -1.0
        self.size[i], self.step[i], self.bound[i], self.iso[i], self.nano[i] = size, step, bound, iso, nano
        self.rate[i] = iso / step
        self.gid[i], self.alive[i] = gid, True
        self.known[i] = row is not None
        self.members[i] = members
        if row is not None:
            self.rows[i] = row

    def retime(self, gid: int, step: float, nano: int) -> None:
        """Group ``gid`` runs at ``nano`` nano-batches with step time ``step`` (s); members unchanged."""
        i = self.slot[gid]
        self.step[i], self.nano[i] = step, nano
        self.rate[i] = self.iso[i] / step

    def drop(self, gid: int) -> None:
        """Forget group ``gid`` (closed, or moved to another kind)."""
        i = self.slot.pop(gid, None)
        if i is not None:
            self.known[i] = self.alive[i] = False
            self._free.append(i)

    def slots(self, gids) -> np.ndarray:
        """Slots of ``gids`` (in that order)."""
        slot = self.slot
        return np.fromiter((slot[g] for g in gids), int, len(gids))



class TargetMemo:
    """tLoRA's kept join answers (``TLoRAIndex.join_target``), per (kind, job shape): (validity,
    answer, running-groups stamp the answer covers). ``key`` gives a pair its id (kept for the
    simulation); "no target" answers (None) live in arrays by id, so that the walk reads and
    writes the answers of many waiting shapes at once (``ColumnScreens.bulk_no_target``), the
    others in a dict. A validity is a stamp (int >= -1) or, inside one decision, (planner serial,
    kind version): one int64 in the arrays (``code``). ``len`` counts the answers kept; ``clear``
    forgets them (not the ids)."""

    KV_BITS = 21
    """Bits of the kind version in a coded (serial, kind version) validity."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self._other: dict[int, tuple] = {}  # id -> answer that is a group
        self.none = np.zeros(256, bool)  # id holds a "no target" answer
        self.valid = np.zeros(256, np.int64)  # its validity, coded
        self.since = np.zeros(256, np.int64)  # the stamp it covers
        self._n_none = 0

    def __len__(self) -> int:
        return self._n_none + len(self._other)

    def key(self, kind: tuple, jkey: tuple) -> int:
        """The id of (``kind``, job shape ``jkey``)."""
        mid = self.ids.get((kind, jkey))
        if mid is None:
            mid = self.ids[(kind, jkey)] = len(self.ids)
            if mid >= len(self.none):
                for name in ("none", "valid", "since"):
                    old = getattr(self, name)
                    new = np.zeros(2 * len(old), old.dtype)
                    new[: len(old)] = old
                    setattr(self, name, new)
        return mid

    @classmethod
    def code(cls, valid) -> int:
        """A validity as one int: a stamp as is, (serial, kind version) as a number below -1.
        Raises ValueError for a kind version of ``KV_BITS`` bits or more."""
        if not isinstance(valid, tuple):
            return int(valid)
        serial, kv = valid
        if not 0 <= kv < 1 << cls.KV_BITS:
            raise ValueError(f"kind version {kv} out of range for TargetMemo.code")
        return -2 - ((serial << cls.KV_BITS) | kv)

    @classmethod
    def decode(cls, c: int):
        """The validity ``code`` made ``c`` from."""
        if c >= -1:
            return c
        return divmod(-2 - c, 1 << cls.KV_BITS)

    def get(self, mid: int) -> tuple | None:
        """(validity, answer, stamp covered) kept for id ``mid``, or None."""
        if self.none[mid]:
            return self.decode(int(self.valid[mid])), None, int(self.since[mid])
        return self._other.get(mid)

    def put(self, mid: int, valid, answer, since: int) -> None:
        """Keep ``answer`` (None: no target; else a group or group id) for id ``mid``."""
        if answer is None:
            if not self.none[mid]:
                self._n_none += 1
                self.none[mid] = True
            self.valid[mid] = self.code(valid)
            self.since[mid] = since
            if self._other:
                self._other.pop(mid, None)
            return
        if self.none[mid]:
            self.none[mid] = False
            self._n_none -= 1
        self._other[mid] = (valid, answer, since)

    def put_none(self, mids: np.ndarray, valid, since: int) -> None:
        """Keep "no target" at validity ``valid``, covering stamp ``since``, for ids ``mids``
        (distinct)."""
        self._n_none += int(np.count_nonzero(~self.none[mids]))
        self.none[mids] = True
        self.valid[mids] = self.code(valid)
        self.since[mids] = since
        if self._other:
            for m in mids.tolist():
                self._other.pop(m, None)

    def clear(self) -> None:
        """Forget every answer (ids stay)."""
        self.none[:] = False
        self._n_none = 0
        self._other.clear()

def job_shape(job: Job, can_start: bool) -> tuple:
    """What a join answer for ``job`` depends on (its cost-model member, slowdown bound terms, and
    whether it could start alone now): the key of the join memos."""
    return (job.member, job.max_slowdown, job.isolated_step_time_s, can_start)


def group_memo(memo: dict[int, tuple[tuple, dict]], g: PlannedGroup) -> dict:
    """The answers ``memo`` keeps for running group ``g`` as it is now (its membership version and
    nano-batch count; answers kept for another state are dropped)."""
    state = (g.version, g.nano_batches)
    ent = memo.get(g.group_id)
    if ent is None or ent[0] != state:
        ent = memo[g.group_id] = (state, {})
    return ent[1]


def group_features(fb: Any, members: list[Job]) -> tuple[np.ndarray, float] | None:
    """(batch feature row, Σ isolated step time (s)) of a group of ``members``; None if the batch
    cannot describe it (``FusedBatch.row``)."""
    row = fb.row([j.member for j in members])
    return None if row is None else (row, sum(j.isolated_step_time_s for j in members))


def refused(step_s: np.ndarray, bound_s: np.ndarray, iso_s: np.ndarray, need: np.ndarray,
             margin: float) -> np.ndarray:
    """Which merged candidates ``merge_ok`` refuses for certain, from batch step times: the step
    time over the members' bound, or the collective rate (``iso_s / step_s``) below ``need``
    (the apart rate plus the minimum gain), each by more than ``margin`` (the batch's
    ``REL_MARGIN``, ``tlora_sim.sim.costmodel.profiled.formula``) beyond the batch's error."""
    over = step_s > bound_s * (1 + 1e-12) * (1 + margin)
    short = (need > 0) & (iso_s / step_s * (1 + margin) < need * (1 - margin))
    return over | short


def batch_refusals(batch: Any, rows: np.ndarray, nano, bound_s, iso_s, need, members_of) -> np.ndarray:
    """Which merged candidates (feature ``rows``, shape (P, W), at nano-batch counts ``nano``) the
    batch cost model refuses for certain (``refused``; ``bound_s``, ``iso_s``, ``need``: scalars
    or shape (P,)). A one-GPU batch (``FusedBatch``) gives the step time itself. A multi-GPU
    batch (``PlannerBatch``) gives the fastest of the planner's row-additive plans; the
    candidates refused by that are checked against the ``local`` plan too (its placement is per
    member: ``members_of(i)`` gives candidate ``i``'s cost-model members), so the bound used is
    the minimum over every plan the planner may return, below its step time, and a refusal stays
    certain."""
    t = batch.step_times(rows, nano)
    ref = refused(t, bound_s, iso_s, need, batch.REL_MARGIN)
    local = getattr(batch, "local_step_times", None)
    if local is not None and ref.any():
        at = np.flatnonzero(ref)
        pick = (lambda v: v[at] if np.ndim(v) else v)
        tl = local([members_of(i) for i in at.tolist()], pick(nano))
        ref[at] = refused(np.minimum(t[at], tl), pick(np.asarray(bound_s)), pick(np.asarray(iso_s)),
                          pick(np.asarray(need)), batch.REL_MARGIN)
    return ref
