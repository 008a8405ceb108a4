"""The SimPy discrete-event engine with rate-based progress.

No event per training step: each group holds its members' remaining steps and a step time from
the cost model; an event fires only on arrival, group completion, regroup or pause end
(docs/model.md, "Progress is rate-based"). SimPy timeouts cannot be cancelled, so every group timer
carries the group's version and stale timers are ignored. Decisions are coalesced: all events at
one instant are processed before the policy is asked once (a zero-delay event).

Regroup cost: adding members to a running group pauses the whole group for ``regroup_pause_s``
(checkpoint/restore of adapter state); a member leaving on completion costs nothing.

Policy timer: a policy whose ``timer_s`` (the Policy protocol, float s or None) is set is also asked to decide every
``timer_s`` seconds while any group runs, even with an empty queue (tLoRA's nano-batch tuning, ALTO's early-exit checks).

Invariants (``tlora_sim.sim.core.invariants``) are checked at every state change unless ``check_invariants=False``;
policy actions the engine cannot apply are always rejected (the rules of ``action_rules.py``, shared with the
real-time executor), and a ``decide()`` that raises or returns no actions is a
:class:`PolicyError` (``policy_call.py``). All raise :class:`InvariantError` (a checker's violation carries history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Mapping, Sequence

import simpy
from simpy.events import NORMAL

from tlora_sim.sim.core import action_rules as rules
from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.core.decision_stats import DecisionStats
from tlora_sim.sim.costmodel.interface import CostModel
from tlora_sim.sim.core.gc_scope import frozen_before, no_collections
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.invariants import InvariantChecker, InvariantError
from tlora_sim.sim.core.listeners import EngineListener, Listeners
from tlora_sim.sim.core.policy_call import decide_checked
from tlora_sim.sim.core.placement import FreeGpus, Placement
from tlora_sim.sim.core.results import JobRecord, SimResult, reference_plan_of, reference_steps
from tlora_sim.sim.core.snapshot import AddMembers, GroupView, QueueKeys, QueueView, RemoveMembers, SetExecution, Snapshot, StartGroup, StopMembers
from tlora_sim.sim.core.snapshot import GroupViews, engine_snapshot

# A member whose remaining steps fall below this is finished (float round-off of rate x time).
_STEP_EPS = 1e-6
_MEMBER, _TOKENS = attrgetter("member"), attrgetter("tokens_per_step")
__all__ = ["Engine", "InvariantError", "JobRecord", "PauseOptions", "SimResult"]


class _Wake:
    """A SimPy event running ``callback(event)``: ``env.timeout(delay).callbacks.append(callback)`` (same time
    and order) without a Timeout's cost, by ``Environment.schedule``. ``gid``/``version``: a group timer's group."""

    __slots__ = ("callbacks", "gid", "version")
    _ok = True  # SimPy's ``step`` reads it: the event succeeded

    def __init__(self, callback, gid: int = -1, version: int = 0) -> None:
        self.callbacks, self.gid, self.version = [callback], gid, version


@dataclass(slots=True)
class _Group:
    gid: int
    model: str
    n_gpus: int
    placement: Placement
    plan: str
    members: list[int]
    remaining: dict[int, float]
    started_s: float
    step_time_s: float = 0.0
    paused_until_s: float = 0.0
    pause_set_s: float = 0.0  # the instant the group's current pause was set
    last_update_s: float = 0.0
    version: int = 0
    tok_rate: float = 0.0
    flop_rate: float = 0.0
    nano_batches: int = 1
    micro_batches: int = 1
    # per membership (``Engine._membership``; None after members change): member Jobs, their
    # cost-model Members, Σ tokens per step, Σ model FLOPs per step
    membership: tuple | None = None


@dataclass(frozen=True)
class PauseOptions:
    """How an executed run pays for its rebuilds, for ``validate-run`` (``sim/executor/validate.py``)
    to replay it in the engine; the defaults are a plain replay's (a replay never sets them).

    Attributes:
        start_pause_s: pause of a new group before its first step (s; default 0: building a group
            is free). ``validate-run`` sets it to what an executed run measured.
        pause_on_finish: a member finishing also pauses the group's survivors for
            ``regroup_pause_s`` (default False; the real-time executor rebuilds the super-model).
        serial_pauses: a change to a group still paused by a change at an *earlier* instant
            pauses it again after that pause (``paused_until += pause``) instead of extending
            it to ``now + pause`` (default False). Changes at one instant always cost one
            pause. The real-time executor decides between steps, so a change during a rebuild
            waits for it and pays a rebuild of its own (``docs/executor.md``).
        pause_by_size: members after a change -> that change's pause (s); other sizes pause
            ``regroup_pause_s`` (default: none; ``validate-run`` passes what a run measured).
            Kept as a new ``{int: float}`` dict.
    """

    start_pause_s: float = 0.0
    pause_on_finish: bool = False
    serial_pauses: bool = False
    pause_by_size: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_pause_s", float(self.start_pause_s))
        object.__setattr__(self, "pause_by_size", {int(k): float(v) for k, v in (self.pause_by_size or {}).items()})


class Engine:
    """Replay ``jobs`` on ``cluster`` under ``policy``.

    Args:
        jobs: jobs in submit order (``Job.index`` = position).
        cluster: the cluster.
        cost_model: step time / memory predictor.
        policy: object with ``decide(Snapshot) -> list[Action]``.
        regroup_pause_s: pause of a group when members join or are preempted (s).
        pauses: how an executed run pays its rebuilds (:class:`PauseOptions`: ``validate-run``'s;
            default: a replay's).
        progress: optional callback ``progress(now_s)`` called after each decision.
        check_invariants: check ``tlora_sim.sim.core.invariants`` at every state change (default True; switch off
            for benchmarks). The checker is a listener, called after ``listeners``.
        listeners: ``EngineListener`` objects told of every state change (``sim/core/listeners.py``),
            e.g. an ``EventCounter``.
        retime_at: instants (s, finite, >= 0, ascending) at which every running group is settled and
            re-timed from the cost model, as after a step-time change (``SetExecution``), without a
            decision or a pause: for a cost model whose step times change with time
            (``validate-run --host-speed``, ``sim/executor/host_speed.py``). Equal instants count once;
            none after the last job finished. Default: none (a plain replay, unchanged).

    Attributes:
        member_flops: model FLOPs of one step of each job alone (``CostModel.step_flops``), by job index.

    Raises:
        ValueError: jobs out of index order, or a negative or non-finite ``regroup_pause_s`` or pause of
            ``pauses``, or ``retime_at`` not finite, negative or out of order.
        InvariantError: a policy action the engine cannot apply (double-booked GPUs, mixed base
            models, a job not queued, a group not running), or jobs left unfinished when events
            run out; with ``check_invariants``, any violation of ``tlora_sim.sim.core.invariants``
            (:class:`InvariantViolation`, with the recent event history).
    """

    def __init__(self, jobs: Sequence[Job], cluster: ClusterSpec, cost_model: CostModel, policy,
                 *, regroup_pause_s: float = 30.0, progress: Callable[[float], None] | None = None,
                 check_invariants: bool = True, listeners: Sequence[EngineListener] = (),
                 pauses: PauseOptions = PauseOptions(), retime_at: Sequence[float] = ()) -> None:
        self.jobs = list(jobs)
        for i, j in enumerate(self.jobs):
            if j.index != i:
                raise ValueError(f"job {j.job_id}: index {j.index} != position {i}")
        self.cluster = cluster
        self.gpu = cluster.gpu.name
        self.cost_model = cost_model
        self.policy = policy
        self.regroup_pause_s = float(regroup_pause_s)
        self.pauses = pauses
        self.start_pause_s = pauses.start_pause_s  # read where groups change: kept as attributes
        self.pause_on_finish = bool(pauses.pause_on_finish)
        self.serial_pauses = bool(pauses.serial_pauses)
        self.pause_by_size = pauses.pause_by_size
        self.serial_pause_count = 0  # changes whose pause was queued after another (``serial_pauses``)
        if not (0.0 <= self.regroup_pause_s < float("inf") and 0.0 <= self.start_pause_s < float("inf")
                and all(0.0 <= v < float("inf") for v in self.pause_by_size.values())):
            raise ValueError(f"regroup_pause_s and start_pause_s must be finite and >= 0, got {regroup_pause_s!r}, "
                             f"{pauses.start_pause_s!r}")
        given = [float(t) for t in retime_at]
        if any(not 0.0 <= t < float("inf") for t in given) or given != sorted(given):
            raise ValueError(f"retime_at must be finite, >= 0 and ascending, got {retime_at!r}")
        self.retime_at = tuple(sorted(set(given)))
        self._next_retime = 0  # index of the next instant of retime_at
        self.progress = progress
        self.env = simpy.Environment()
        self.free = FreeGpus([cluster.gpus_per_node] * cluster.nodes, cluster.gpus_per_node, cluster.nodes_per_rack)
        self.queue: dict[int, Job] = {}  # insertion (arrival) order
        self._queue_keys = QueueKeys()  # its keys as an array, told of every change below
        self.remaining_queued: dict[int, float] = {}  # progress kept by preempted jobs
        self.groups: dict[int, _Group] = {}
        with no_collections():  # a million records in a row
            self.records = [JobRecord() for _ in self.jobs]
        self.timeline: list[tuple] = []
        self._next_gid = 0
        self._pending = False
        self._tok_rate = 0.0
        self._flop_rate = 0.0
        self._gpus_alloc = 0
        self._gpu_seconds = 0.0
        self._events = 0
        self._decisions = 0
        self._decision_time = 0.0
        self.decision_stats = DecisionStats()  # decision cost by queue length (perf.json)
        self._groups_started = 0
        self._finished = 0
        self._running = 0  # members of running groups
        self._dirty: set[int] = set()  # groups started, retimed or closed since the last decision
        self._shrunk = False  # a running group lost a member to a finish since the last decision
        self._kinds: dict[tuple[str, int], dict[int, None]] = {}  # (model, n_gpus) -> running group ids
        flops: dict = {}  # (model, Member) -> FLOPs per step: a few distinct ones (the cost model is pure)
        self.member_flops = [flops[k] if k in flops else flops.setdefault(k, cost_model.step_flops(*k))
                              for k in ((j.model, (j.member,)) for j in self.jobs)]
        self._schedule = self.env.schedule
        self._next_job, self._last_state = 0, None  # first job not yet arrived; last timeline row without its time
        c = type(self)  # functions, not bound methods: no reference cycle keeping a finished engine alive
        self._apply = {StartGroup: c._start_group, AddMembers: c._add_members, RemoveMembers: c._remove_members,
                       StopMembers: c._stop_members, SetExecution: c._set_execution}
        self._timer_s = policy.timer_s
        self._timer_pending = False
        watchers = list(listeners) + ([InvariantChecker(self.jobs, cluster, cost_model)] if check_invariants else [])
        self._obs = Listeners(watchers) if watchers else None

    def _fail(self, message: str) -> None:
        """Reject an impossible state: InvariantViolation with history when checking, else InvariantError."""
        if self._obs is not None:
            self._obs.fail("action", message)
        raise InvariantError(f"t={self.env.now:.6f}s: {message}")

    # ---- run -------------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Simulate until every job finished; return the raw result."""
        t0 = time.perf_counter()
        self._start_arrivals()
        if self.retime_at:
            self._schedule(_Wake(self._on_retime), NORMAL, self.retime_at[0] - self.env.now)
        with frozen_before():  # the jobs and records outlive the run: no GC scans of them
            self.env.run()
        if self._obs is not None:  # every job finished once, GPUs released, work adds up
            self._obs.final(self.timeline, self.records)
        if self._finished != len(self.jobs):
            left = [j.job_id for j in self.jobs if self.records[j.index].finish_s is None]
            self._fail(f"policy {getattr(self.policy, 'name', '?')} left {len(left)} job(s) unfinished "
                       f"when no events remained (first: {left[:5]}); queue={len(self.queue)}")
        return SimResult(self.jobs, self.records, self.timeline, self._gpu_seconds, self._events, self._decisions,
                         self._decision_time, time.perf_counter() - t0, self._groups_started,
                         self.decision_stats.by_queue,
                         reference_steps(self.jobs, self.cost_model, self.gpu, reference_plan_of(self.policy)))

    def _start_arrivals(self) -> None:
        """Queue the jobs submitted by now, or wake at the first submit time."""
        if self.jobs:
            t = self.jobs[0].submit_time_s - self.env.now
            self._schedule(_Wake(self._arrive), NORMAL, t) if t > 0 else self._arrive()

    def _arrive(self, _ev=None) -> None:
        """Queue the jobs submitted by now, ask for a decision, and wake at the next submit time
        (one event per distinct submit time)."""
        now, jobs, queue = self.env.now, self.jobs, self.queue
        i = first = self._next_job
        n = len(jobs)
        while i < n and jobs[i].submit_time_s <= now:
            queue[i] = jobs[i]
            i += 1
        self._next_job = i
        self._queue_keys.added(range(first, i))
        if self._obs is not None:
            self._obs.arrive(now, range(first, i))
        self._events += 1
        self._request_decision()
        if i < n:
            self._schedule(_Wake(self._arrive), NORMAL, jobs[i].submit_time_s - now)

    def _request_decision(self) -> None:
        if not self._pending:
            self._pending = True
            self._schedule(_Wake(self._decide), NORMAL, 0)

    # ---- policy ----------------------------------------------------------------------------
    def snapshot(self, changed: frozenset[int] | None = None) -> Snapshot:
        """The read-only view handed to the policy (group views built on first access)."""
        return engine_snapshot(self.env.now, QueueView(self.queue, self._queue_keys),
                               GroupViews(self.groups, self._view, self.env.now), self.free.copy(), self.cluster,
                        self.cost_model, self._kinds, changed)

    def _view(self, g: "_Group", now: float) -> GroupView:
        done = self._progress_steps(g, now)
        return GroupView(g.gid, g.model, g.n_gpus, g.placement, g.plan,
                         self._membership(g)[0],
                         tuple(max(g.remaining[i] - done, 0.0) for i in g.members),
                         g.step_time_s, g.paused_until_s, g.version, g.nano_batches,
                         g.micro_batches, g.started_s)

    def _decide(self, _ev=None) -> None:
        self._pending = False
        self._events += 1
        if not self.queue and not (self._timer_s and self.groups) and not self._shrunk:
            self._record()
            return
        self._shrunk = False
        qlen = len(self.queue)
        timed = self.decision_stats.cpu_weight(qlen)  # CPU-time a sample (decision_stats.CPU_ALL)
        c0 = time.thread_time() if timed else 0.0
        t0 = time.perf_counter()
        snap = self.snapshot(frozenset(self._dirty))
        self._dirty.clear()
        actions = decide_checked(self.policy, snap, self.env.now)  # a policy's crash: PolicyError (exit 3)
        snap.groups.freeze()  # the engine changes from here on
        snap.queue.freeze()
        dt = time.perf_counter() - t0
        cpu = time.thread_time() - c0 if timed else None
        self._decision_time += dt
        self._decisions += 1
        if self._obs is not None:
            self._obs.decision(self.env.now, actions)
        placed = 0
        apply = self._apply
        start, add = apply[StartGroup], apply[AddMembers]
        try:  # the rules of action_rules: a broken one is this run's invariant error
            for a in actions:
                f = apply.get(type(a))
                if f is None:  # a subclass of an action, or no action
                    f = next((g for t, g in apply.items() if isinstance(a, t)), None)
                    if f is None:
                        raise rules.unknown_action(a)
                if f is start or f is add:
                    placed += len(a.job_indices)
                f(self, a)
        except rules.ActionRejected as e:
            rejected = str(e)
        else:
            rejected = None
        if rejected is not None:
            self._fail(rejected)
        self.decision_stats.decided(self.env.now, qlen, dt, cpu, placed)
        if self._obs is not None:
            self._obs.decided(self.env.now, qlen, dt, cpu, placed)
        self._record()
        if self.progress is not None:
            self.progress(self.env.now)
        if self._timer_s and self.groups and not self._timer_pending:
            self._timer_pending = True
            self._schedule(_Wake(self._on_policy_timer), NORMAL, self._timer_s)

    def _on_policy_timer(self, _ev) -> None:
        self._timer_pending = False
        if self.groups or self.queue:
            self._request_decision()

    # ---- actions ---------------------------------------------------------------------------
    def _start_group(self, a: StartGroup) -> None:
        now = self.env.now
        idx = rules.take_queued(self.queue, a.job_indices, "StartGroup")
        self._queue_keys.removed(idx)
        jobs = self.jobs
        model = rules.one_model(jobs, idx)
        n = sum(k for _, k in a.placement)
        try:
            self.free.apply(a.placement, -1)
        except rules.BOOKING_ERRORS as e:
            raise rules.double_booked(idx, a.placement, e) from None
        kept = self.remaining_queued
        g = _Group(self._next_gid, model, n, tuple(a.placement), a.plan, idx,
                   {i: kept.pop(i, float(jobs[i].total_steps)) if kept else float(jobs[i].total_steps) for i in idx},
                   started_s=now, last_update_s=now, paused_until_s=now + self.start_pause_s, pause_set_s=now,
                   nano_batches=a.nano_batches, micro_batches=a.micro_batches)
        self._next_gid += 1
        self._groups_started += 1
        self.groups[g.gid] = g
        self._gpus_alloc += n
        self._kinds.setdefault((g.model, g.n_gpus), {})[g.gid] = None
        self._running += len(idx)
        if self._obs is not None:
            self._obs.start(g.gid, g.model, n, g.placement, g.plan, idx, self.free.free)
        records = self.records
        for i in idx:
            r = records[i]
            if r.start_s is None:
                r.start_s = now
        self._retime(g)

    def _add_members(self, a: AddMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "AddMembers")
        idx = rules.take_queued(self.queue, a.job_indices, "AddMembers")
        self._queue_keys.removed(idx)
        rules.same_model(self.jobs, idx, g.model)
        self._settle(g)
        now = self.env.now
        if self._obs is not None:
            self._obs.join(g.gid, idx)
        self._running += len(idx)
        g.membership = None
        for i in idx:
            g.members.append(i)
            g.remaining[i] = self.remaining_queued.pop(i, float(self.jobs[i].total_steps))
            if self.records[i].start_s is None:
                self.records[i].start_s = now
        self._pause(g)
        for i in g.members:
            self.records[i].group_changes += 1
        self._retime(g)

    def _remove_members(self, a: RemoveMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "RemoveMembers")
        rules.check_members(g.gid, g.remaining, a.job_indices, "RemoveMembers")
        self._settle(g)
        if self._obs is not None:
            self._obs.leave(g.gid, a.job_indices)
        self._running -= len(a.job_indices)
        g.membership = None
        for i in a.job_indices:
            g.members.remove(i)
            self.remaining_queued[i] = g.remaining.pop(i)
            self.queue[i] = self.jobs[i]
            self.records[i].group_changes += 1
        self.queue = dict(sorted(self.queue.items()))
        self._queue_keys.reset()
        if g.members:
            self._pause(g)
            self._retime(g)
        else:
            self._close(g)
        # The preempted jobs are queued again but are not in the snapshot the policy just decided
        # on: ask again at this instant (with no other event pending they would wait forever).
        self._request_decision()

    def _stop_members(self, a: StopMembers) -> None:
        g = rules.running_group(self.groups, a.group_id, "StopMembers")
        rules.check_members(g.gid, g.remaining, a.job_indices, "StopMembers")
        self._settle(g)
        for i in a.job_indices:
            self.records[i].early_exit = True
        self._finish(g, list(a.job_indices))
        # GPUs or group capacity may have been freed: let the queue use them now.
        self._request_decision()

    def _set_execution(self, a: SetExecution) -> None:
        g = rules.running_group(self.groups, a.group_id, "SetExecution")
        rules.check_counts(a)
        self._settle(g)
        g.nano_batches, g.micro_batches = a.nano_batches, a.micro_batches
        self._retime(g)

    def _finish(self, g: _Group, done: list[int]) -> None:
        """Members ``done`` leave ``g`` finished now; the group closes when it empties."""
        now = self.env.now
        g.membership = None
        for i in done:
            if self._obs is not None:
                self._obs.finish(g.gid, i, early=self.records[i].early_exit)
            g.members.remove(i)
            self._running -= 1
            rec = self.records[i]
            if rec.finish_s is not None:
                self._fail(f"job {self.jobs[i].job_id} finished twice")
            rec.steps_trained = self.jobs[i].total_steps - max(g.remaining.pop(i), 0.0)
            rec.finish_s = now
            self._finished += 1
        if g.members:
            self._shrunk = True  # the policy may re-plan the group's execution (LoRAFusion re-packs)
            if self.pause_on_finish:  # the survivors' super-model is rebuilt (an executed run does)
                self._pause(g)
            self._retime(g)
        else:
            self._close(g)

    def _pause(self, g: _Group) -> None:
        """Pause ``g`` for a change of its members made now (``regroup_pause_s``, or
        ``pause_by_size`` of its new size; queued after a pause set earlier with ``serial_pauses``)."""
        now = self.env.now
        pause = self.pause_by_size.get(len(g.members), self.regroup_pause_s) if self.pause_by_size \
            else self.regroup_pause_s
        if self.serial_pauses and g.paused_until_s > now and g.pause_set_s < now:
            g.paused_until_s += pause
            self.serial_pause_count += 1
        elif now + pause > g.paused_until_s:
            g.paused_until_s = now + pause
        else:
            return
        g.pause_set_s = now

    # ---- progress --------------------------------------------------------------------------
    @staticmethod
    def _progress_steps(g: _Group, now: float) -> float:
        active_from = max(g.last_update_s, g.paused_until_s)
        return max(now - active_from, 0.0) / g.step_time_s if g.step_time_s > 0 else 0.0

    def _settle(self, g: _Group) -> None:
        """Bring the members' remaining steps up to now."""
        now = self.env.now
        if now < g.last_update_s:
            self._fail(f"time ran backwards in group {g.gid}: {now} < {g.last_update_s}")
        done = self._progress_steps(g, now)
        if done:
            for i in g.members:
                g.remaining[i] -= done
            if self._obs is not None:
                self._obs.progress(g.members, done)
        g.last_update_s = now

    def _retime(self, g: _Group) -> None:
        """Recompute step time, memory check, rates, and reschedule the group's next completion."""
        now = self.env.now
        _, members, _, _, first_i = g.membership or self._membership(g)
        g.step_time_s = step = self.cost_model.step_time_s(g.model, self.gpu, members, g.n_gpus, g.plan,
                                                           g.nano_batches, g.micro_batches)
        if self._obs is not None:  # memory fits, step time finite and > 0
            self._obs.retime(g.gid, g.model, g.n_gpus, g.plan, members, g.members, step, g.micro_batches)
        self._set_rates(g, active=now >= g.paused_until_s)
        g.version += 1
        self._dirty.add(g.gid)
        first = g.remaining[first_i]
        finish = max(now, g.paused_until_s) + max(first, 0.0) * step
        if finish < now:
            raise ValueError(f"Negative delay {finish - now}")
        self._schedule(_Wake(self._on_timer, g.gid, g.version), NORMAL, finish - now)
        if g.paused_until_s > now:
            self._schedule(_Wake(self._on_resume, g.gid, g.version), NORMAL, g.paused_until_s - now)

    def _set_rates(self, g: _Group, active: bool) -> None:
        self._tok_rate -= g.tok_rate
        self._flop_rate -= g.flop_rate
        if active:
            _, _, tokens, flops, _ = g.membership or self._membership(g)
            g.tok_rate = tokens / g.step_time_s
            g.flop_rate = flops / g.step_time_s
        else:
            g.tok_rate = g.flop_rate = 0.0
        self._tok_rate += g.tok_rate
        self._flop_rate += g.flop_rate

    def _membership(self, g: _Group) -> tuple:
        """(member Jobs, their cost-model Members, Σ tokens per step, Σ model FLOPs per step, index
        of the first member to finish) of ``g``'s current members in member order, kept until its
        members change (a nano- or micro-batch change re-times the group without re-reading them).
        Every member trains the same steps (``_settle`` subtracts one amount from all), and
        rounding is monotone (a <= b gives fl(a - d) <= fl(b - d)), so the member with the fewest
        remaining steps when the membership forms keeps the fewest (ties: equal values) until it
        changes. Members changed, so each member's record of the largest group it ran in is
        brought up to date here."""
        if g.membership is None:
            members, records = g.members, self.records
            size = len(members)
            for i in members:
                r = records[i]
                if r.max_group_size < size:
                    r.max_group_size = size
            if size == 1:
                i = members[0]
                j = self.jobs[i]
                g.membership = ((j,), (j.member,), j.tokens_per_step, 0 + self.member_flops[i], i)
            else:
                jobs = tuple(map(self.jobs.__getitem__, members))
                g.membership = (jobs, tuple(map(_MEMBER, jobs)), sum(map(_TOKENS, jobs)),
                                sum(map(self.member_flops.__getitem__, members)),
                                min(members, key=g.remaining.__getitem__))
        return g.membership

    def _on_resume(self, ev: _Wake) -> None:
        g = self.groups.get(ev.gid)
        if g is None or g.version != ev.version:
            return
        self._events += 1
        if self._obs is not None:
            self._obs.at(self.env.now, "resume", ev.gid)
        self._set_rates(g, active=True)
        self._record()

    def _on_retime(self, _ev) -> None:
        """An instant of ``retime_at``: settle and re-time every running group (group id order),
        then wake at the next instant unless every job finished."""
        now = self.env.now
        if self._obs is not None:
            self._obs.at(now, "retime")
        for gid in sorted(self.groups):
            g = self.groups[gid]
            self._settle(g)
            self._retime(g)
        if self.groups:
            self._record()
        k, times = self._next_retime + 1, self.retime_at
        while k < len(times) and times[k] <= now:
            k += 1
        self._next_retime = k
        if k < len(times) and self._finished < len(self.jobs):
            self._schedule(_Wake(self._on_retime), NORMAL, times[k] - now)

    def _on_timer(self, ev: _Wake) -> None:
        g = self.groups.get(ev.gid)
        if g is None or g.version != ev.version:
            return  # stale: the group changed since this timer was set
        self._events += 1
        if self._obs is not None:
            self._obs.at(self.env.now, "timer", ev.gid)
        self._settle(g)
        done = [i for i in g.members if g.remaining[i] <= _STEP_EPS + 1e-9 * self.jobs[i].total_steps]
        if not done:
            self._fail(f"group {g.gid} timer fired but no member finished "
                       f"(min remaining {min(g.remaining.values()):.3g} steps)")
        self._finish(g, done)
        self._request_decision()
        self._record()

    def _close(self, g: _Group) -> None:
        self._set_rates(g, active=False)
        self.free.apply(g.placement, +1)
        self._gpus_alloc -= g.n_gpus
        self._gpu_seconds += g.n_gpus * (self.env.now - g.started_s)
        g.version += 1
        self._dirty.add(g.gid)
        del self.groups[g.gid]
        kind = self._kinds[(g.model, g.n_gpus)]
        del kind[g.gid]
        if not kind:
            del self._kinds[(g.model, g.n_gpus)]
        if not self.groups:  # no float drift of the running sums into an idle cluster
            self._tok_rate = self._flop_rate = 0.0
        if self._obs is not None:
            self._obs.close(g.gid, self.free.free)

    def _record(self) -> None:
        now, tok, flop, tl = self.env.now, self._tok_rate, self._flop_rate, self.timeline
        state = (self._running, len(self.queue), len(self.groups), self._gpus_alloc,
                 tok if not tok < 0.0 else 0.0, flop if not flop < 0.0 else 0.0)  # max(x, 0.0), NaN kept
        if tl and tl[-1][0] == now:
            tl[-1] = (now, *state)
            self._last_state = state
        elif state != self._last_state:
            tl.append((now, *state))
            self._last_state = state

