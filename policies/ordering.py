"""Queue orderings, shared by the policies and by their no-grouping ablations.

* ``fifo``: arrival order (``Job.index``).
* ``urgency`` (tLoRA, arXiv 2602.07263): highest urgency first, urgency = time waited so far over
  the job's isolated runtime (a response ratio: short jobs that waited long come first), then
  larger residual capacity first (tolerated slowdown minus one: jobs that co-locate easily), then
  arrival.
* ``srpt``: shortest isolated remaining runtime first (LoRA step times are predictable, so the
  remaining time is known), then arrival.
* ``backfill``: arrival order with EASY backfilling (Lifka 1995; Slurm's ``sched/backfill``
  default): when the head cannot start, it gets a reservation (the earliest time enough GPUs
  free up, from the running groups' predicted finishes), and a later job starts now if its GPUs
  are free and it either finishes before that time or uses only GPUs the head will not need.
  Ours where the papers are silent: GPUs are counted cluster-wide (placement on nodes is not
  reserved), a queued job's runtime is its isolated runtime, and a running group's finish is
  its slowest member's remaining steps at the current step time plus any pause.

Every policy takes ``ordering`` (``--option NAME.ordering=...``): ``ordered(snap, how)`` gives the
snapshot the policy decides on, and with ``backfill`` the policy's actions are followed by
``backfill_starts``, which starts the jobs the EASY rule admits, each alone, in the policy's plan.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, AddMembers, RemoveMembers, Snapshot, StartGroup, StopMembers
from tlora_sim.traces.errors import InputError


def urgency(job: Job, now_s: float) -> float:
    """Waited time over isolated runtime (dimensionless, >= 0)."""
    return max(now_s - job.submit_time_s, 0.0) / job.isolated_runtime_s


def order_queue(queue: Sequence[Job], how: str, now_s: float) -> list[Job]:
    """The queue sorted by ordering ``how`` (see module docstring).

    Raises:
        InputError: unknown ordering.
    """
    if check_ordering(how) in ("fifo", "backfill"):
        return list(queue)
    return sorted(queue, key=lambda j: ORDERINGS[how](j, now_s))


ORDERINGS: dict[str, Callable[[Job, float], tuple]] = {
    "fifo": lambda j, now: (j.index,),
    "backfill": lambda j, now: (j.index,),
    "urgency": lambda j, now: (-urgency(j, now), -(j.max_slowdown - 1.0), j.index),
    "srpt": lambda j, now: (j.isolated_runtime_s, j.index),
}


def check_ordering(how: str) -> str:
    """Validate an ordering name. Raises InputError naming the known ones."""
    if how not in ORDERINGS:
        raise InputError(f"unknown queue ordering {how!r}; known: {', '.join(ORDERINGS)}", field="ordering")
    return how


def ordered(snap: Snapshot, how: str) -> Snapshot:
    """``snap`` with its queue in ordering ``how`` (the same object for arrival order)."""
    if how in ("fifo", "backfill"):
        return snap
    return dataclasses.replace(snap, queue=tuple(order_queue(snap.queue, how, snap.now_s)))


def _group_finish_s(snap: Snapshot, g) -> float:
    """Predicted finish of running group ``g`` (s): its slowest member at the current step time."""
    rest = max(g.remaining_steps) if g.remaining_steps else 0.0
    return max(snap.now_s, g.paused_until_s) + rest * g.step_time_s


def backfill_starts(snap: Snapshot, actions: Sequence[Action], plan: str) -> list[StartGroup]:
    """EASY backfilling after a policy's ``actions`` (see the module docstring).

    Args:
        snap: the snapshot the actions were decided on (queue in arrival order).
        actions: the policy's actions of this decision (their starts and joins are respected).
        plan: the execution plan of the groups it starts (each job alone).

    Returns:
        The extra ``StartGroup`` actions, in arrival order.
    """
    placed = {i for a in actions if isinstance(a, (StartGroup, AddMembers)) for i in a.job_indices}
    free = snap.free.copy()
    started_end: list[tuple[float, int]] = []  # (finish, GPUs) of the groups the actions start
    jobs = {j.index: j for j in snap.queue}
    left = {gid: {j.index for j in g.members} for gid, g in snap.groups.items()}
    try:
        for a in actions:  # in the engine's order: a group emptied by the actions frees its GPUs
            if isinstance(a, StartGroup):
                free.apply(a.placement, -1)
                runtime = max(jobs[i].total_steps * jobs[i].isolated_step_time_s for i in a.job_indices)
                started_end.append((snap.now_s + runtime, sum(k for _, k in a.placement)))
            elif isinstance(a, (RemoveMembers, StopMembers)) and a.group_id in left:
                left[a.group_id] -= set(a.job_indices)
                if not left[a.group_id]:
                    free.apply(snap.groups[a.group_id].placement, +1)
                    del left[a.group_id]
            elif isinstance(a, AddMembers) and a.group_id in left:
                left[a.group_id] |= set(a.job_indices)
    except RuntimeError:  # actions this reading cannot follow: no backfilling in this decision
        return []
    waiting = [j for j in snap.queue if j.index not in placed]
    if not waiting:
        return []
    head, later = waiting[0], waiting[1:]
    if free.find(head.num_gpus) is not None:
        return []  # the head could start: the policy chose not to, and backfilling must not overtake it
    ends = sorted([(_group_finish_s(snap, g), g.n_gpus) for gid, g in snap.groups.items() if gid in left]
                  + started_end)
    avail, shadow, extra = free.total, float("inf"), 0
    for t, n in ends:
        avail += n
        if avail >= head.num_gpus:
            shadow, extra = t, avail - head.num_gpus
            break
    out: list[StartGroup] = []
    for j in later:
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
