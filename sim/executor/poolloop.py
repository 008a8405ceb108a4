"""The executor's loop over real worker processes (``RealTimeExecutor`` with a ``WorkerPool``).

Several real devices (``--device cuda --gpus N``, or ``--device cpu --gpus N --processes``), one
worker process each (``sim/executor/workers.py``), on the **wall clock**, driven by the executor's
single coordinator loop: the policy decides in the coordinator exactly as on one device. What
changes is that work runs asynchronously on the workers:

* a group's step is sent to each of its devices' workers and every idle group gets its next step
  at once, so groups on different devices train at the same time; the step is complete when every
  worker of the group has answered (the slowest worker's end: ``steps.csv`` ``start_s`` is the
  earliest worker's start, ``end_s`` the latest worker's end, ``ms`` the slowest worker's
  measured step), and it is credited then;
* a group on k devices trains data-parallel: each worker its share of every member's sequences
  (``workers.shares``: whole sequences), gradients all-reduced over the group's process group,
  one AdamW step per worker on identical copies;
* a rebuild (``start``/``regroup``) first saves: the coordinator waits for the group's workers to
  drop it, the lowest device sending the members' states (host memory, shared with the workers)
  and every worker a checksum of its adapter copy (``replicas`` rows: equal across a group's
  workers, or the run fails); then the build is sent to the new group's workers with its members'
  saved states and runs while the coordinator goes on; the group's next step is queued behind it.
  The ``start``/``regroup`` row spans the save's start to the slowest worker's build end;
* a decision that changes a group while its step is in flight waits for that step first (a step
  completes before its group changes, as on one device); replies of other groups that arrive
  meanwhile are recorded and their next steps sent after the decision.

Every worker reply carries ``time.perf_counter()`` stamps, which are the coordinator's clock too
(one monotonic clock per host).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tlora_sim.sim.executor.workers import shares

REPLICA_COLUMNS = ["group_id", "time_s", "jobs", "devices", "checksums", "identical"]
"""``replicas.csv``: one row per save of a group on worker processes: the jobs it held, its
devices, each device's adapter checksum (``;``-separated, device order) and whether all agree."""


@dataclass
class _Op:
    kind: str
    gid: int
    need: int
    replies: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


class PoolLoop:
    """Mixin of ``RealTimeExecutor``: the loop and rebuilds over a ``WorkerPool`` (``self.pool``)."""

    def _pool_init(self) -> None:
        self._ops: dict[int, _Op] = {}
        self.replicas: list[dict] = []

    def _at(self, perf_t: float) -> float:
        """Clock seconds of a ``time.perf_counter()`` stamp."""
        return perf_t - self.clock.t0

    # ---- replies ------------------------------------------------------------------------------
    def _on_reply(self, msg) -> None:
        op = self._ops.get(msg[1])
        if op is None:
            self._fail(f"worker reply to no pending command: {msg[:4]}")
        op.replies.append(msg)
        if len(op.replies) < op.need:
            return
        del self._ops[msg[1]]
        g = self.groups.get(op.gid)
        t0 = self._at(min(r[5] for r in op.replies))
        t1 = self._at(max(r[6] for r in op.replies))
        ms = max(r[4] for r in op.replies)
        if op.kind == "step":
            g.running = None
            g.inflight = (t0, t1)
            g.free_s = t1
            self._log(g, "step", t0, t1, ms)
        elif op.kind == "build":
            g.running = None
            s0, sdt = op.info["save_span"] or (t0, 0.0)
            g.free_s = g.paused_until_s = t1
            self._log(g, op.info["event"], min(s0, t0), t1, sdt * 1e3 + ms, jobs=op.info["jobs"])
        op.info["done"] = True
        op.info["t"] = (t0, t1, ms)

    def _wait_for(self, op: _Op) -> None:
        while not op.info.get("done"):
            self._on_reply(self.pool.get(600.0, need=True))

    def _send(self, g, kind: str, make, **info) -> _Op:
        seq = self.pool.next_seq()
        op = self._ops[seq] = _Op(kind, g.gid, len(g.devices), info=info)
        for k, d in enumerate(g.devices):
            self.pool.send(d, make(seq, k, d))
        return op

    # ---- the loop -----------------------------------------------------------------------------
    def _advance_pool(self) -> None:
        """Send every idle group its next step; credit completed steps (earliest end first); else
        wait for a reply, an arrival or the policy's timer."""
        for g in list(self.groups.values()):
            if g.running is None and g.inflight is None and g.pending is None and g.trainer is not None:
                g.running = "step"
                self._send(g, "step", lambda seq, k, d, g=g: ("step", seq, g.gid, g.nano_batches, g.micro_batches))
        done = sorted((g for g in self.groups.values() if g.inflight is not None and g.running is None),
                      key=lambda x: (x.inflight[1], x.gid))
        if done:
            for g in done:
                if g.gid in self.groups and g.inflight is not None:
                    self._complete(g)
            return
        t_evt = min(self._next_arrival_s(), self._next_timer if self._next_timer is not None else math.inf)
        if not self._ops:
            if t_evt == math.inf:
                self._stalled()
            self.clock.idle_until(t_evt)
            return
        msg = self.pool.get(max(0.0, min(t_evt - self.now(), 0.05)))
        if msg is not None:
            self._on_reply(msg)

    def _await_step(self, g) -> None:
        """Block until ``g``'s step in flight (if any) has been answered by all its workers."""
        while g.running == "step":
            self._on_reply(self.pool.get(600.0, need=True))

    # ---- saves and builds ---------------------------------------------------------------------
    def _pool_save(self, g) -> tuple:
        """``_save`` on workers: the lowest device sends the members' states (if anyone's is still
        needed), every worker its adapter checksum, and all drop the group. Waits (queued behind
        the group's build or step, if any)."""
        if g.trainer is None:
            return ()
        saved = g.trainer_jobs if any(j in g.remaining or j in self.remaining_queued for j in g.trainer_jobs) else ()
        w0 = time.perf_counter()
        op = self._send(g, "save", lambda seq, k, d: ("save", seq, g.gid, bool(saved) and k == 0))
        self._wait_for(op)
        sums = {r[3]: r[7][0] for r in op.replies}
        for r in op.replies:
            self.pool.states.update(r[7][1])
        ident = len(set(sums.values())) == 1
        self.replicas.append({"group_id": g.gid, "time_s": self.now(), "jobs": ";".join(map(str, g.trainer_jobs)),
                              "devices": ";".join(map(str, g.devices)),
                              "checksums": ";".join(str(sums[d]) for d in g.devices), "identical": ident})
        if not ident:
            self._fail(f"group {g.gid}'s adapter copies differ across devices {g.devices}: checksums {sums}")
        g.trainer, g.trainer_jobs = None, ()
        t0, t1, _ms = op.info["t"]
        t0 = min(t0, self._at(w0))
        g.free_s = self.now()
        for j in saved:
            self.state_ready[j] = g.free_s
        g.save_span = (t0, t1 - t0)
        return saved

    def _pool_build(self, g) -> None:
        """Send ``g``'s build to its workers (asynchronous; its row is logged when all answered)."""
        k = len(g.devices)
        js = [self.jobs[i] for i in g.members]
        parts = [shares(j.batch_size, k) for j in js]
        states = {j.index: self.pool.states.get(j.index) for j in js}
        g.trainer, g.trainer_jobs, g.running = "workers", tuple(g.members), "build"
        self._send(g, "build", lambda seq, r, d: ("build", seq, g.gid, g.devices, g.model, g.plan,
                                                  [(j.index, j.rank, p[r], j.seq_len) for j, p in zip(js, parts)],
                                                  states),
                   event=g.pending, jobs=tuple(g.members), save_span=g.save_span)
        g.paused_until_s = self.now()
        g.pending = None
