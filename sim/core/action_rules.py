"""The rules a policy's actions must obey, shared by the SimPy engine and the real-time executor.

Both backends (``sim/core/engine.py``, ``sim/executor/runtime.py``) apply the same actions
(``snapshot.StartGroup`` / ``AddMembers`` / ``RemoveMembers`` / ``StopMembers`` /
``SetExecution``) under the same rules, checked here: the jobs named are queued (or members of the
group named), none twice, at least one; a new group's jobs share one base model, as do the jobs
joining a group and the group; the group named is running; nano- and micro-batch counts are >= 1.
A broken rule raises :class:`ActionRejected` with the one-line reason; the backend turns it into
its invariant error (``InvariantError``, or the checker's ``InvariantViolation`` with the recent
history), so a policy's bad action reads the same whichever backend ran it.

The checks are plain functions over the backend's own containers (a dict of queued jobs by index,
a dict of running groups by id, a group's remaining steps by member) so that the engine's hot path
pays a function call and no copy.
"""

from __future__ import annotations

from typing import Any, Mapping, MutableMapping, Sequence


class ActionRejected(Exception):
    """A policy action the backend cannot apply; ``str(e)`` is the reason (one line), e.g.
    ``StartGroup names job index 7, which is not queued``."""


def take_queued(queue: MutableMapping[int, Any], indices: Sequence[int], what: str) -> list[int]:
    """Remove the jobs ``indices`` from ``queue`` (job index -> job) for action ``what``.

    Returns:
        ``indices`` as a list, in the action's order.

    Raises:
        ActionRejected: no jobs, a job not queued, or a job named twice (checked in that order,
            before anything is removed).
    """
    if not indices:
        raise ActionRejected(f"{what} with no jobs")
    for i in indices:
        if i not in queue:
            raise ActionRejected(f"{what} names job index {i}, which is not queued")
    if len(indices) > 1 and len(set(indices)) != len(indices):
        raise ActionRejected(f"{what} names a job twice: {indices}")
    for i in indices:
        del queue[i]
    return list(indices)


def one_model(jobs: Sequence[Any], indices: Sequence[int]) -> str:
    """The base model of a new group of ``jobs[i]`` for ``i`` in ``indices`` (non-empty).

    Raises:
        ActionRejected: the jobs name more than one base model (``StartGroup mixes base models``).
    """
    model = jobs[indices[0]].model
    if len(indices) > 1 and any(jobs[i].model != model for i in indices):
        raise ActionRejected(f"StartGroup mixes base models {sorted({jobs[i].model for i in indices})}")
    return model


def same_model(jobs: Sequence[Any], indices: Sequence[int], model: str) -> None:
    """Check that the jobs joining a ``model`` group (``AddMembers``) train that base model.

    Raises:
        ActionRejected: naming the job ids of those that do not.
    """
    bad = [jobs[i].job_id for i in indices if jobs[i].model != model]
    if bad:
        raise ActionRejected(f"AddMembers puts jobs {bad} on a {model} group")


def running_group(groups: Mapping[int, Any], gid: int, what: str) -> Any:
    """The running group ``gid`` of ``groups`` (group id -> group) that action ``what`` names.

    Raises:
        ActionRejected: no group ``gid`` is running.
    """
    g = groups.get(gid)
    if g is None:
        raise ActionRejected(f"{what} names group {gid}, which is not running")
    return g


def check_members(gid: int, members: Mapping[int, Any], indices: Sequence[int], what: str) -> None:
    """Check that ``indices`` are members of group ``gid`` (``members``: its remaining steps by
    job index), none twice, at least one (``RemoveMembers``, ``StopMembers``).

    Raises:
        ActionRejected: no jobs, a job named twice, or a job not in the group.
    """
    if not indices:
        raise ActionRejected(f"{what} on group {gid} with no jobs")
    if len(set(indices)) != len(indices):
        raise ActionRejected(f"{what} names a job twice: {indices}")
    for i in indices:
        if i not in members:
            raise ActionRejected(f"{what}: job index {i} not in group {gid}")


def check_counts(action: Any) -> None:
    """Check a ``SetExecution``'s ``nano_batches`` and ``micro_batches`` (both >= 1).

    Raises:
        ActionRejected: either count is below 1.
    """
    if action.nano_batches < 1 or action.micro_batches < 1:
        raise ActionRejected(f"SetExecution needs counts >= 1, got {action}")


BOOKING_ERRORS = (RuntimeError, IndexError, TypeError)
"""What ``placement.FreeGpus.apply`` (and the executor's device slots) raise for a placement that
takes GPUs not free, on a node that does not exist, or in a malformed shape."""


def double_booked(indices: Sequence[int], placement: Any, error: BaseException) -> ActionRejected:
    """The rejection of a ``StartGroup`` of ``indices`` whose ``placement`` could not be booked
    (``error``: one of :data:`BOOKING_ERRORS`)."""
    return ActionRejected(f"StartGroup {list(indices)} on {placement} double-books GPUs: {error}")


def unknown_action(action: Any) -> ActionRejected:
    """The rejection of something that is no action the backends know."""
    return ActionRejected(f"unknown action {action!r}")
