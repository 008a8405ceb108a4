"""Invariants checked while simulating, with the recent event history kept for the report.

The engine (``tlora_sim.sim.core.engine.Engine``) calls an :class:`InvariantChecker` at each of its state changes
when ``check_invariants=True`` (the default; ``tlora-sim replay/compare --no-invariants`` turns it
off for benchmarks). The checker keeps its *own* books, independent of the engine's, and compares:

* **GPUs**: no GPU allocated twice (a per-node allocation count from the groups' placements, never
  above a node's GPUs and always equal to the engine's free-GPU vector on the nodes touched).
* **memory**: no group over its GPU memory (cost-model peak memory per GPU <= the GPU's memory);
  a group's step time is finite and > 0.
* **jobs**: every admitted job is in exactly one place (queue or one group) and finishes exactly
  once; at the end of the run every job has finished.
* **work**: the steps credited to each job (summed over every group it ran in, preemptions
  included) equal its ``total_steps`` when it finishes; the tokens integrated over the timeline
  equal the tokens of all jobs.
* **time**: simulated time never runs backwards; the run does not spin at one instant
  (a policy that keeps changing groups without time advancing).
* **isolation floor**: a job that only ever ran alone on its requested GPUs with plan ``alone``
  (every job under ``independent``) never reports a JCT below its isolated runtime.

A violation raises :class:`InvariantViolation` (a subclass of :class:`InvariantError`) whose
message ends with the last ``history`` events (default 50, a ``collections.deque`` ring buffer),
oldest first, so the sequence that led to the bad state is in the report.

Cost: a few list and dict operations per event (no cost-model call other than the memory check,
which is cached); measured on ITP cluster02 in ``tests/RELIABILITY.md``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Sequence

from tlora_sim.sim.core.listeners import EngineListener

# Relative and absolute tolerance of the work and time checks (float round-off of rate x time).
REL_TOL = 1e-6
ABS_TOL_STEPS = 1e-3


class InvariantError(RuntimeError):
    """The simulation reached an impossible state (a policy, cost-model or engine bug).

    Attributes:
        violation: the one-line description of what broke.
        history: formatted recent events, oldest first (empty when invariant checking was off).
    """

    def __init__(self, violation: str, history: Sequence[str] = ()) -> None:
        self.violation = violation
        self.history = tuple(history)
        text = violation
        if self.history:
            text += f"\nlast {len(self.history)} event(s), oldest first:\n  " + "\n  ".join(self.history)
        super().__init__(text)

    def __reduce__(self):
        # Rebuild with the same attributes after pickling (a compare worker process raises it).
        return (_rebuild, (type(self), dict(self.__dict__), self.args))


def _rebuild(cls: type, state: dict, args: tuple) -> "InvariantError":
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class InvariantViolation(InvariantError):
    """An invariant of :mod:`tlora_sim.sim.core.invariants` failed; ``check`` names which one.

    Attributes:
        check: one of ``gpus``, ``memory``, ``cost``, ``jobs``, ``work``, ``time``, ``isolation``,
            ``action`` (a policy action the engine cannot apply).
    """

    def __init__(self, check: str, violation: str, history: Sequence[str] = ()) -> None:
        self.check = check
        super().__init__(f"[{check}] {violation}", history)


def _fmt_event(ev: tuple) -> str:
    t, kind, detail = ev
    if isinstance(detail, (list, tuple)) and detail and not isinstance(detail[0], (int, float, str)):
        detail = "; ".join(map(repr, detail))
    return f"t={t:.6f}s {kind}: {detail}"


class InvariantChecker(EngineListener):
    """Independent books on a running :class:`tlora_sim.sim.core.engine.Engine` (see the module docstring).

    Args:
        jobs: the engine's jobs (index order).
        cluster: the cluster (``tlora_sim.sim.core.cluster.ClusterSpec``).
        cost_model: the engine's cost model (for the memory check).
        history: events kept for the report (ring buffer length).
        max_decisions_per_instant: more policy decisions than this at one simulated time is a
            livelock (default: 100 + 4 x jobs).
    """

    def __init__(self, jobs: Sequence[Any], cluster: Any, cost_model: Any, *, history: int = 50,
                 max_decisions_per_instant: int | None = None) -> None:
        n = len(jobs)
        self.jobs = jobs
        self.cluster = cluster
        self.cost_model = cost_model
        self.gpu = cluster.gpu.name
        self.memory_cap = cluster.gpu.memory_bytes
        self.events: deque = deque(maxlen=history)
        self.now = -math.inf
        self.alloc = [0] * cluster.nodes
        self.group_nodes: dict[int, tuple] = {}
        self.where: dict[int, int] = {}  # job index -> group id (running); -1 = queued
        self.trained = [0.0] * n
        self.finished = bytearray(n)
        self.n_finished = 0
        self.solo = bytearray(b"\x01") * n  # ran only alone, on its own GPU count, plan "alone"
        self.limit = max_decisions_per_instant if max_decisions_per_instant is not None else 100 + 4 * n
        self._decisions_at = (-math.inf, 0)

    # ---- reporting ----------------------------------------------------------------------------
    def note(self, kind: str, detail: Any) -> None:
        """Append an event to the ring buffer (formatted only when a violation is reported)."""
        self.events.append((self.now, kind, detail))

    def history(self) -> list[str]:
        """The recent events, oldest first, formatted."""
        return [_fmt_event(e) for e in self.events]

    def fail(self, check: str, message: str) -> None:
        """Raise :class:`InvariantViolation` for ``check`` with the event history."""
        raise InvariantViolation(check, f"t={self.now:.6f}s: {message}", self.history())

    # ---- time ---------------------------------------------------------------------------------
    def at(self, now: float, kind: str, detail: Any = "") -> None:
        """An event at ``now`` (s): check time is finite and never runs backwards, then record it."""
        if not now >= self.now or not math.isfinite(now):
            prev, self.now = self.now, now
            self.fail("time", f"time ran backwards or is not finite: {now!r} after {prev!r} ({kind})")
        self.now = now
        self.events.append((now, kind, detail))

    def decision(self, now: float, actions: Sequence[Any]) -> None:
        """A policy decision at ``now`` returning ``actions``; catches a livelock at one instant."""
        self.at(now, "decide", list(actions) if actions else "no action")
        t, k = self._decisions_at
        k = k + 1 if t == now else 1
        self._decisions_at = (now, k)
        if k > self.limit and actions:
            self.fail("time", f"{k} decisions with actions at one instant: the policy keeps changing groups "
                              f"without time advancing (livelock)")

    # ---- jobs and GPUs ------------------------------------------------------------------------
    def arrive(self, now: float, indices: Sequence[int]) -> None:
        """Jobs ``indices`` entered the queue at ``now`` (s)."""
        self.at(now, "arrive", list(indices))
        for i in indices:
            if i in self.where or self.finished[i]:
                self.fail("jobs", f"job index {i} arrived twice")
            self.where[i] = -1

    def _check_nodes(self, engine_free: Sequence[int], nodes: Sequence[tuple[int, int]]) -> None:
        gpn = self.cluster.gpus_per_node
        for node, _ in nodes:
            if self.alloc[node] + engine_free[node] != gpn:
                self.fail("gpus", f"node {node}: {self.alloc[node]} GPU(s) held by groups but the engine "
                                  f"counts {engine_free[node]} free of {gpn}")

    def start(self, gid: int, model: str, n_gpus: int, placement: Sequence[tuple[int, int]], plan: str,
              members: Sequence[int], engine_free: Sequence[int]) -> None:
        """A group started on ``placement`` ((node, gpus), ...) with ``members`` (job indices)."""
        self.note("start", f"group {gid} {model} plan={plan} gpus={tuple(placement)} jobs={list(members)}")
        gpn, nodes = self.cluster.gpus_per_node, self.cluster.nodes
        if gid in self.group_nodes:
            self.fail("gpus", f"group id {gid} started twice")
        seen = set()
        for node, k in placement:
            if not (0 <= node < nodes) or k <= 0 or node in seen:
                self.fail("gpus", f"group {gid}: invalid placement entry ({node}, {k}) in {tuple(placement)}")
            seen.add(node)
            if self.alloc[node] + k > gpn:
                self.fail("gpus", f"group {gid} takes {k} GPU(s) on node {node}, which already has "
                                  f"{self.alloc[node]} of {gpn} allocated (GPU allocated twice)")
            self.alloc[node] += k
        if sum(k for _, k in placement) != n_gpus:
            self.fail("gpus", f"group {gid}: placement {tuple(placement)} does not hold {n_gpus} GPUs")
        self.group_nodes[gid] = tuple(placement)
        self._check_nodes(engine_free, placement)
        self.join(gid, members, started=True)

    def join(self, gid: int, members: Sequence[int], *, started: bool = False) -> None:
        """Queued jobs joined group ``gid`` (``started``: as its first members)."""
        if not started:
            self.note("add", f"group {gid} jobs={list(members)}")
        for i in members:
            w = self.where.get(i)
            if w != -1:
                state = "finished" if self.finished[i] else ("not arrived" if w is None else f"in group {w}")
                self.fail("jobs", f"job index {i} joins group {gid} but is {state}, not queued")
            self.where[i] = gid

    def leave(self, gid: int, members: Sequence[int]) -> None:
        """Members of ``gid`` went back to the queue (preemption keeps their progress)."""
        self.note("preempt", f"group {gid} jobs={list(members)}")
        for i in members:
            if self.where.get(i) != gid:
                self.fail("jobs", f"job index {i} leaves group {gid} but is not in it")
            self.where[i] = -1

    def close(self, gid: int, engine_free: Sequence[int]) -> None:
        """Group ``gid`` released its GPUs."""
        self.note("close", f"group {gid}")
        placement = self.group_nodes.pop(gid, None)
        if placement is None:
            self.fail("gpus", f"group {gid} closed but was never started (or closed twice)")
        for node, k in placement:
            self.alloc[node] -= k
        self._check_nodes(engine_free, placement)

    # ---- groups -------------------------------------------------------------------------------
    def retime(self, gid: int, model: str, n_gpus: int, plan: str, members: Sequence[Any],
               member_indices: Sequence[int], step_time_s: float, micro_batches: int = 1) -> None:
        """A group's membership or execution changed: memory, step time and the isolation flag."""
        if micro_batches == 1:
            mem = self.cost_model.memory_bytes(model, self.gpu, members, n_gpus, plan)
        else:
            mem = self.cost_model.memory_bytes(model, self.gpu, members, n_gpus, plan, micro_batches)
        if mem > self.memory_cap:
            self.fail("memory", f"group {gid} ({len(members)} x {model} on {n_gpus} GPU(s), plan {plan}) needs "
                                f"{mem / 2**30:.1f} GiB per GPU > {self.memory_cap / 2**30:.0f} GiB")
        if not (step_time_s > 0 and math.isfinite(step_time_s)):
            self.fail("cost", f"group {gid}: cost model step time {step_time_s!r} s is not finite and > 0")
        if plan != "alone" or len(member_indices) > 1:
            for i in member_indices:
                self.solo[i] = 0
        else:
            for i in member_indices:
                if self.jobs[i].num_gpus != n_gpus:
                    self.solo[i] = 0

    def progress(self, member_indices: Sequence[int], steps: float) -> None:
        """Every listed member trained ``steps`` more steps."""
        t = self.trained
        for i in member_indices:
            t[i] += steps

    def finish(self, gid: int, i: int, *, early: bool = False) -> None:
        """Job ``i`` finished in group ``gid`` at the current time (``early``: stopped by the policy
        before its total steps, e.g. ALTO's early exit; then it must not have trained more)."""
        job = self.jobs[i]
        self.note("stop" if early else "finish", f"job {job.job_id} (index {i}) in group {gid}")
        if self.finished[i]:
            self.fail("jobs", f"job {job.job_id} finished twice")
        if self.where.get(i) != gid:
            self.fail("jobs", f"job {job.job_id} finished in group {gid} but was not running in it")
        self.finished[i] = 1
        self.n_finished += 1
        del self.where[i]
        total = job.total_steps
        tol = REL_TOL * total + ABS_TOL_STEPS
        if early:
            if self.trained[i] > total + tol:
                self.fail("work", f"job {job.job_id} stopped early after {self.trained[i]:.6f} trained steps, "
                                  f"more than its total {total}")
            return
        if abs(self.trained[i] - total) > tol:
            self.fail("work", f"job {job.job_id} finished after {self.trained[i]:.6f} trained steps, "
                              f"expected its total {total}")
        if self.solo[i]:
            jct = self.now - job.submit_time_s
            floor = job.isolated_runtime_s
            if jct < floor * (1 - 1e-9) - 1e-6:
                self.fail("isolation", f"job {job.job_id} ran alone on its {job.num_gpus} GPU(s) yet its JCT "
                                       f"{jct:.6f} s is below its isolated runtime {floor:.6f} s")

    # ---- end of run ---------------------------------------------------------------------------
    def final(self, timeline: Sequence[tuple], records: Sequence[Any] = ()) -> None:
        """After the last event: every job finished once, no GPU held, tokens match the timeline.

        Args:
            timeline: the engine's rows ``(time_s, running, queued, groups, gpus, tokens_per_s, flops_per_s)``.
            records: the engine's ``JobRecord`` per job; ``steps_trained`` (when present) must match the
                steps this checker credited.
        """
        self.note("end", f"{self.n_finished}/{len(self.jobs)} finished")
        if self.n_finished != len(self.jobs):
            left = [self.jobs[i].job_id for i in range(len(self.jobs)) if not self.finished[i]][:5]
            self.fail("jobs", f"{len(self.jobs) - self.n_finished} job(s) never finished when no events remained "
                              f"(first: {left}); the policy left them queued")
        if any(self.alloc) or self.group_nodes:
            self.fail("gpus", f"GPUs still held after the last job finished: {self.alloc}")
        for i, r in enumerate(records):
            st = getattr(r, "steps_trained", None)
            if st is not None and abs(st - self.trained[i]) > REL_TOL * self.jobs[i].total_steps + ABS_TOL_STEPS:
                self.fail("work", f"job {self.jobs[i].job_id}: the engine reports {st:.6f} trained steps, "
                                  f"the checker counted {self.trained[i]:.6f}")
        expected = math.fsum(t * j.tokens_per_step for t, j in zip(self.trained, self.jobs))
        done = math.fsum(r0[5] * (r1[0] - r0[0]) for r0, r1 in zip(timeline, timeline[1:]))
        peak = max((r[5] for r in timeline), default=0.0)
        if timeline and timeline[-1][5] > 1e-9 * peak:
            self.fail("work", f"token rate {timeline[-1][5]:.6g}/s after the last event")
        if abs(done - expected) > 1e-5 * expected + 1.0:
            self.fail("work", f"timeline integrates to {done:.6g} trained tokens; the jobs hold {expected:.6g}")
