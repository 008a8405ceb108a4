"""A scratch pad for one decision: groups as they would be after the actions planned so far.

Policies plan several starts and joins per decision; the planner keeps free GPUs and group
membership consistent while they do, then emits the engine actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.jobs import Job
from sim.placement import Placement
from sim.snapshot import Action, AddMembers, RemoveMembers, Snapshot, StartGroup


@dataclass
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

    def step_time_s(self, snap: Snapshot, plan: str, extra: Job | None = None) -> float:
        """Predicted step time with ``extra`` added (s); the value without ``extra`` is cached."""
        if extra is None:
            if not self._cached or self._cached[0] != len(self.members):
                t = snap.step_time_s(self.model, [j.member for j in self.members], self.n_gpus, plan,
                                     self.nano_batches)
                bound = min(j.max_slowdown * j.isolated_step_time_s for j in self.members)
                self._cached = (len(self.members), t, bound)
            return self._cached[1]
        return snap.step_time_s(self.model, [j.member for j in self.members] + [extra.member], self.n_gpus, plan,
                                self.nano_batches)

    def step_time_with(self, snap: Snapshot, plan: str, extra: list[Job]) -> float:
        """Predicted step time with all of ``extra`` added (s)."""
        return snap.step_time_s(self.model, [j.member for j in self.members + extra], self.n_gpus, plan,
                                self.nano_batches)

    def slowdown_bound_s(self, snap: Snapshot, plan: str) -> float:
        """Largest step time every current member tolerates: min_i max_slowdown_i x T_iso,i (s)."""
        self.step_time_s(snap, plan)
        return self._cached[2]

    def fits(self, snap: Snapshot, plan: str, extra: Job) -> bool:
        """Whether the group with ``extra`` added fits in GPU memory."""
        return snap.fits_memory(self.model, [j.member for j in self.members + [extra]], self.n_gpus, plan)


class Planner:
    """Planned state for one decision over ``snap`` with execution plan ``plan``."""

    def __init__(self, snap: Snapshot, plan: str) -> None:
        self.snap = snap
        self.plan = plan
        self.free = snap.free.copy()
        self.groups: list[PlannedGroup] = []
        self._by_kind: dict[tuple[str, int], list[PlannedGroup]] = {}
        self.version = 0  # bumped by every planned start, join or merge
        self.removed_groups: list[PlannedGroup] = []
        for g in snap.groups.values():
            self._add(PlannedGroup(g.group_id, g.version, g.model, g.n_gpus, g.placement, list(g.members),
                                   nano_batches=g.nano_batches))

    def _add(self, g: PlannedGroup) -> None:
        self.groups.append(g)
        self._by_kind.setdefault((g.model, g.n_gpus), []).append(g)

    def candidates(self, job: Job) -> list[PlannedGroup]:
        """Groups ``job`` could join: same base model and GPU count (start/plan order)."""
        return self._by_kind.get((job.model, job.num_gpus), [])

    def start(self, job: Job) -> PlannedGroup | None:
        """Plan a new group for ``job`` alone on free GPUs; None if it does not fit now."""
        p = self.free.take(job.num_gpus)
        if p is None:
            return None
        g = PlannedGroup(None, 0, job.model, job.num_gpus, p, [job], [job])
        self._add(g)
        self.version += 1
        return g

    def join(self, group: PlannedGroup, job: Job) -> None:
        """Plan ``job`` into ``group``."""
        group.members.append(job)
        group.added.append(job)
        self.version += 1

    def merge(self, src: PlannedGroup, dst: PlannedGroup) -> None:
        """Plan moving every member of running group ``src`` into ``dst`` (``src`` closes, its GPUs free)."""
        if src.group_id is None or src.added:
            raise ValueError("only unchanged running groups can be merged away")
        dst.members.extend(src.members)
        dst.added.extend(src.members)
        src.removed = list(src.members)
        src.members = []
        self.free.apply(src.placement, +1)
        self.groups.remove(src)
        self._by_kind[(src.model, src.n_gpus)].remove(src)
        self.removed_groups.append(src)
        self.version += 1

    def actions(self) -> list[Action]:
        """The engine actions that realise the plan (removals, then starts, then joins)."""
        out: list[Action] = [RemoveMembers(g.group_id, tuple(j.index for j in g.removed))
                             for g in self.removed_groups]
        for g in self.groups:
            if g.group_id is None:
                out.append(StartGroup(tuple(j.index for j in g.members), g.placement, self.plan))
        for g in self.groups:
            if g.group_id is not None and g.added:
                out.append(AddMembers(g.group_id, tuple(j.index for j in g.added)))
        return out
