"""Queue disciplines, shared by the policies and by their no-grouping ablations: a priority order
and a backfilling rule, two separate axes (``tlora_sim.policies.discipline`` names them).

Priority orders (``order``):

* ``fifo``: arrival order (``Job.index``).
* ``urgency`` (tLoRA, arXiv 2602.07263): highest urgency first, urgency = time waited so far over
  the job's isolated runtime (a response ratio: short jobs that waited long come first), then
  shorter isolated runtime first, then larger residual capacity first (tolerated slowdown minus
  one: jobs that co-locate easily), then arrival. The runtime key is ours: the order's limit as
  the wait goes to 0+. The engine decides exactly at arrival instants, where jobs that arrive
  together (common in ITP traces) all have urgency 0; a real scheduler decides a little after
  the arrival, where the urgencies wait / runtime already order those jobs shortest first.
  Without it the order would jump at zero wait (ties going to the tolerated slowdown), an
  artifact of the simulator's exact clock that no deployment sees.
* ``srpt``: shortest isolated remaining runtime first (LoRA step times are predictable, so the
  remaining time is known), then arrival. A queued job's progress is not in the snapshot, so for
  a job that never ran (every job in today's policies' queues) it is its whole isolated runtime.
* ``sjf``: shortest job first, by the isolated runtime of the whole job (Slurm's and the
  textbook's SJF), then arrival; the same key as ``srpt`` for jobs that never ran.
* ``srpt-aged`` (ours, ``lookahead``'s default): SRPT with a starvation guard. A job whose
  urgency (waited time over its isolated runtime) exceeds ``AGING_FACTOR`` is *starved*;
  starved jobs come first, by urgency (highest first), then the others in ``srpt`` order. Pure
  SRPT never lets a long job ahead of a stream of short ones, so a long multi-GPU job never
  becomes the first job in order, never gets EASY backfilling's reservation and can wait
  without bound; with the guard it is first once it has waited ``AGING_FACTOR`` of its own
  runtimes, and holds the reservation (the aging idea of priority schedulers, e.g. Slurm's
  multifactor age factor, with the wait counted in units of the job's own runtime as in
  tLoRA's urgency).

Backfilling (``backfill``):

* ``easy``: EASY backfilling (Lifka 1995; Slurm's ``sched/backfill`` default) on any priority
  order: the first waiting job *in priority order* that cannot start gets a reservation (the
  earliest time enough GPUs free up, from the running groups' predicted finishes), and a later
  job starts now if its GPUs are free and it either finishes before that time or uses only GPUs
  the reserved job will not need.
* ``conservative`` (Mu'alem and Feitelson 2001): every waiting job ahead keeps a reservation; a
  job starts now only if it delays none of them (``conservative_starts``: an availability profile
  of the cluster's GPU count over time, each waiting job in priority order reserved at the
  earliest time it fits).
* ``none``: strict head-of-line: the first job that cannot start stops every later start.

Ours where the papers are silent: GPUs are counted cluster-wide (placement on nodes is not
reserved), a queued job's runtime is its isolated runtime, and a running group's finish is its
slowest member's remaining steps at the current step time plus any pause.

Every policy takes ``order`` and ``backfill`` (``--option NAME.order=...``, ``NAME.backfill=...``;
``ordering`` is the older single option, mapped by ``discipline.LEGACY_ORDERING``, and overrides
both when given). ``ordered(snap, order)`` gives the snapshot the policy decides on, and with a
backfilling rule the policy's actions are followed by ``backfill_starts``, which starts the jobs
the rule admits, each alone, in the policy's lone-job plan.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, Sequence

from tlora_sim.policies.discipline import LEGACY_ORDERING, ORDERS, check_backfill, check_order
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, AddMembers, RemoveMembers, Snapshot, StartGroup, StopMembers
from tlora_sim.traces.errors import InputError


def urgency(job: Job, now_s: float) -> float:
    """Waited time over isolated runtime (dimensionless, >= 0)."""
    return max(now_s - job.submit_time_s, 0.0) / job.isolated_runtime_s


AGING_FACTOR = 3.0
"""Urgency (waited time over isolated runtime) above which ``srpt-aged`` counts a job as starved.
Chosen by measurement (issue 40, ITP cluster02 on 16x8xH100, 5 seeds, tLoRA's avg JCT over
``lookahead``'s, tLoRA before ``urgency``'s runtime key): 1.03 at 1, 1.04 at 2, 1.04 at 3, 1.00 at 6
(docs/policies.md; at 3 against tLoRA with the runtime key: 1.04 ± 0.02)."""


def aged_key(job: Job, now_s: float) -> tuple:
    """``srpt-aged`` sort key: (0, -urgency, index) for a starved job (urgency above
    ``AGING_FACTOR``), else (1, isolated runtime s, index)."""
    u = urgency(job, now_s)
    return (0, -u, job.index) if u > AGING_FACTOR else (1, job.isolated_runtime_s, job.index)


ORDER_KEYS: dict[str, Callable[[Job, float], tuple]] = {
    "fifo": lambda j, now: (j.index,),
    # runtime second: the order at wait 0+ (module docstring), so zero-wait ties go shortest first
    "urgency": lambda j, now: (-urgency(j, now), j.isolated_runtime_s, -(j.max_slowdown - 1.0), j.index),
    "srpt": lambda j, now: (j.isolated_runtime_s, j.index),
    "sjf": lambda j, now: (j.isolated_runtime_s, j.index),
    "srpt-aged": aged_key,
}
"""Sort key of each priority order (every key ends with the unique job index)."""

ORDERINGS = ORDER_KEYS  # the older name


def order_queue(queue: Sequence[Job], order: str, now_s: float) -> list[Job]:
    """The queue sorted by priority order ``order`` (see module docstring; a legacy ``ordering``
    value is read through ``LEGACY_ORDERING``).

    Raises:
        InputError: unknown order.
    """
    order = LEGACY_ORDERING[order][0] if order in LEGACY_ORDERING and order not in ORDERS else order
    check_order(order)
    if order == "fifo":
        return list(queue)
    return sorted(queue, key=lambda j: ORDER_KEYS[order](j, now_s))


def check_ordering(how: str) -> str:
    """Validate a legacy ``ordering`` value. Raises InputError naming the known ones."""
    if how not in LEGACY_ORDERING:
        raise InputError(f"unknown queue ordering {how!r}; known: {', '.join(LEGACY_ORDERING)}", field="ordering")
    return how


def resolve_discipline(order: str, backfill: str, ordering: str | None) -> tuple[str, str]:
    """The ``(order, backfill)`` a policy runs: ``ordering`` (legacy, when not None) mapped through
    ``LEGACY_ORDERING`` overrides both.

    Raises:
        InputError: an unknown order, backfilling rule or legacy ordering.
    """
    if ordering is not None:
        return LEGACY_ORDERING[check_ordering(ordering)]
    return check_order(order), check_backfill(backfill)


def ordered(snap: Snapshot, order: str) -> Snapshot:
    """``snap`` with its queue in priority order ``order`` (the same object for arrival order)."""
    if order in ("fifo", "backfill"):
        return snap
    return dataclasses.replace(snap, queue=tuple(order_queue(snap.queue, order, snap.now_s)))


def _group_finish_s(snap: Snapshot, g) -> float:
    """Predicted finish of running group ``g`` (s): its slowest member at the current step time."""
    rest = max(g.remaining_steps) if g.remaining_steps else 0.0
    return max(snap.now_s, g.paused_until_s) + rest * g.step_time_s


def _after_actions(snap: Snapshot, actions: Sequence[Action]):
    """(free GPUs, a function giving [(finish s, GPUs) of the groups still running after
    ``actions``], placed job indices) as the engine would leave them; None where the actions
    cannot be followed. Only the groups the actions touch are read before the ends are asked for
    (a running group's view costs; most decisions need none)."""
    placed = {i for a in actions if isinstance(a, (StartGroup, AddMembers)) for i in a.job_indices}
    free = snap.free.copy()
    started_end: list[tuple[float, int]] = []  # (finish, GPUs) of the groups the actions start
    jobs = {j.index: j for j in snap.queue}
    left: dict[int, set[int]] = {}  # members left in the groups the actions touch
    gone: set[int] = set()  # groups the actions empty

    def members(gid: int) -> set[int]:
        if gid not in left:
            left[gid] = {j.index for j in snap.groups[gid].members}
        return left[gid]

    try:
        for a in actions:  # in the engine's order: a group emptied by the actions frees its GPUs
            if isinstance(a, StartGroup):
                free.apply(a.placement, -1)
                runtime = max(jobs[i].total_steps * jobs[i].isolated_step_time_s for i in a.job_indices)
                started_end.append((snap.now_s + runtime, sum(k for _, k in a.placement)))
            elif isinstance(a, (RemoveMembers, StopMembers)) and a.group_id in snap.groups and a.group_id not in gone:
                m = members(a.group_id)
                m -= set(a.job_indices)
                if not m:
                    free.apply(snap.groups[a.group_id].placement, +1)
                    gone.add(a.group_id)
            elif isinstance(a, AddMembers) and a.group_id in snap.groups and a.group_id not in gone:
                members(a.group_id).update(a.job_indices)
    except (RuntimeError, KeyError):  # actions this reading cannot follow: no backfilling in this decision
        return None

    def ends() -> list[tuple[float, int]]:
        return [(_group_finish_s(snap, g), g.n_gpus) for gid, g in snap.groups.items() if gid not in gone] + started_end

    return free, ends, placed


def backfill_starts(snap: Snapshot, actions: Sequence[Action], plan: str, *, queue: Sequence[Job] | None = None,
                    rule: str = "easy", backfill_order: str | None = None) -> list[StartGroup]:
    """The starts backfilling admits after a policy's ``actions`` (see the module docstring).

    Args:
        snap: the snapshot the actions were decided on.
        actions: the policy's actions of this decision (their starts and joins are respected).
        plan: the execution plan of the groups it starts (each job alone).
        queue: the waiting jobs in the policy's priority order (default: ``snap.queue``, arrival
            order); the first one the actions left waiting that cannot start holds the reservation.
        rule: ``easy``, ``conservative`` or ``none`` (no start).
        backfill_order: the order later jobs are tried in (a priority order name; default: the
            order of ``queue``).

    Returns:
        The extra ``StartGroup`` actions, in the order they were admitted.

    Raises:
        InputError: an unknown rule or order.
    """
    check_backfill(rule)
    if rule == "none":
        return []
    got = _after_actions(snap, actions)
    if got is None:
        return []
    free, ends_of, placed = got
    waiting = [j for j in (snap.queue if queue is None else queue) if j.index not in placed]
    if not waiting:
        return []
    head = waiting[0]
    if free.find(head.num_gpus) is not None:
        return []  # the first job in order could start: the policy chose not to, and backfilling must not overtake it
    ends = ends_of()
    if rule == "conservative":
        return conservative_starts(snap, free, ends, waiting, plan)
    ends.sort()
    avail, shadow, extra = free.total, float("inf"), 0
    for t, n in ends:
        avail += n
        if avail >= head.num_gpus:
            shadow, extra = t, avail - head.num_gpus
            break
    later = waiting[1:]
    if backfill_order is not None:
        later = order_queue(later, backfill_order, snap.now_s)
    out: list[StartGroup] = []
    for j in later:
        if j.num_gpus > free.total:
            continue
        runtime = j.total_steps * j.isolated_step_time_s
        fits_before = snap.now_s + runtime <= shadow
        if not fits_before and j.num_gpus > extra:
            continue
        p = free.take(j.num_gpus)
        if p is None:
            continue
        if not fits_before:
            extra -= j.num_gpus
        out.append(StartGroup((j.index,), p, plan))
    return out


class _Profile:
    """Free GPUs of the cluster over time: a step function from ``now`` on (counts cluster-wide)."""

    def __init__(self, now_s: float, free_now: int, ends: list[tuple[float, int]]) -> None:
        self.t = [now_s]
        self.n = [free_now]
        for t, k in sorted(ends):
            self._add(max(t, now_s), float("inf"), k)

    def _split(self, t: float) -> int:
        i = bisect.bisect_left(self.t, t)
        if i < len(self.t) and self.t[i] == t:
            return i
        self.t.insert(i, t)
        self.n.insert(i, self.n[i - 1])
        return i

    def _add(self, t0: float, t1: float, k: int) -> None:
        i = self._split(t0)
        j = self._split(t1) if t1 != float("inf") else len(self.t)
        for x in range(i, j):
            self.n[x] += k

    def earliest(self, need: int, dur: float) -> float:
        """Earliest start time t with at least ``need`` GPUs free over [t, t + dur)."""
        for i, t in enumerate(self.t):
            end = t + dur
            ok = True
            for x in range(i, len(self.t)):
                if self.t[x] >= end:
                    break
                if self.n[x] < need:
                    ok = False
                    break
            if ok:
                return t
        return float("inf")

    def reserve(self, t0: float, dur: float, k: int) -> None:
        """Take ``k`` GPUs over [t0, t0 + dur)."""
        if t0 != float("inf"):
            self._add(t0, t0 + dur, -k)


def conservative_starts(snap: Snapshot, free, ends: list[tuple[float, int]], waiting: Sequence[Job],
                        plan: str) -> list[StartGroup]:
    """Conservative backfilling (Mu'alem and Feitelson 2001): each waiting job, in priority order,
    is reserved at the earliest time the availability profile fits it for its isolated runtime;
    a job whose reservation is now and whose GPUs are free now starts (alone, in ``plan``).
    Counts are cluster-wide, as for EASY; a job that fits the count but not the nodes now keeps
    a reservation now, so no later job takes its GPUs in this decision.

    Args:
        snap: the snapshot; free: free GPUs after the policy's actions; ends: (finish s, GPUs) of
            the groups running after them; waiting: the jobs left waiting, in priority order.
    """
    now = snap.now_s
    prof = _Profile(now, free.total, ends)
    out: list[StartGroup] = []
    for j in waiting:
        dur = j.total_steps * j.isolated_step_time_s
        t = prof.earliest(j.num_gpus, dur)
        if t <= now:
            p = free.take(j.num_gpus)
            if p is not None:
                out.append(StartGroup((j.index,), p, plan))
        prof.reserve(t, dur, j.num_gpus)
    return out
