"""A scratch pad for one decision: groups as they would be after the actions planned so far.

Policies plan several starts and joins per decision; the planner keeps free GPUs and group
membership consistent while they do, then emits the engine actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import Placement
from tlora_sim.sim.core.snapshot import Action, AddMembers, RemoveMembers, Snapshot, StartGroup


@dataclass(eq=False)
class PlannedGroup:
    """A running group (``group_id`` set) or one planned in this decision (``group_id`` None)."""

    group_id: int | None
    version: int
    model: str
    n_gpus: int
    placement: Placement
    members: list[Job]
    added: list[Job] = field(default_factory=list)
    nano_batches: int = 1
    removed: list[Job] = field(default_factory=list)
    _cached: tuple = field(default=(), repr=False)
    bound_of: Callable[[Job], float] | None = field(default=None, repr=False)
    """A member's largest tolerated step time (s); None: max_slowdown x its eager isolated step
    time (``Job.isolated_step_time_s``). Policies that measure the promise against their own plan
    pass theirs (``TLoRA.job_bound_s``)."""

    def step_time_s(self, snap: Snapshot, plan: str, extra: Job | None = None) -> float:
        """Predicted step time with ``extra`` added (s); the value without ``extra`` is cached."""
        if extra is None:
            if not self._cached or self._cached[0] != len(self.members):
                self.know_step_time(snap.step_time_s(self.model, [j.member for j in self.members], self.n_gpus,
                                                     plan, self.nano_batches))
            return self._cached[1]
        return snap.step_time_s(self.model, [j.member for j in self.members] + [extra.member], self.n_gpus, plan,
                                self.nano_batches)

    def know_step_time(self, step_s: float, bound_s: float | None = None) -> None:
        """Cache ``step_s`` (s) as the group's predicted step time with its current members, and
        their slowdown bound with it (for a caller that already holds that prediction; ``bound_s``:
        the members' bound if the caller knows it, else computed)."""
        if bound_s is not None:
            bound = bound_s
        elif self.bound_of is not None:
            bound = min(map(self.bound_of, self.members))
        else:
            bound = min(j.max_slowdown * j.isolated_step_time_s for j in self.members)
        self._cached = (len(self.members), step_s, bound)

    def step_time_with(self, snap: Snapshot, plan: str, extra: list[Job]) -> float:
        """Predicted step time with all of ``extra`` added (s)."""
        return snap.step_time_s(self.model, [j.member for j in self.members + extra], self.n_gpus, plan,
                                self.nano_batches)

    def slowdown_bound_s(self, snap: Snapshot, plan: str) -> float:
        """Largest step time every current member tolerates: min_i max_slowdown_i x T_ref,i (s),
        T_ref the member's reference step time (``bound_of``; eager isolated by default)."""
        self.step_time_s(snap, plan)
        return self._cached[2]

    @property
    def cached(self) -> tuple:
        """(member count, step time s, slowdown bound s) as last computed or given
        (``know_step_time``), () if never: for a caller that reads many groups' cached values
        without a snapshot at hand."""
        return self._cached

    def fits(self, snap: Snapshot, plan: str, extra: Job) -> bool:
        """Whether the group with ``extra`` added fits in GPU memory."""
        return snap.fits_memory(self.model, [j.member for j in self.members + [extra]], self.n_gpus, plan)


class Planner:
    """Planned state for one decision over ``snap`` with execution plan ``plan``."""

    _serial = 0

    def __init__(self, snap: Snapshot, plan: str, protos: Mapping[int, PlannedGroup] | None = None,
                 bound_of: Callable[[Job], float] | None = None) -> None:
        """``protos``: optional group id -> the policy's own picture of a running group (its
        version, nano-batch count, cached step time); planned copies are cloned from it instead of
        read from the snapshot. It must agree with the snapshot on members, model and placement.
        ``bound_of``: the members' tolerated step time (``PlannedGroup.bound_of``) of every group
        it plans."""
        self.bound_of = bound_of
        self.snap = snap
        self.plan = plan
        self._protos = protos
        self.free = snap.free.copy()
        self._by_kind: dict[tuple[str, int], list[PlannedGroup]] = {}
        self._new: list[PlannedGroup] = []  # groups planned in this decision, in creation order
        self._groups: list[PlannedGroup] | None = None
        self.version = 0  # bumped by every planned start, join or merge
        self.kind_version: dict[tuple[str, int], int] = {}  # per (model, n_gpus): bumped when its groups change
        Planner._serial += 1
        self.serial = Planner._serial  # distinguishes planners (decisions)
        self.removed_groups: list[PlannedGroup] = []
        # With the engine's kind index, running groups are read (and copied) only for the kinds asked about.
        self._kinds = snap.kinds
        self._copies: dict[int, PlannedGroup] = {}
        self._joined: dict[int, PlannedGroup] = {}  # running groups given members in this decision
        self._new_by_kind: dict[tuple[str, int], list[PlannedGroup]] = {}
        self._removed_ids: set[int] = set()
        if self._kinds is None:
            for g in snap.groups.values():
                self._by_kind.setdefault((g.model, g.n_gpus), []).append(self.group(g.group_id))

    def _copy(self, gid: int) -> PlannedGroup:
        g = self._protos.get(gid) if self._protos is not None else None
        if g is None:
            g = self.snap.groups[gid]
        return PlannedGroup(gid, g.version, g.model, g.n_gpus, g.placement, list(g.members),
                            nano_batches=g.nano_batches, _cached=getattr(g, "_cached", ()), bound_of=self.bound_of)

    def _kind(self, kind: tuple[str, int]) -> list[PlannedGroup]:
        lst = self._by_kind.get(kind)
        if lst is None:
            lst = [self.group(gid) for gid in self._kinds.get(kind, ()) if gid not in self._removed_ids] \
                if self._kinds is not None else []
            lst += self._new_by_kind.get(kind, [])
            self._by_kind[kind] = lst
        return lst

    def new_of_kind(self, kind: tuple[str, int]) -> list[PlannedGroup]:
        """Groups of ``kind`` planned in this decision (creation order)."""
        return self._new_by_kind.get(kind, [])

    def joined(self, gid: int) -> bool:
        """Whether running group ``gid`` was given members in this decision."""
        return gid in self._joined

    def touched_ids(self):
        """Ids of the running groups given members or merged away in this decision."""
        return self._joined.keys() | self._removed_ids

    @property
    def removed_ids(self) -> set[int]:
        """Ids of the running groups merged away in this decision (the planner's own set: read it,
        do not change it)."""
        return self._removed_ids

    @property
    def joined_groups(self) -> Mapping[int, PlannedGroup]:
        """Running group id -> its planned copy, for the groups given members in this decision (the
        planner's own dict: read it, do not change it)."""
        return self._joined

    def removed(self, gid: int) -> bool:
        """Whether running group ``gid`` was merged away in this decision."""
        return gid in self._removed_ids

    def group(self, gid: int) -> PlannedGroup:
        """The planned copy of running group ``gid``, made on first use (the object ``candidates``
        lists, so changes planned on either are one)."""
        g = self._copies.get(gid)
        if g is None:
            g = self._copies[gid] = self._copy(gid)
        return g

    @property
    def groups(self) -> list[PlannedGroup]:
        """Running groups in start order, then the groups planned in this decision (creation order)."""
        if self._groups is None:
            if self._kinds is not None:
                for kind in self._kinds:
                    self._kind(kind)
            running = [g for lst in self._by_kind.values() for g in lst if g.group_id is not None]
            running.sort(key=lambda g: g.group_id)
            self._groups = running + self._new
        return self._groups

    def changed_groups(self) -> list[PlannedGroup]:
        """Groups given members in this decision (planned new ones and joined running ones)."""
        return self._new + list(self._joined.values())

    def candidates(self, job: Job) -> list[PlannedGroup]:
        """Groups ``job`` could join: same base model and GPU count (start/plan order)."""
        return self._kind((job.model, job.num_gpus))

    def open_candidates(self, job: Job, below: int) -> Iterator[PlannedGroup]:
        """The groups of ``candidates(job)`` with fewer than ``below`` members, in the same order,
        made lazily. A running group this decision has not copied yet is judged by its size in the
        snapshot (``Snapshot.groups.size`` of an engine snapshot), so the full ones are skipped
        without building their views or planned copies."""
        size = getattr(self.snap.groups, "size", None)
        kind = (job.model, job.num_gpus)
        if self._kinds is None or size is None or kind in self._by_kind:
            yield from (g for g in self.candidates(job) if len(g.members) < below)
            return
        for gid in self._kinds.get(kind, ()):
            if gid in self._removed_ids:
                continue
            g = self._copies.get(gid)
            if g is None and size(gid) >= below:
                continue
            g = self.group(gid) if g is None else g
            if len(g.members) < below:
                yield g
        yield from (g for g in self._new_by_kind.get(kind, []) if len(g.members) < below)

    def of_kind(self, kind: tuple[str, int]) -> list[PlannedGroup]:
        """Groups of base model and GPU count ``kind`` (start/plan order)."""
        return self._kind(kind)

    def start(self, job: Job) -> PlannedGroup | None:
        """Plan a new group for ``job`` alone on free GPUs; None if it does not fit now."""
        p = self.free.take(job.num_gpus)
        if p is None:
            return None
        g = PlannedGroup(None, 0, job.model, job.num_gpus, p, [job], [job], bound_of=self.bound_of)
        kind = (job.model, job.num_gpus)
        self._new_by_kind.setdefault(kind, []).append(g)
        if kind in self._by_kind:
            self._by_kind[kind].append(g)
        self._new.append(g)
        self._groups = None
        self.version += 1
        self._bump((job.model, job.num_gpus))
        return g

    def join(self, group: PlannedGroup, job: Job) -> None:
        """Plan ``job`` into ``group``."""
        group.members.append(job)
        group.added.append(job)
        if group.group_id is not None:
            self._joined[group.group_id] = group
        self.version += 1
        self._bump((group.model, group.n_gpus))

    def merge(self, src: PlannedGroup, dst: PlannedGroup) -> None:
        """Plan moving every member of running group ``src`` into ``dst`` (``src`` closes, its GPUs free)."""
        if src.group_id is None or src.added:
            raise ValueError("only unchanged running groups can be merged away")
        dst.members.extend(src.members)
        dst.added.extend(src.members)
        if dst.group_id is not None:
            self._joined[dst.group_id] = dst
        src.removed = list(src.members)
        src.members = []
        self.free.apply(src.placement, +1)
        lst = self._by_kind.get((src.model, src.n_gpus))  # a kind not read yet leaves src out when it is
        if lst is not None:
            lst.remove(src)
        self._groups = None
        self.removed_groups.append(src)
        self._removed_ids.add(src.group_id)
        self.version += 1
        self._bump((src.model, src.n_gpus))
        self._bump((dst.model, dst.n_gpus))

    def _bump(self, kind) -> None:
        self.kind_version[kind] = self.kind_version.get(kind, 0) + 1

    def actions(self) -> list[Action]:
        """The engine actions that realise the plan (removals, then starts, then joins)."""
        out: list[Action] = [RemoveMembers(g.group_id, tuple(j.index for j in g.removed))
                             for g in self.removed_groups]
        for g in self._new:
            out.append(StartGroup(tuple(j.index for j in g.members), g.placement, self.plan))
        for g in sorted(self._joined.values(), key=lambda g: g.group_id):
            out.append(AddMembers(g.group_id, tuple(j.index for j in g.added)))
        return out
