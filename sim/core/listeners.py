"""Engine listeners: code that watches a simulation without changing it.

The engine calls a listener at every state change it makes (arrivals, decisions, group starts,
joins, leaves, re-times, progress, finishes, closes, the end). Invariant checking
(``invariants.InvariantChecker``) and benchmark counters (:class:`EventCounter`) are listeners;
so is anything a user wants to trace. A listener must not change the engine's state or raise,
except :meth:`EngineListener.fail` in a checker (the engine calls it before raising its own
error). The engine holds one :class:`Listeners` fan-out, or None when nothing listens, so an
unobserved simulation pays one ``is None`` test per hook site.
"""

from __future__ import annotations

from typing import Any, Sequence

HOOKS = ("arrive", "decision", "decided", "start", "join", "leave", "retime", "progress", "finish", "close", "at", "final",
         "fail")


class EngineListener:
    """Base class: every hook does nothing. Times are simulated seconds; job indices are
    ``Job.index``; ``gid`` is the engine's group id."""

    def arrive(self, now: float, indices: Sequence[int]) -> None:
        """Jobs ``indices`` joined the queue at ``now``."""

    def decision(self, now: float, actions: Sequence[Any]) -> None:
        """The policy returned ``actions`` at ``now`` (before the engine applies them)."""

    def decided(self, now: float, queue_length: int, wall_s: float, cpu_s: float | None, placed: int) -> None:
        """The engine applied the actions of the decision at ``now``, taken with ``queue_length``
        jobs queued: ``wall_s`` its wall time (s), ``cpu_s`` the engine thread's CPU time (s; None
        when not CPU-timed: ``decision_stats.CPU_ALL``), ``placed`` the jobs its ``StartGroup`` /
        ``AddMembers`` placed (``decision_stats.DecisionStats`` adds them up)."""

    def start(self, gid: int, model: str, n_gpus: int, placement: Sequence[tuple[int, int]], plan: str,
              members: Sequence[int], engine_free: Sequence[int]) -> None:
        """Group ``gid`` started on ``placement``; ``engine_free`` is free GPUs per node after it."""

    def join(self, gid: int, members: Sequence[int], *, started: bool = False) -> None:
        """Jobs ``members`` joined group ``gid``."""

    def leave(self, gid: int, members: Sequence[int]) -> None:
        """Jobs ``members`` left group ``gid`` for the queue (progress kept)."""

    def retime(self, gid: int, model: str, n_gpus: int, plan: str, members: Sequence[Any],
               member_indices: Sequence[int], step_s: float, micro_batches: int) -> None:
        """Group ``gid`` got a new step time ``step_s`` (s) for ``members``."""

    def progress(self, member_indices: Sequence[int], steps: float) -> None:
        """Every member in ``member_indices`` trained ``steps`` more steps."""

    def finish(self, gid: int, i: int, *, early: bool = False) -> None:
        """Job ``i`` finished in group ``gid`` (``early``: stopped before its total steps)."""

    def close(self, gid: int, engine_free: Sequence[int]) -> None:
        """Group ``gid`` closed and released its GPUs."""

    def at(self, now: float, kind: str, detail: Any = "") -> None:
        """A timed event of ``kind`` ("resume", "timer") fired at ``now``."""

    def final(self, timeline: Sequence[tuple], records: Sequence[Any] = ()) -> None:
        """The simulation ended (no events left)."""

    def fail(self, check: str, message: str) -> None:
        """The engine found an impossible state; a checker may raise its own richer error here."""


class Listeners(EngineListener):
    """Fans every hook out to several listeners, in order."""

    def __init__(self, listeners: Sequence[EngineListener]):
        self.listeners = list(listeners)
        for hook in HOOKS:  # bind each hook once: no per-call loop over names
            fns = [getattr(x, hook) for x in self.listeners]
            setattr(self, hook, _fan(fns))


def _fan(fns):
    if len(fns) == 1:
        return fns[0]

    def call(*args, **kwargs):
        for f in fns:
            f(*args, **kwargs)

    return call


class EventCounter(EngineListener):
    """Counts what the engine did (for benchmarks): decisions, group starts, joins, leaves,
    re-times, finishes."""

    def __init__(self) -> None:
        self.counts = {"decisions": 0, "starts": 0, "joins": 0, "leaves": 0, "retimes": 0, "finishes": 0}

    def decision(self, now, actions):
        self.counts["decisions"] += 1

    def start(self, *args, **kwargs):
        self.counts["starts"] += 1

    def join(self, gid, members, *, started=False):
        self.counts["joins"] += 1

    def leave(self, gid, members):
        self.counts["leaves"] += 1

    def retime(self, *args, **kwargs):
        self.counts["retimes"] += 1

    def finish(self, gid, i, *, early=False):
        self.counts["finishes"] += 1
