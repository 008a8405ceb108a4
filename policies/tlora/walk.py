"""tLoRA's queue walk over the engine's snapshot, through the index (issue 20): the placements of
``rules.walk_queue``, with work that does not grow with the queue.

Once GPU admission closes (the first head that can neither join a group nor get GPUs), a later head
can only *join* a group, and whether it finds a join target depends on its *shape* alone
(``tables.job_shape``) and on the plan, which changes only when a job is placed. So after admission
closes the walk visits one head per shape, the first of that shape in queue order, and revisits the
shapes that found nothing only after a placement of their kind (from the next job of the shape after
it). Across decisions, a shape that found no target (unable to start alone) keeps that answer while
its kind's running groups are unchanged and nothing of the kind is planned
(``QueueTable.no_target_at``, ``TLoRAIndex.kind_base``): the walk leaves such shapes out with one
array comparison. ``tests/policies/test_tlora_queue.py`` compares whole simulations with the plain walk.
"""

from __future__ import annotations

import heapq

import numpy as np

from tlora_sim.policies.tlora.queue import QueueOrder
from tlora_sim.policies.tlora.rules import join_window
from tlora_sim.sim.core.jobs import Job


def _none_for(ix, snap, plan, q: QueueOrder, kind: tuple, shapes: list[tuple[int, int]],
              no_target: dict) -> list[bool]:
    """For shapes of ``kind`` (position of a job of each, shape id) unable to start alone:
    whether each surely has no join target now, all at once where the kind's waiting shapes
    are many (``ColumnScreens.bulk_no_target``), else one by one
    (``TLoRAIndex.no_target``). Each such answer is recorded as ``target_of``
    records one (``no_target``, ``QueueTable.no_target_at``, ``_target_memo``), so the walk
    treats the shape as asked."""
    sids = [s for _, s in shapes]
    bulk = ix.columns.bulk_no_target(snap, plan, kind, sids)
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
            ix.target_memo.put_none(ix.columns.shape_mids(kind, sids[sure]), valid, covered)
        ix.shapes_in_bulk += len(done)
        ix.shapes_by_member += len(done)
    jkey_of = q.table.jkey_of
    for i in rest:
        pos, s = shapes[i]
        jkey = jkey_of[s]
        ans = ix.no_target(snap, plan, q.job(pos), kind, jkey)
        if ans is None:
            continue
        valid, covered = ans
        no_target[2 * s] = kv
        if not kv:
            q.table.no_target_at[s] = valid
        if covered is not None:
            ix.target_memo.put(ix.target_memo.key(kind, jkey), valid, None, covered)
        ix.shapes_by_member += 1
        out[i] = True
    return out

def walk(ix, snap, plan, q: QueueOrder) -> None:
    """Step 2 of a decision (``rules.walk_queue``) over the engine's snapshot, through index ``ix``
    (an ``index.TLoRAIndex``) and the queue in order ``q``: the same placements, visiting one head
    per job shape once admission has closed (see the module docstring)."""
    ix.begin_walk()
    ix.columns.close()
    placed: set[int] = set()
    # 2 x shape id + can_start -> its kind's plan version when it found no target: a join
    # target depends only on the job's shape and the groups of its kind (``Planner.kind_version``)
    no_target: dict[int, int] = {}
    kind_version = plan.kind_version
    cursor: dict[int, int] = {}
    kind_key = q.table.kind_key
    grouping = ix.config.grouping

    nt = q.table.no_target_at

    def target_of(head: Job, key: int, kind: tuple, can_start: bool, s: int):
        """(``head``'s join target, unless its shape (id ``s``; ``key`` = 2 s + can_start) found
        none since ``kind`` last changed; whether a "no target" rests on the pause test, which
        depends on the job's step count and the time: then it is not recorded for the shape, and
        the shape's next job is asked too)."""
        if no_target.get(key) == kind_version.get(kind, 0):
            return None, False
        before = ix.pol.budget_refusals
        target = ix.join_target(snap, plan, head, can_start)
        if target is None:
            if ix.pol.budget_refusals != before:
                return None, True
            kv = no_target[key] = kind_version.get(kind, 0)
            if not kv and not can_start:
                nt[s] = ix.kind_base(kind)
        return target, False

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
        target = target_of(head, 2 * s + can_start, kind_key[q.kind[p - 1]], can_start, s)[0]
        if target is None:
            if not can_start:
                break  # admission closes
            target = plan.start(head)
        else:
            plan.join(target, head)
        placed.add(head.index)
        _join_followers(ix, snap, plan, q, target, q.kind[p - 1], cursor, placed, True)
    else:
        return
    # admission closed: only joins remain; one head per shape until its kind changes
    heap: list[tuple[int, int]] = []
    dormant: dict[tuple, list[int]] = {}  # kind -> shapes that found no target at its version
    first, ids = q.first_of_shapes(p)
    ix.columns.open(q, first, ids)  # closed when the next walk begins
    # asleep: shapes whose last answer, unable to start alone, was "no target" when their kind's
    # running groups were as they are now and nothing of the kind is planned in this decision:
    # ``join_target`` would answer None from its memo, so they are not asked (a vectorised
    # test: a decision then costs nothing per queued shape of a kind that did not change)
    kinds_of = q.kind[first]
    quiet = np.full(len(kind_key), -3, np.int64)
    for k in np.unique(kinds_of).tolist():
        if not kind_version.get(kind_key[k], 0):
            quiet[k] = ix.kind_base(kind_key[k])
    asleep = nt[ids] == quiet[kinds_of]
    asleep_ids, asleep_kinds = ids[asleep], kinds_of[asleep]
    ix.shapes_asleep += len(asleep_ids)
    awake: dict[tuple, list[tuple[int, int]]] = {}  # kind -> (first position, shape id)
    for first_p, s, k in zip(first[~asleep].tolist(), ids[~asleep].tolist(), kinds_of[~asleep].tolist()):
        kind = kind_key[k]
        if no_target.get(2 * s) == kind_version.get(kind, 0):
            dormant.setdefault(kind, []).append(s)
        else:
            awake.setdefault(kind, []).append((first_p, s))
    for kind, lst in awake.items():
        for (first_p, s), none in zip(lst, _none_for(ix, snap, plan, q, kind, lst, no_target)):
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
        target, timed = target_of(head, 2 * s, kind, False, s)
        if target is None:
            if timed:  # the shape's next job may pass the pause test: asked in its turn
                for nxt in q.next_of_shapes([s], p, placed):
                    heapq.heappush(heap, nxt)
            else:
                dormant.setdefault(kind, []).append(s)
            continue
        plan.join(target, head)
        placed.add(head.index)
        _join_followers(ix, snap, plan, q, target, q.kind[p], cursor, placed, False)
        # the kind changed: its shapes are asked again from here on
        woken = dormant.pop(kind, []) + [s]
        if len(asleep_ids):
            sel = asleep_kinds == q.kind[p]
            if sel.any():
                woken += asleep_ids[sel].tolist()
                asleep_kinds[sel] = -1
        lst = q.next_of_shapes(woken, p, placed)
        for (nxt, d), none in zip(lst, _none_for(ix, snap, plan, q, kind, lst, no_target)):
            if none:
                dormant.setdefault(kind, []).append(d)  # as if asked now: no target
            else:
                heapq.heappush(heap, (nxt, d))

def _join_followers(ix, snap, plan, q: QueueOrder, target, kind: int, cursor: dict[int, int],
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
    w = ix.config.window
    cands = [j for j in (q.job(x) for x in pos[c:c + 2 * w]) if j.index not in placed][:w]
    join_window(snap, plan, target, cands, placed, admission_open, max_group_size=ix.config.max_group_size,
                ok=ix.pol.merge_ok)

