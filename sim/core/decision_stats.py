"""Decision statistics: what the policy's decisions cost, by queue length (``perf.json``'s
``decision_ms_by_queue``), kept by an engine listener with named fields.

The engine times every decision (wall clock, ``time.perf_counter``) and CPU-times a sample of them
(``time.thread_time``: the CPU of the engine's thread, which other work on the machine does not
inflate): around the first :data:`CPU_ALL` decisions of each queue-length decade, then every
:data:`CPU_SAMPLE`-th, each of those counted :data:`CPU_SAMPLE` times (a clock read is a system
call, 1-4 us on the EPYC VM; around every decision they were ~11% of ``independent``'s CPU on
merged ITP, bench/README.md session 15). :class:`DecisionStats` says which decisions to CPU-time
(:meth:`DecisionStats.cpu_weight`) and adds up each decision it is told of
(:meth:`DecisionStats.decided`, an ``EngineListener`` hook) into one :class:`QueueDecade` per
decade: decade 0 is the empty queue, decade d >= 1 the queue lengths 10^(d-1) <= n < 10^d.
``metrics.decisions_by_queue`` turns them into ``perf.json``'s table (bench/replay.py reads it:
issue 20's "per-decision time flat from queue 10 to 10,000").
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.sim.core.listeners import EngineListener

CPU_ALL, CPU_SAMPLE = 64, 8
"""CPU clock reads around the first CPU_ALL decisions of each queue-length decade, then every
CPU_SAMPLE-th, counted CPU_SAMPLE times: a read is a system call (1-4 us on the EPYC VM; around every
decision ~11% of ``independent``'s CPU on merged ITP, bench/README.md session 15). Wall: every one."""


@dataclass(slots=True)
class QueueDecade:
    """The decisions taken at queue lengths of one decade, added up.

    Attributes:
        decisions: decisions taken.
        wall_s: their total wall time (s).
        queue_sum: Σ queue length at those decisions (jobs).
        cpu_s: their CPU time of the engine's thread (s), estimated from the CPU-timed ones
            (each counted with its weight, :data:`CPU_ALL`).
        cpu_timed: decisions CPU-timed.
        idle_decisions, idle_wall_s, idle_queue_sum, idle_cpu_s, idle_cpu_timed: the same five
            for the decade's idle decisions (those that placed no job: no ``StartGroup`` or
            ``AddMembers``).
        placed_jobs: jobs the decade's decisions placed (``StartGroup`` / ``AddMembers`` members).
    """

    decisions: int = 0
    wall_s: float = 0.0
    queue_sum: int = 0
    cpu_s: float = 0.0
    cpu_timed: int = 0
    idle_decisions: int = 0
    idle_wall_s: float = 0.0
    idle_queue_sum: int = 0
    idle_cpu_s: float = 0.0
    idle_cpu_timed: int = 0
    placed_jobs: int = 0


def decade(queue_length: int) -> int:
    """The queue-length decade of ``queue_length``: 0 for an empty queue, else its number of
    decimal digits (1 for 1-9, 2 for 10-99, ...)."""
    return len(str(queue_length)) if queue_length else 0


class DecisionStats(EngineListener):
    """Decision cost by queue-length decade (``by_queue``: decade -> :class:`QueueDecade`, in
    first-seen order; ``metrics.decisions_by_queue`` sorts them). The engine keeps one
    (``Engine.decision_stats``) and calls it directly, so an unobserved run pays no other hook."""

    def __init__(self) -> None:
        self.by_queue: dict[int, QueueDecade] = {}

    def cpu_weight(self, queue_length: int) -> int:
        """How many decisions the next one at ``queue_length`` counts for in ``cpu_s``: 1 for the
        first :data:`CPU_ALL` of its decade, then :data:`CPU_SAMPLE` for every ``CPU_SAMPLE``-th
        and 0 (not CPU-timed) for the others."""
        d = len(str(queue_length)) if queue_length else 0  # decade(), inline: once per decision
        rec = self.by_queue.get(d) or self.by_queue.setdefault(d, QueueDecade())
        n = rec.decisions
        return 1 if n < CPU_ALL else CPU_SAMPLE if n % CPU_SAMPLE == 0 else 0

    def decided(self, now: float, queue_length: int, wall_s: float, cpu_s: float | None, placed: int) -> None:
        """Add one decision taken at ``queue_length`` queued jobs: ``wall_s`` its wall time (s),
        ``cpu_s`` its CPU time (s; None when it was not CPU-timed: :meth:`cpu_weight` said 0),
        ``placed`` the jobs its actions placed."""
        d = len(str(queue_length)) if queue_length else 0  # decade(), inline
        rec = self.by_queue.get(d) or self.by_queue.setdefault(d, QueueDecade())
        cpu = 0.0
        if cpu_s is not None:
            cpu = (1 if rec.decisions < CPU_ALL else CPU_SAMPLE) * cpu_s
        rec.decisions += 1
        rec.wall_s += wall_s
        rec.queue_sum += queue_length
        if cpu_s is not None:
            rec.cpu_s += cpu
            rec.cpu_timed += 1
        if not placed:  # idle decisions also go to their own five
            rec.idle_decisions += 1
            rec.idle_wall_s += wall_s
            rec.idle_queue_sum += queue_length
            if cpu_s is not None:
                rec.idle_cpu_s += cpu
                rec.idle_cpu_timed += 1
        rec.placed_jobs += placed
