"""The real-time executor: the simulator's policies driving real LoRA training.

A second backend beside the SimPy engine (``sim/core/engine.py``), with the same inputs (jobs, a
cluster, a cost model, a policy object) and the same interface to the policy: a read-only
``Snapshot`` in, ``StartGroup`` / ``AddMembers`` / ``RemoveMembers`` / ``StopMembers`` /
``SetExecution`` out, asked at the same moments (arrivals, finishes, a group shrinking, a member
preempted, the policy's ``timer_s``), under the same rules: the engine's invariant checker
(``sim/core/invariants.py``) keeps independent books on every start, join, leave, finish and
close (GPUs never double-booked, memory under the GPU's, every job finished once after exactly its
steps), and an action the executor cannot apply raises the engine's ``InvariantViolation``.

What differs is time. A job arrives when the clock passes its submit time; a group's step is a
real training step (``sim/executor/trainer.py``); a job finishes after its ``total_steps`` real
steps. Every membership change (a join, a leave, a preemption, a member finishing or stopped) saves
the members' adapter and AdamW state to the host and rebuilds the super-model from the saved
states; the group makes no progress meanwhile, so that pause is whatever it costs. Decisions are
taken between steps (a step in flight completes first).

Clocks (``sim/executor/clock.py``): one device (a GPU, or the CPU) runs on the wall clock, where
steps, saves and rebuilds cost the wall time they take; N devices simulated on the CPU run on a
virtual clock, each group's step, save and build costing what the trainer reports (a step's returned
ms, ``save()``'s returned ms, the built group's ``build_ms``: a ``DeviceTrainer`` times them itself,
a modelled trainer returns its model's values) charged to its own devices, never the host's time
around them (a loaded host's pauses do not land in the run), the groups interleaved step by step in
the order their devices come free. A group on several simulated devices trains one data-parallel
replica's share of every member's sequences (``ceil(batch / n_gpus)``) and charges it to all of them
(no gradient all-reduce on the CPU). With a ``WorkerPool`` as the trainer (one worker process per
real device: ``--device cuda --gpus N``, ``--device cpu --gpus N --processes``) N devices run on the
wall clock, groups side by side, a group on k devices data-parallel over k workers
(``poolloop.py``).

Policies see the cost model's step times (``GroupView.step_time_s``, ``Snapshot.cost_model``),
exactly as in a replay, and the real remaining steps. The result is a ``SimResult`` (times in
seconds since the run started), so the run directory is written by the replay's writers;
``log`` rows (``STEP_COLUMNS``) record every measured step and rebuild.

Host-speed probes (issue 43, ``sim/executor/probe.py``): on one device on the wall clock (not the
virtual clock, not a worker pool's ``poolloop.py``), a probe given to the executor is measured
whenever it is due, between steps (never inside one: after the due arrivals were decided and the
changed groups rebuilt, before the next step; arrivals during the probe are decided before that
step) and during idle waits (which end at the due time); ``probes`` rows (``probe.COLUMNS``)
record each measurement.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from tlora_sim.sim.core import action_rules as rules
from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.core.results import JobRecord, SimResult
from tlora_sim.sim.core.invariants import InvariantChecker
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus
from tlora_sim.sim.core.snapshot import (AddMembers, GroupView, RemoveMembers, SetExecution, Snapshot, StartGroup,
                                         StopMembers)
from tlora_sim.sim.costmodel.interface import CostModel
from tlora_sim.sim.executor.clock import DeviceSlots, VirtualClock, WallClock
from tlora_sim.sim.executor.poolloop import PoolLoop

STEP_COLUMNS = ["group_id", "event", "jobs", "plan", "nano_batches", "micro_batches", "n_gpus", "devices", "start_s",
                "end_s", "ms"]
"""``steps.csv``: one row per measured step (``event=step``) or rebuild (``start``: a new group's
build; ``regroup``: save, rebuild and restore after a membership change; ``close``: the last save
of a group whose members all left). ``jobs``: the members' job indices, ``;``-separated, in
segment order; ``devices``: the device ids held, ``;``-separated; ``start_s``/``end_s``: clock
seconds since the run started; ``ms``: the duration charged: on the wall clock the measured one (a
step's is device-synchronised), on the virtual clock the trainer's (a step's return; a rebuild's
save plus ``build_ms``)."""


def _reported_s(ms, what: str, gid: int) -> float:
    """Seconds of a cost a trainer reports in ms (a group's ``build_ms``, ``save()``'s return).

    Raises:
        ValueError: not a finite number >= 0 (a trainer on the virtual clock must say what its
            rebuilds cost).
    """
    try:
        v = float(ms)
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v < math.inf:
        raise ValueError(f"group {gid}: the trainer reported {what} = {ms!r}; on the virtual clock a trainer's "
                         "group reports build_ms and save() returns ms (finite, >= 0)")
    return v / 1e3


@dataclass
class _RealGroup:
    gid: int
    model: str
    n_gpus: int
    placement: tuple
    devices: tuple
    plan: str
    members: list[int]
    remaining: dict[int, int]
    started_s: float
    nano_batches: int = 1
    micro_batches: int = 1
    trainer: object = None
    trainer_jobs: tuple = ()
    version: int = 0
    step_time_s: float = 0.0
    free_s: float = 0.0  # when its devices finish the work scheduled so far (clock s)
    paused_until_s: float = 0.0  # end of its last rebuild
    inflight: tuple | None = None  # (start_s, end_s) of a step run but not yet credited
    pending: str | None = None  # "start" / "regroup": members changed, rebuild at the next flush
    save_span: tuple | None = None  # (start_s, seconds) of its last save
    running: str | None = None  # worker processes: "step" / "build" sent, not yet answered by all


class RealTimeExecutor(PoolLoop):
    """Run ``jobs`` on the cluster's devices in real time under ``policy``.

    Args:
        jobs: jobs in submit order (``Job.index`` = position); ``submit_time_s`` are clock seconds
            after ``run`` starts.
        cluster: the devices: one (wall clock), or N simulated on the CPU (virtual clock).
        cost_model: what the policy asks (``Snapshot.cost_model``) and ``GroupView.step_time_s``.
        policy: the policy object (``decide(Snapshot) -> list[Action]``, ``timer_s``).
        trainer: a ``sim.executor.trainer.DeviceTrainer`` (anything with its ``group`` and
            ``release`` methods; ``group`` returns an object with ``step(nano, micro) -> ms``,
            ``save() -> ms`` and ``build_ms``, the costs the virtual clock charges), or a
            ``sim.executor.workers.WorkerPool`` of one worker process per device (``parallel``:
            the wall clock, groups side by side, ``poolloop.py``).
        progress: optional callback ``progress(finished_jobs)``.
        clock: a ``WallClock`` or ``VirtualClock`` (default: wall for one device or a worker
            pool, virtual for several simulated devices).
        probe: optional host-speed probe (anything with ``measure() -> {"probe_ms", "python_ms"}``,
            e.g. ``probe.HostProbe`` on the trainer's device), measured every ``probe_every_s``
            clock seconds, the first at the run's start: due when ``now >= next``, then ``next =
            the probe's start + probe_every_s``. One device on the wall clock only. Each
            measurement appends ``{"t_s": clock s at its start, "probe_ms", "python_ms"}`` to
            ``probes``; ``probe_s`` sums their wall seconds (what probing cost the run).
        probe_every_s: seconds between probes (> 0 where a probe is given).

    Raises:
        ValueError: jobs out of index order, several devices on the wall clock without a worker
            pool, a pool on another number of devices or on the virtual clock, a probe on the
            virtual clock, with a pool, or with ``probe_every_s <= 0``, or (on the virtual clock,
            during ``run``) a trainer's ``build_ms`` or ``save()`` that is not a finite ms >= 0.
        InvariantError: a policy action the executor cannot apply (the engine's rules), a
            violated invariant, or jobs the policy leaves queued with nothing left to happen.
    """

    def __init__(self, jobs: Sequence[Job], cluster: ClusterSpec, cost_model: CostModel, policy, trainer,
                 progress: Callable[[int], None] | None = None, clock=None, probe=None,
                 probe_every_s: float = 0.0):
        self.jobs = list(jobs)
        if any(j.index != i for i, j in enumerate(self.jobs)):
            raise ValueError("jobs must be in index order")
        self.pool = trainer if getattr(trainer, "parallel", False) else None
        wall = cluster.total_gpus == 1 or self.pool is not None
        self.clock = clock if clock is not None else (WallClock() if wall else VirtualClock())
        if self.pool is not None and (self.pool.n != cluster.total_gpus or self.clock.virtual):
            raise ValueError(f"a pool of {self.pool.n} worker(s) drives {cluster.total_gpus} real device(s) on the "
                             "wall clock only")
        if cluster.total_gpus > 1 and not self.clock.virtual and self.pool is None:
            raise ValueError(f"cluster {cluster.spec} has {cluster.total_gpus} devices: one process drives one real "
                             "device, so several are simulated on the virtual clock")
        if probe is not None and (self.clock.virtual or self.pool is not None or not probe_every_s > 0):
            raise ValueError("a host-speed probe runs on one device on the wall clock, every probe_every_s > 0 s "
                             f"(got virtual={self.clock.virtual}, pool={self.pool is not None}, "
                             f"probe_every_s={probe_every_s})")
        self.probe, self.probe_every_s = probe, probe_every_s
        self.probes: list[dict] = []  # probe.COLUMNS rows
        self.probe_s = 0.0  # wall seconds spent measuring probes
        self._next_probe = 0.0  # clock s the next probe is due
        self.cluster, self.cost_model, self.policy, self.trainer = cluster, cost_model, policy, trainer
        self.gpu = cluster.gpu.name
        self.progress = progress
        self.free = FreeGpus([cluster.gpus_per_node] * cluster.nodes, cluster.gpus_per_node, cluster.nodes_per_rack)
        self.slots = DeviceSlots(cluster.nodes, cluster.gpus_per_node)
        self.checker = InvariantChecker(self.jobs, cluster, cost_model)
        # the isolation floor compares a JCT with the cost model's isolated runtime: real steps may be faster
        self.checker.solo = bytearray(len(self.jobs))
        self.queue: dict[int, Job] = {}
        self.remaining_queued: dict[int, int] = {}
        self.state_ready: dict[int, float] = {}  # job -> when its saved state is on the host (clock s)
        self.groups: dict[int, _RealGroup] = {}
        self.records = [JobRecord() for _ in self.jobs]
        self.log: list[dict] = []
        self.timeline: list[tuple] = []
        self._next = self._next_gid = self._finished = self._decisions = self._groups_started = 0
        self._decision_time = self._gpu_seconds = 0.0
        self._admitted_at_s: float | None = None  # submit instant of the jobs admitted for the next decision
        self._need = self._shrunk = False
        self._next_timer: float | None = None
        self._dirty: set[int] = set()
        self._pool_init()

    def now(self) -> float:
        """Clock seconds since ``run`` started."""
        return self.clock.now()

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Run until every job finished; the result in the engine's form (``wall_s``: real seconds)."""
        wall0 = time.perf_counter()
        self.clock.start()
        while self._finished < len(self.jobs):
            t = self.now()
            more = self._admit(t)
            if self._next_timer is not None and t >= self._next_timer:  # the policy's timer_s
                self._next_timer = None
                self._need = self._need or bool(self.groups or self.queue)
            while True:
                while self._need:
                    self._decide()
                if not more:
                    break
                more = self._admit(self.now())
            self._flush()
            if self._finished == len(self.jobs):
                break
            if self._probe_if_due():  # between steps, after the due arrivals were decided;
                continue  # those that came during the probe are decided before the next step
            if self.clock.virtual:
                self._advance_virtual()
            elif self.pool is not None:
                self._advance_pool()
            else:
                self._advance_wall()
        if self.groups or self.free.total != self.cluster.total_gpus:
            self._fail(f"devices still held after the last job finished: groups {sorted(self.groups)}")
        return SimResult(self.jobs, self.records, self.timeline, self._gpu_seconds, len(self.log), self._decisions,
                         self._decision_time, time.perf_counter() - wall0, self._groups_started)

    def _probe_if_due(self) -> bool:
        """Measure the host-speed probe if it is due (``now >= next``); the next is due one
        ``probe_every_s`` after this one's start. Returns whether it measured."""
        if self.probe is None:
            return False
        t0 = self.now()
        if t0 < self._next_probe:
            return False
        w0 = time.perf_counter()
        m = self.probe.measure()
        self.probe_s += time.perf_counter() - w0
        self.probes.append({"t_s": t0, "probe_ms": float(m["probe_ms"]), "python_ms": float(m["python_ms"])})
        self._next_probe = t0 + self.probe_every_s
        return True

    def _next_arrival_s(self) -> float:
        return self.jobs[self._next].submit_time_s if self._next < len(self.jobs) else math.inf

    def _admit(self, t: float) -> bool:
        """Queue the jobs of the earliest submit instant that is due at clock time ``t`` (one
        instant per call, as the engine's arrival events come: a wake-up a few ms late, or a step
        that outlasts several arrivals, must not hand the policy jobs of a later instant in the same
        decision). Returns whether jobs of a later instant are due too (call again after deciding)."""
        jobs, first = self.jobs, self._next
        if first < len(jobs) and jobs[first].submit_time_s <= t:
            instant = jobs[first].submit_time_s
            while self._next < len(jobs) and jobs[self._next].submit_time_s == instant:
                self.queue[self._next] = jobs[self._next]
                self._next += 1
            self.checker.arrive(self.now(), range(first, self._next))
            self._need = True
            self._admitted_at_s = instant
        return self._next < len(jobs) and jobs[self._next].submit_time_s <= t

    def _stalled(self) -> None:
        left = [j.job_id for j in self.jobs if self.records[j.index].finish_s is None]
        self._fail(f"policy {getattr(self.policy, 'name', '?')} left {len(left)} job(s) unfinished with nothing "
                   f"running and nothing left to arrive (first: {left[:5]}); queue={len(self.queue)}")

    def _advance_wall(self) -> None:
        """One device on the wall clock: run a step of every group (one on one device) and credit it."""
        if self.groups:
            for g in list(self.groups.values()):
                if g.gid in self.groups:
                    self._launch(g)
                    self._complete(g)
        elif self._next < len(self.jobs):  # idle: wake for the next arrival, or the next probe if sooner
            wake = self._next_arrival_s()
            if self.probe is not None:
                wake = min(wake, self._next_probe)
            self.clock.idle_until(wake)
        else:
            self._stalled()

    def _advance_virtual(self) -> None:
        """Simulated devices: process the earliest of the next step end (or step start), arrival
        and timer; arrivals and timers first on ties."""
        t_evt = min(self._next_arrival_s(), self._next_timer if self._next_timer is not None else math.inf)
        g = min(self.groups.values(), key=lambda x: (x.free_s, x.gid), default=None)
        if g is not None and g.free_s < t_evt:
            self.clock.advance(g.free_s)
            if g.inflight is not None:
                self._complete(g)
            else:
                self._launch(g)
        elif t_evt < math.inf:
            self.clock.advance(t_evt)
        else:
            self._stalled()

    # ---- the policy -------------------------------------------------------------------------
    def _view(self, g: _RealGroup) -> GroupView:
        return GroupView(g.gid, g.model, g.n_gpus, g.placement, g.plan, tuple(self.jobs[i] for i in g.members),
                         tuple(float(g.remaining[i]) for i in g.members), g.step_time_s, g.paused_until_s,
                         g.version, g.nano_batches, g.micro_batches, g.started_s)

    def _decide(self) -> None:
        self._need = False
        admitted_at, self._admitted_at_s = self._admitted_at_s, None
        if not self.queue and not (self.policy.timer_s and self.groups) and not self._shrunk:
            self._record()
            return
        self._shrunk = False
        t = self.now()
        # The policy's clock for a decision on arrivals is their submit instant (the engine decides
        # there): the wall clock is a few ms later, and any order by waited time then sees another
        # queue than the replay's (tLoRA's urgency takes the runtime as its second key, so its
        # order of simultaneous arrivals is the same either way since a5e3f42; other orders may not be).
        t_policy = t if admitted_at is None else admitted_at
        kinds: dict = {}
        for g in self.groups.values():
            kinds.setdefault((g.model, g.n_gpus), {})[g.gid] = None
        snap = Snapshot(t_policy, tuple(self.queue.values()), {gid: self._view(g) for gid, g in self.groups.items()},
                        self.free.copy(), self.cluster, self.cost_model, kinds, frozenset(self._dirty))
        self._dirty.clear()
        w0 = time.perf_counter()
        actions = self.policy.decide(snap)
        self._decision_time += time.perf_counter() - w0
        self._decisions += 1
        self.checker.decision(t, actions)
        try:  # the engine's rules (action_rules): a broken one is an InvariantViolation
            for a in actions:
                if isinstance(a, StartGroup):
                    self._start(a)
                elif isinstance(a, AddMembers):
                    self._add(a)
                elif isinstance(a, RemoveMembers):
                    self._remove(a)
                elif isinstance(a, StopMembers):
                    self._stop(a)
                elif isinstance(a, SetExecution):
                    g = rules.running_group(self.groups, a.group_id, "SetExecution")
                    rules.check_counts(a)
                    g.nano_batches, g.micro_batches = a.nano_batches, a.micro_batches
                    self._retime(g)
                else:
                    raise rules.unknown_action(a)
        except rules.ActionRejected as e:
            rejected = str(e)
        else:
            rejected = None
        if rejected is not None:
            self._fail(rejected)
        self._record()
        if self.policy.timer_s and self.groups and self._next_timer is None:
            self._next_timer = t + self.policy.timer_s

    # ---- actions (the engine's rules: sim/core/action_rules.py) --------------------------------------------------------
    def _fail(self, message: str) -> None:
        self.checker.fail("action", message)  # raises InvariantViolation with the recent history

    def _start(self, a: StartGroup) -> None:
        t = self.now()
        idx = rules.take_queued(self.queue, a.job_indices, "StartGroup")
        model = rules.one_model(self.jobs, idx)
        try:
            self.free.apply(a.placement, -1)
            devices = self.slots.take(a.placement)
        except rules.BOOKING_ERRORS as e:
            raise rules.double_booked(idx, a.placement, e) from None
        n = sum(k for _, k in a.placement)
        g = _RealGroup(self._next_gid, model, n, tuple(a.placement), devices, a.plan, [], {}, t,
                       a.nano_batches, a.micro_batches, free_s=t)
        self._next_gid += 1
        self._groups_started += 1
        self.groups[g.gid] = g
        self.checker.start(g.gid, g.model, n, g.placement, g.plan, idx, self.free.free)
        for i in idx:
            g.remaining[i] = self.remaining_queued.pop(i, self.jobs[i].total_steps)
            if self.records[i].start_s is None:
                self.records[i].start_s = t
        g.pending = "start"
        self._change(g, idx, "start")

    def _add(self, a: AddMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "AddMembers")
        idx = rules.take_queued(self.queue, a.job_indices, "AddMembers")
        rules.same_model(self.jobs, idx, g.model)
        self._settle_and_finish(g)
        self.checker.join(g.gid, idx)
        t = self.now()
        for i in idx:
            g.remaining[i] = self.remaining_queued.pop(i, self.jobs[i].total_steps)
            if self.records[i].start_s is None:
                self.records[i].start_s = t
        members = g.members + idx
        for i in members:
            self.records[i].group_changes += 1
        self._change(g, members, "regroup")

    def _remove(self, a: RemoveMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "RemoveMembers")
        rules.check_members(g.gid, g.remaining, a.job_indices, "RemoveMembers")
        done = self._settle_and_finish(g)
        leave = [i for i in a.job_indices if i not in done]  # a member whose last step was in flight finished
        if leave:
            self.checker.leave(g.gid, leave)
        for i in leave:
            self.remaining_queued[i] = g.remaining.pop(i)
            self.queue[i] = self.jobs[i]
            self.records[i].group_changes += 1
        self.queue = dict(sorted(self.queue.items()))
        self._change(g, [i for i in g.members if i not in leave], "regroup")
        self._need = True  # the preempted jobs are queued again: ask at once, as the engine does

    def _stop(self, a: StopMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "StopMembers")
        rules.check_members(g.gid, g.remaining, a.job_indices, "StopMembers")
        done = self._settle_and_finish(g)
        stop = [i for i in a.job_indices if i not in done]
        for i in stop:
            self.records[i].early_exit = True
        self._finish_members(g, stop, max(self.now(), g.free_s), early=True)  # at the step boundary
        self._change(g, list(g.members), "regroup")
        self._need = True

    # ---- steps and rebuilds ------------------------------------------------------------------
    def _settle(self, g: _RealGroup) -> list[int]:
        """Credit the step in flight (if any) to every member; the members it finished."""
        if self.pool is not None:
            self._await_step(g)
        if g.inflight is None:
            return []
        g.inflight = None
        for i in g.members:
            g.remaining[i] -= 1
            self.records[i].steps_trained += 1
        self.checker.progress(g.members, 1.0)
        return [i for i in g.members if g.remaining[i] <= 0]

    def _settle_and_finish(self, g: _RealGroup) -> list[int]:
        """Before a membership change: the step in flight completes; the members it finished
        finish at its end (the caller rebuilds the group)."""
        if self.pool is not None:
            self._await_step(g)
        end = g.inflight[1] if g.inflight is not None else self.now()
        done = self._settle(g)
        self._finish_members(g, done, end)
        return done

    def _finish_members(self, g: _RealGroup, done: list[int], t: float, early: bool = False) -> None:
        for i in done:
            self.checker.finish(g.gid, i, early=early)
            self.records[i].finish_s = t
            g.members.remove(i)
            del g.remaining[i]
            self._finished += 1
            if self.progress is not None:
                self.progress(self._finished)

    def _launch(self, g: _RealGroup) -> None:
        """Run one real step of ``g`` (it starts when its devices are free)."""
        t0 = self.now() if not self.clock.virtual else max(self.now(), g.free_s)
        ms = g.trainer.step(g.nano_batches, g.micro_batches)
        t1 = t0 + ms / 1e3 if self.clock.virtual else self.now()
        g.inflight = (t0, t1)
        g.free_s = t1
        self._log(g, "step", t0, t1, ms)

    def _complete(self, g: _RealGroup) -> None:
        """Credit ``g``'s step in flight; finished members leave (the survivors are rebuilt)."""
        end = g.inflight[1]
        done = self._settle(g)
        if not done:
            return
        self._finish_members(g, done, end)
        self._need = True
        if g.members:
            self._shrunk = True  # the policy may re-plan the group (LoRAFusion re-packs)
        self._change(g, list(g.members), "regroup")

    # ---- membership changes and rebuilds -----------------------------------------------------
    def _change(self, g: _RealGroup, members: list[int], event: str) -> None:
        """``g`` now has ``members``: re-timed at once (the policy's next look sees it), rebuilt by
        the next ``_flush``, so that every change at one instant (a member finishing, then the
        decision it triggers) costs one rebuild, as one pause in the engine. With no member left
        the group closes now, after saving any member preempted to the queue."""
        g.members = list(members)
        if not members:
            self._close(g)
            return
        if g.pending != "start":
            g.pending = event
        for i in members:
            r = self.records[i]
            r.max_group_size = max(r.max_group_size, len(members))
        self._retime(g)

    def _save(self, g: _RealGroup) -> tuple:
        """Save ``g``'s trainer members' adapters and AdamW moments to the host (if anyone's state
        is still needed: a member going on, or preempted to the queue) and drop the trainer.
        Starts when ``g``'s devices are free; sets ``g.save_span`` (start s, seconds), ``g.free_s``
        and the saved jobs' ``state_ready``. Returns the jobs saved."""
        if self.pool is not None:
            return self._pool_save(g)
        if g.trainer is None:
            return ()
        saved = g.trainer_jobs if any(j in g.remaining or j in self.remaining_queued for j in g.trainer_jobs) else ()
        w0 = time.perf_counter()
        cost_ms = g.trainer.save() if saved else 0.0
        g.trainer, g.trainer_jobs = None, ()
        self.trainer.release()
        if self.clock.virtual:  # what the trainer says the save cost, not the host's time
            dt = _reported_s(cost_ms, "save()", g.gid)
            t0 = max(self.now(), g.free_s)
            g.free_s = t0 + dt
        else:
            dt = time.perf_counter() - w0
            t0 = self.now() - dt
            g.free_s = self.now()
        for j in saved:
            self.state_ready[j] = g.free_s
        g.save_span = (t0, dt)
        return saved

    def _flush(self) -> None:
        """Rebuild every changed group: first save all (a job moved between groups is restored
        from its saved state), then build each from its members' states; timed per group."""
        pend = [g for g in self.groups.values() if g.pending]
        for g in pend:
            g.save_span = None
            self._save(g)
        for g in pend:
            if self.pool is not None:
                self._pool_build(g)
                continue
            w0 = time.perf_counter()
            share = g.n_gpus  # one data-parallel replica's share of each member's sequences
            js = [self.jobs[i] for i in g.members]
            g.trainer = self.trainer.group(g.model, g.plan,
                                           [(j.index, j.rank, -(-j.batch_size // share), j.seq_len) for j in js])
            g.trainer_jobs = tuple(g.members)
            if self.clock.virtual:  # what the trainer says the build cost, not the host's time
                dt = _reported_s(g.trainer.build_ms, "build_ms", g.gid)
                t1 = max([self.now(), g.free_s, self.slots.ready_s(g.devices)]
                         + [self.state_ready.get(i, 0.0) for i in g.members])
                end = t1 + dt
            else:
                dt = time.perf_counter() - w0
                t1, end = self.now() - dt, self.now()
            saved_t0, saved_dt = g.save_span if g.save_span is not None else (t1, 0.0)
            g.free_s = g.paused_until_s = end
            self._log(g, g.pending, min(saved_t0, t1), end, (saved_dt + dt) * 1e3)
            g.pending = None

    def _close(self, g: _RealGroup) -> None:
        saved = self._save(g)  # members preempted to the queue keep their state
        if saved:
            self._log(g, "close", g.save_span[0], g.free_s, g.save_span[1] * 1e3, jobs=saved)
        self.free.apply(g.placement, +1)
        end = max(self.now(), g.free_s)
        self.slots.give_back(g.devices, end)
        self._gpu_seconds += g.n_gpus * (end - g.started_s)
        self._dirty.add(g.gid)
        del self.groups[g.gid]
        self.checker.close(g.gid, self.free.free)
        self._record()

    def _retime(self, g: _RealGroup) -> None:
        members = tuple(self.jobs[i].member for i in g.members)
        g.step_time_s = self.cost_model.step_time_s(g.model, self.gpu, members, g.n_gpus, g.plan, g.nano_batches,
                                                    g.micro_batches)
        self.checker.retime(g.gid, g.model, g.n_gpus, g.plan, members, g.members, g.step_time_s, g.micro_batches)
        g.version += 1
        self._dirty.add(g.gid)

    def _log(self, g: _RealGroup, event: str, t0: float, t1: float, ms: float, jobs: Sequence[int] | None = None):
        self.log.append({"group_id": g.gid, "event": event,
                         "jobs": ";".join(map(str, g.members if jobs is None else jobs)), "plan": g.plan,
                         "nano_batches": g.nano_batches, "micro_batches": g.micro_batches, "n_gpus": g.n_gpus,
                         "devices": ";".join(map(str, g.devices)),
                         "start_s": t0, "end_s": t1, "ms": ms})

    def _record(self) -> None:
        now = self.now()
        running = sum(len(g.members) for g in self.groups.values())
        alloc = sum(g.n_gpus for g in self.groups.values())
        tok = sum(sum(self.jobs[i].tokens_per_step for i in g.members) / g.step_time_s
                  for g in self.groups.values() if g.step_time_s > 0)
        row = (now, running, len(self.queue), len(self.groups), alloc, tok, 0.0)
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = row
        elif not self.timeline or self.timeline[-1][1:] != row[1:]:
            self.timeline.append(row)
