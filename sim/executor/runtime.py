"""The real-time executor: the simulator's policies driving real LoRA training on the wall clock.

A second backend beside the SimPy engine (``sim/core/engine.py``), with the same inputs (jobs, a
cluster, a cost model, a policy object) and the same interface to the policy: a read-only
``Snapshot`` in, ``StartGroup`` / ``AddMembers`` / ``RemoveMembers`` / ``StopMembers`` /
``SetExecution`` out, asked at the same moments (arrivals, finishes, a group shrinking, a member
preempted, the policy's ``timer_s``). What differs is time: a job arrives when the wall clock
passes its submit time, a group's steps are real training steps (``sim/executor/trainer.py``)
and a job finishes after its ``total_steps`` of them. Regroups (members joining, leaving or
preempted) save every member's adapter and AdamW state to the host and rebuild the group from
them; the group makes no progress meanwhile, so the pause is whatever that costs.

One device: a cluster of one GPU (or the CPU). Policies see the cost model's step times
(``GroupView.step_time_s``), as in a replay, and the real remaining steps.

The result is a ``SimResult`` (times in wall-clock seconds since the run started), so the run
directory is written by the replay's writers; ``StepLog`` rows record every measured step and
every regroup pause.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.core.engine import JobRecord, SimResult
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus
from tlora_sim.sim.core.snapshot import AddMembers, GroupView, RemoveMembers, SetExecution, Snapshot, StartGroup, \
    StopMembers
from tlora_sim.sim.costmodel.interface import CostModel

STEP_COLUMNS = ["group_id", "event", "jobs", "plan", "nano_batches", "start_s", "end_s", "ms"]
"""``steps.csv``: one row per measured step (``event=step``) or regroup (``event=regroup``:
the save/rebuild/restore pause; ``start``: a new group's build)."""


@dataclass
class _RealGroup:
    gid: int
    model: str
    n_gpus: int
    placement: tuple
    plan: str
    members: list[int]
    remaining: dict[int, int]
    started_s: float
    trainer: object = None
    nano_batches: int = 1
    micro_batches: int = 1
    version: int = 0
    step_time_s: float = 0.0
    steps_done: int = 0
    measured: list = field(default_factory=list)


class RealTimeExecutor:
    """Run ``jobs`` on one device in real time under ``policy``.

    Args:
        jobs: jobs in submit order (``Job.index`` = position); ``submit_time_s`` are wall-clock
            seconds after ``run`` starts.
        cluster: a one-GPU cluster (the device).
        cost_model: what the policy asks (``Snapshot.cost_model``) and ``GroupView.step_time_s``.
        policy: the policy object (``decide(Snapshot) -> list[Action]``, ``timer_s``).
        trainer: a ``sim.executor.trainer.DeviceTrainer`` (or anything with its ``group`` method).
        progress: optional callback ``progress(finished_jobs)``.

    Raises:
        ValueError: a cluster of more than one GPU, or jobs out of index order.
        RuntimeError: a policy action the executor cannot apply (the same rules as the engine's).
    """

    def __init__(self, jobs: Sequence[Job], cluster: ClusterSpec, cost_model: CostModel, policy, trainer,
                 progress: Callable[[int], None] | None = None, clock: Callable[[], float] = time.perf_counter):
        if cluster.total_gpus != 1:
            raise ValueError(f"the executor runs one device; cluster {cluster.spec} has {cluster.total_gpus} GPUs")
        self.jobs = list(jobs)
        if any(j.index != i for i, j in enumerate(self.jobs)):
            raise ValueError("jobs must be in index order")
        self.cluster, self.cost_model, self.policy, self.trainer = cluster, cost_model, policy, trainer
        self.gpu = cluster.gpu.name
        self.progress = progress
        self.clock = clock
        self.free = FreeGpus([cluster.gpus_per_node] * cluster.nodes, cluster.gpus_per_node, cluster.nodes_per_rack)
        self.queue: dict[int, Job] = {}
        self.remaining_queued: dict[int, int] = {}
        self.groups: dict[int, _RealGroup] = {}
        self.records = [JobRecord() for _ in self.jobs]
        self.log: list[dict] = []
        self.timeline: list[tuple] = []
        self._next_gid = self._finished = self._decisions = self._groups_started = 0
        self._decision_time = self._gpu_seconds = 0.0
        self._t0 = 0.0
        self._need = False
        self._next_timer = None
        self._dirty: set[int] = set()

    def now(self) -> float:
        """Wall-clock seconds since ``run`` started."""
        return self.clock() - self._t0

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Run until every job finished; the result in the engine's form."""
        self._t0 = self.clock()
        nxt = 0
        while self._finished < len(self.jobs):
            t = self.now()
            while nxt < len(self.jobs) and self.jobs[nxt].submit_time_s <= t:
                self.queue[nxt] = self.jobs[nxt]
                nxt += 1
                self._need = True
            if self._next_timer is not None and t >= self._next_timer:  # the policy's timer_s
                self._next_timer = None
                self._need = self._need or bool(self.groups or self.queue)
            if self._need:
                self._decide()
            if self.groups:
                for g in list(self.groups.values()):
                    self._step(g)
            elif nxt < len(self.jobs):
                time.sleep(max(0.0, min(self.jobs[nxt].submit_time_s - self.now(), 0.05)))
            elif not self.queue:
                raise RuntimeError(f"no job left to arrive and none running, yet {len(self.jobs) - self._finished} "
                                   "unfinished: the policy started nothing")
            elif not self._need:
                self._need = True  # jobs wait with a free device: ask again (a policy may have declined)
                time.sleep(0.01)
        return SimResult(self.jobs, self.records, self.timeline, self._gpu_seconds, len(self.log),
                         self._decisions, self._decision_time, self.now(), self._groups_started)

    def _decide(self) -> None:
        self._need = False
        t = self.now()
        views = {g.gid: GroupView(g.gid, g.model, g.n_gpus, g.placement, g.plan,
                                  tuple(self.jobs[i] for i in g.members),
                                  tuple(float(g.remaining[i]) for i in g.members), g.step_time_s, t, g.version,
                                  g.nano_batches, g.micro_batches, g.started_s) for g in self.groups.values()}
        kinds: dict = {}
        for g in self.groups.values():
            kinds.setdefault((g.model, g.n_gpus), {})[g.gid] = None
        snap = Snapshot(t, tuple(self.queue.values()), views, self.free.copy(), self.cluster, self.cost_model,
                        kinds, frozenset(self._dirty))
        self._dirty.clear()
        t0 = time.perf_counter()
        actions = self.policy.decide(snap)
        self._decision_time += time.perf_counter() - t0
        self._decisions += 1
        for a in actions:
            if isinstance(a, StartGroup):
                self._start(a)
            elif isinstance(a, AddMembers):
                g = self._group(a.group_id)
                self._regroup(g, g.members + self._take(a.job_indices))
            elif isinstance(a, RemoveMembers):
                g = self._group(a.group_id)
                for i in a.job_indices:
                    self.remaining_queued[i] = g.remaining[i]
                    self.queue[i] = self.jobs[i]
                    self.records[i].group_changes += 1
                self.queue = dict(sorted(self.queue.items()))
                self._regroup(g, [i for i in g.members if i not in a.job_indices])
                self._need = True
            elif isinstance(a, StopMembers):
                g = self._group(a.group_id)
                for i in a.job_indices:
                    self.records[i].early_exit = True
                self._finish(g, list(a.job_indices))
                self._need = True
            elif isinstance(a, SetExecution):
                g = self._group(a.group_id)
                g.nano_batches, g.micro_batches = a.nano_batches, a.micro_batches
                self._retime(g)
            else:
                raise RuntimeError(f"unknown action {a!r}")
        self._record()
        if self.policy.timer_s and self.groups and self._next_timer is None:
            self._next_timer = self.now() + self.policy.timer_s

    # ---- actions ----------------------------------------------------------------------------
    def _take(self, indices) -> list[int]:
        for i in indices:
            if i not in self.queue:
                raise RuntimeError(f"action names job index {i}, which is not queued")
        for i in indices:
            del self.queue[i]
        return list(indices)

    def _group(self, gid: int) -> _RealGroup:
        if gid not in self.groups:
            raise RuntimeError(f"action names group {gid}, which is not running")
        return self.groups[gid]

    def _start(self, a: StartGroup) -> None:
        idx = self._take(a.job_indices)
        if len({self.jobs[i].model for i in idx}) != 1:
            raise RuntimeError(f"StartGroup mixes base models: {idx}")
        self.free.apply(a.placement, -1)
        t = self.now()
        g = _RealGroup(self._next_gid, self.jobs[idx[0]].model, sum(k for _, k in a.placement), tuple(a.placement),
                       a.plan, [], {}, t, nano_batches=a.nano_batches, micro_batches=a.micro_batches)
        self._next_gid += 1
        self._groups_started += 1
        self.groups[g.gid] = g
        for i in idx:
            if self.records[i].start_s is None:
                self.records[i].start_s = t
        self._regroup(g, idx, event="start")

    def _regroup(self, g: _RealGroup, members: list[int], event: str = "regroup") -> None:
        """Save the current members' state, rebuild the group as ``members``, restore: timed."""
        t0 = self.now()
        if g.trainer is not None:
            g.trainer.save()
        g.trainer = None
        self.trainer.release()
        for i in members:
            if i not in g.remaining:
                g.remaining[i] = self.remaining_queued.pop(i, self.jobs[i].total_steps)
        for i in list(g.remaining):
            if i not in members:
                del g.remaining[i]
        g.members = list(members)
        if not members:
            self._close(g)
            return
        size = len(members)
        for i in members:
            r = self.records[i]
            if r.start_s is None:
                r.start_s = t0
            r.max_group_size = max(r.max_group_size, size)
            if event == "regroup":
                r.group_changes += 1
        js = [self.jobs[i] for i in members]
        g.trainer = self.trainer.group(g.model, g.plan, [(j.index, j.rank, j.batch_size, j.seq_len) for j in js])
        t1 = self.now()
        self.log.append({"group_id": g.gid, "event": event, "jobs": ";".join(str(j.index) for j in js), "plan": g.plan,
                         "nano_batches": g.nano_batches, "start_s": t0, "end_s": t1, "ms": (t1 - t0) * 1e3})
        self._retime(g)

    def _retime(self, g: _RealGroup) -> None:
        members = tuple(self.jobs[i].member for i in g.members)
        g.step_time_s = self.cost_model.step_time_s(g.model, self.gpu, members, g.n_gpus, g.plan, g.nano_batches,
                                                    g.micro_batches)
        g.version += 1
        self._dirty.add(g.gid)

    def _step(self, g: _RealGroup) -> None:
        t0 = self.now()
        ms = g.trainer.step(g.nano_batches)
        t1 = self.now()
        self.log.append({"group_id": g.gid, "event": "step", "jobs": ";".join(map(str, g.members)), "plan": g.plan,
                         "nano_batches": g.nano_batches, "start_s": t0, "end_s": t1, "ms": ms})
        done = []
        for i in g.members:
            g.remaining[i] -= 1
            self.records[i].steps_trained += 1
            if g.remaining[i] <= 0:
                done.append(i)
        if done:
            self._finish(g, done)
            self._need = True

    def _finish(self, g: _RealGroup, done: list[int]) -> None:
        t = self.now()
        for i in done:
            r = self.records[i]
            r.finish_s = t
            self._finished += 1
            if self.progress is not None:
                self.progress(self._finished)
        left = [i for i in g.members if i not in done]
        if left:
            self._regroup(g, left)
        else:
            g.trainer = None
            g.members = []
            self.trainer.release()
            self._close(g)

    def _close(self, g: _RealGroup) -> None:
        self.free.apply(g.placement, +1)
        self._gpu_seconds += g.n_gpus * (self.now() - g.started_s)
        self._dirty.add(g.gid)
        del self.groups[g.gid]
        self._record()

    def _record(self) -> None:
        running = sum(len(g.members) for g in self.groups.values())
        alloc = sum(g.n_gpus for g in self.groups.values())
        tok = sum(sum(self.jobs[i].tokens_per_step for i in g.members) / g.step_time_s
                  for g in self.groups.values() if g.step_time_s > 0)
        self.timeline.append((self.now(), running, len(self.queue), len(self.groups), alloc, tok, 0.0))
