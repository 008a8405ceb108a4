"""Queue orderings, shared by the policies and by their no-grouping ablations.

* ``fifo``: arrival order (``Job.index``).
* ``urgency`` (tLoRA, arXiv 2602.07263): highest urgency first, urgency = time waited so far over
  the job's isolated runtime (a response ratio: short jobs that waited long come first), then
  larger residual capacity first (tolerated slowdown minus one: jobs that co-locate easily), then
  arrival.
* ``srpt``: shortest isolated remaining runtime first (LoRA step times are predictable, so the
  remaining time is known), then arrival.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.jobs import Job


def urgency(job: Job, now_s: float) -> float:
    """Waited time over isolated runtime (dimensionless, >= 0)."""
    return max(now_s - job.submit_time_s, 0.0) / job.isolated_runtime_s


def order_queue(queue: Sequence[Job], how: str, now_s: float) -> list[Job]:
    """The queue sorted by ordering ``how`` (see module docstring).

    Raises:
        InputError: unknown ordering.
    """
    if how == "fifo":
        return list(queue)
    if how not in ORDERINGS:
        raise InputError(f"unknown queue ordering {how!r}; known: {', '.join(ORDERINGS)}", field="ordering")
    return sorted(queue, key=lambda j: ORDERINGS[how](j, now_s))


ORDERINGS: dict[str, Callable[[Job, float], tuple]] = {
    "fifo": lambda j, now: (j.index,),
    "urgency": lambda j, now: (-urgency(j, now), -(j.max_slowdown - 1.0), j.index),
    "srpt": lambda j, now: (j.isolated_runtime_s, j.index),
}
