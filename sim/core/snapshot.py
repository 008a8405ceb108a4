"""What a policy sees (a read-only snapshot) and what it may ask for (actions).

Policies are pure decisions: ``decide(snapshot) -> list[Action]`` (docs/model.md, "Policies are pure
decisions over a read-only snapshot"). The engine validates and applies the actions.
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass, fields
from typing import Iterator, Mapping, Sequence

from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.costmodel.interface import CostModel, Member
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus, Placement


@dataclass(frozen=True, slots=True)
class GroupView:
    """A running super-model group as a policy sees it.

    Attributes:
        group_id: engine-assigned id.
        model: base model shared by every member.
        n_gpus: GPUs the group holds.
        placement: ((node, gpus), ...).
        plan: execution plan (``tlora_sim.sim.costmodel.interface.PLANS``).
        members: member jobs, in join order.
        remaining_steps: steps each member still has to train (same order as ``members``).
        step_time_s: current group step time (s).
        paused_until_s: the group makes no progress before this time (regroup pause).
        version: changes whenever the membership or execution knobs change (memo key for policies).
        nano_batches: tLoRA nano-batches per micro-batch (``tlora_sim.sim.costmodel.interface``).
        micro_batches: sequential micro-batches per group step.
        started_s: when the group started (s).
    """

    group_id: int
    model: str
    n_gpus: int
    placement: Placement
    plan: str
    members: tuple[Job, ...]
    remaining_steps: tuple[float, ...]
    step_time_s: float
    paused_until_s: float
    version: int = 0
    nano_batches: int = 1
    micro_batches: int = 1
    started_s: float = 0.0

    @property
    def adapters(self) -> tuple[Member, ...]:
        """The members as cost-model members."""
        return tuple(j.member for j in self.members)


class QueueKeys:
    """The engine's queue keys (job indices, in queue order) as an int64 array kept up to date by
    the changes the engine reports, so that ``QueueView.indices`` costs O(changes) numpy work per
    decision instead of a Python-level pass over a long queue (issue 20). Mirrors a dict's order:
    new keys go last (``added``: keys never queued before), removals keep the order
    (``removed``); any other change (``reset``: the engine re-sorted its queue, or changes piled
    up unread) makes the next read rebuild from the dict."""

    __slots__ = ("_arr", "_add", "_drop", "_stale")

    SHORT = 1500
    """Queues shorter than this are read from the dict (numpy's per-call cost exceeds the pass)."""

    def __init__(self) -> None:
        self._arr = np.zeros(0, np.int64)
        self._add: list[int] = []
        self._drop: list[int] = []
        self._stale = True

    def _full(self) -> bool:
        if not self._stale and len(self._add) + len(self._drop) > 2 * len(self._arr) + 4096:
            self.reset()  # nobody reads the array (another policy): stop recording
        return self._stale

    def added(self, indices) -> None:
        """Keys inserted at the end of the queue, in order."""
        if not self._full():
            self._add.extend(indices)

    def removed(self, indices) -> None:
        """Keys deleted from the queue."""
        if not self._full():
            self._drop.extend(indices)

    def reset(self) -> None:
        """The queue changed otherwise: the next read rebuilds from the dict."""
        self._stale = True
        self._add.clear()
        self._drop.clear()

    def array(self, jobs: Mapping[int, Job]) -> np.ndarray:
        """The keys of ``jobs`` (the engine's queue) in order, shape (len(jobs),), int64."""
        if len(jobs) < self.SHORT:
            self._stale = True
        if not self._stale:
            arr = self._arr
            if self._add:
                arr = np.concatenate((arr, np.array(self._add, np.int64)))
            if self._drop:
                arr = arr[~np.isin(arr, np.array(self._drop, np.int64))]
            self._stale = len(arr) != len(jobs)  # a safety net: never an array of another length
            self._arr = arr
        if self._stale:
            self._arr = np.fromiter(jobs.keys(), np.int64, len(jobs))
        self._add.clear()
        self._drop.clear()
        self._stale = False
        return self._arr


class QueueView(Sequence):
    """``Snapshot.queue`` of an engine snapshot: the waiting jobs in arrival order, read from the
    engine's queue without copying it (issue 20: a decision that reads the first few jobs costs the
    same with 10 or 10,000 waiting). Iteration and ``len`` read the engine's dict; the first index
    or slice makes one tuple. Valid while the policy decides: the engine calls ``freeze`` once
    ``decide`` returns, after which any read raises (a policy must copy what it keeps)."""

    __slots__ = ("_jobs", "_tuple", "_keys")

    def __init__(self, jobs: Mapping[int, Job], keys: QueueKeys | None = None) -> None:
        self._jobs: Mapping[int, Job] | None = jobs  # job index -> job, arrival order; not mutated while deciding
        self._tuple: tuple[Job, ...] | None = None
        self._keys = keys  # the engine's running copy of the keys, if it keeps one

    def _live(self) -> Mapping[int, Job]:
        if self._jobs is None:
            raise RuntimeError("Snapshot.queue read after the decision returned; copy what you keep")
        return self._jobs

    def __len__(self) -> int:
        return len(self._live())

    def __iter__(self) -> Iterator[Job]:
        return iter(self._live().values())

    def __getitem__(self, i):
        if self._tuple is None:  # also after ``freeze``, which clears it: ``_live`` raises then
            self._tuple = tuple(self._live().values())
        return self._tuple[i]

    def indices(self) -> np.ndarray:
        """``Job.index`` of every waiting job, in queue order, shape (len,), int64: read from the
        engine's keys (its queue is keyed by job index), without touching the jobs."""
        jobs = self._live()
        if self._keys is not None:
            return self._keys.array(jobs)
        return np.fromiter(jobs.keys(), np.int64, len(jobs))

    def by_index(self, index: int) -> Job:
        """The waiting job whose ``Job.index`` is ``index`` (KeyError if it is not queued)."""
        return self._live()[index]

    def freeze(self) -> None:
        """Detach from the engine (called when ``decide`` returns)."""
        self._jobs = None
        self._tuple = None


class GroupViews(Mapping):
    """``Snapshot.groups`` of an engine snapshot: a group's view is built when the policy first reads it,
    so policies that never read groups (``independent``) pay nothing per running group.

    Valid while the policy decides: the engine calls ``freeze`` once ``decide`` returns; views read
    before stay readable, any other read then raises (a policy must copy what it keeps).
    """

    __slots__ = ("_build", "_groups", "_now", "_views")

    def __init__(self, groups: Mapping, build, now: float) -> None:
        """``groups``: the engine's running groups by id (not mutated while the policy decides);
        ``build(group, now)``: the view of one of them at ``now``."""
        self._build = build
        self._groups = groups
        self._now = now
        self._views: dict = {}

    def _live(self) -> Mapping:
        """The engine's groups; RuntimeError once the decision has returned (``freeze``)."""
        if self._groups is None:
            raise RuntimeError("Snapshot.groups read after the decision returned; copy what you keep")
        return self._groups

    def __getitem__(self, gid: int) -> GroupView:
        v = self._views.get(gid)
        if v is None:
            v = self._views[gid] = self._build(self._live()[gid], self._now)
        return v

    def __iter__(self):
        return iter(self._live())

    def size(self, gid: int) -> int:
        """Number of members of running group ``gid`` (``len(self[gid].members)``) without building
        its view. KeyError if it is not running."""
        return len(self._live()[gid].members)

    def __len__(self) -> int:
        return len(self._groups) if self._groups is not None else len(self._views)

    def __contains__(self, gid) -> bool:
        return gid in self._views or (self._groups is not None and gid in self._groups)

    def freeze(self) -> None:
        """Detach from the engine (called when ``decide`` returns)."""
        self._groups = None
        self._build = None


@dataclass(frozen=True)
class Snapshot:
    """Read-only state at one decision point.

    Attributes:
        now_s: simulated time (s).
        queue: waiting jobs in arrival order (ties by ``Job.index``).
        groups: running groups by id, in start order.
        free: free GPUs per node (take a ``.copy()`` to plan several starts in one decision).
        cluster: the cluster.
        cost_model: the cost model, for predictions.
        kinds: optional index (model, n_gpus) -> ids of the running groups of that kind, in start
            order (engine snapshots set it; valid while the policy decides).
        changed: ids of the groups started, changed or closed since the previous decision (engine
            snapshots set it; None = unknown), so a policy may keep state and touch only those.
    """

    now_s: float
    queue: Sequence[Job]
    groups: Mapping[int, GroupView]
    free: FreeGpus
    cluster: ClusterSpec
    cost_model: CostModel
    kinds: Mapping[tuple[str, int], Mapping[int, None]] | None = None
    changed: frozenset[int] | None = None

    def step_time_s(self, model: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> float:
        """Cost-model step time on this cluster's GPU type (s)."""
        return self.cost_model.step_time_s(model, self.cluster.gpu.name, members, n_gpus, plan,
                                           nano_batches, micro_batches)

    def fits_memory(self, model: str, members: Sequence[Member], n_gpus: int, plan: str,
                    micro_batches: int = 1) -> bool:
        """Whether the group fits in each GPU's memory under the cost model."""
        mem = self.cost_model.memory_bytes(model, self.cluster.gpu.name, members, n_gpus, plan, micro_batches)
        return mem <= self.cluster.gpu.memory_bytes


_SNAPSHOT_FIELDS = tuple(f.name for f in fields(Snapshot))
_new = object.__new__
_set = object.__setattr__


def engine_snapshot(now_s: float, queue: Sequence[Job], groups: Mapping[int, GroupView], free: FreeGpus,
                    cluster: ClusterSpec, cost_model: CostModel, kinds: Mapping | None,
                    changed: frozenset[int] | None) -> Snapshot:
    """``Snapshot(now_s, queue, groups, free, cluster, cost_model, kinds, changed)``, made with its
    fields' dict at once instead of the frozen dataclass's ``object.__setattr__`` per field
    (one snapshot per decision, millions on a long trace)."""
    snap = _new(Snapshot)
    _set(snap, "__dict__", {"now_s": now_s, "queue": queue, "groups": groups, "free": free, "cluster": cluster,
                            "cost_model": cost_model, "kinds": kinds, "changed": changed})
    return snap


assert _SNAPSHOT_FIELDS == tuple(vars(engine_snapshot(*_SNAPSHOT_FIELDS))), "engine_snapshot must set every Snapshot field"


@dataclass(frozen=True, slots=True)
class StartGroup:
    """Start a new group of queued jobs (all of one base model) on ``placement``."""

    job_indices: tuple[int, ...]
    placement: Placement
    plan: str
    nano_batches: int = 1
    micro_batches: int = 1


@dataclass(frozen=True, slots=True)
class AddMembers:
    """Add queued jobs to a running group (costs the group a regroup pause)."""

    group_id: int
    job_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RemoveMembers:
    """Preempt members of a running group back to the queue, keeping their progress."""

    group_id: int
    job_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StopMembers:
    """End members early (e.g. ALTO's early exit of a weak configuration): they finish now,
    having trained fewer than their total steps."""

    group_id: int
    job_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SetExecution:
    """Change a running group's nano-batch / micro-batch counts (no pause: same members)."""

    group_id: int
    nano_batches: int = 1
    micro_batches: int = 1


Action = StartGroup | AddMembers | RemoveMembers | StopMembers | SetExecution


