"""Time and devices of the real-time executor: the wall clock, the virtual clock of simulated
devices, and which device ids a group holds.

Two clocks, one interface (``start()``, ``now()`` in seconds since ``start``):

* :class:`WallClock` (one real device: a GPU, or the CPU as one device): ``now`` is
  ``time.perf_counter`` since the run started. Steps, regroups and decisions take the time they
  take; idle gaps are slept through.
* :class:`VirtualClock` (``--device cpu --gpus N``, N > 1: N devices simulated on one CPU): the
  groups' steps run for real one after another, interleaved step by step in the order the devices
  would reach them, and each step's, save's and build's duration *as the trainer reports it* is
  charged to the group's own devices (``DeviceTrainer``: the wall time of the step, save or build
  itself, timed inside it; a modelled trainer: its model's value, e.g. 0), never the host's time
  around the call (``sim/executor/runtime.py``). ``now`` is
  the time of the event being processed (the earliest step end, arrival or policy timer); it
  jumps over idle gaps. So N groups that each take 1 s per step advance as if on N devices, at
  1 s per step each, although the CPU ran them one after another. A policy decision takes no
  virtual time (its wall time is still recorded in ``perf.json``).

:class:`DeviceSlots` turns a policy's placement ``((node, gpus), ...)`` into device ids
``node x gpus_per_node + local index`` (lowest free first) for ``steps.csv``.
"""

from __future__ import annotations

import time
from typing import Sequence


class WallClock:
    """Seconds of wall time since :meth:`start` (``time.perf_counter``)."""

    virtual = False

    def __init__(self) -> None:
        self._t0 = 0.0

    def start(self) -> None:
        """Start counting from now."""
        self._t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self._t0

    @property
    def t0(self) -> float:
        """The ``time.perf_counter()`` of :meth:`start` (s; worker processes of the host share it)."""
        return self._t0

    def idle_until(self, t: float, *, slice_s: float = 0.05) -> None:
        """Sleep towards ``t`` (s), at most ``slice_s`` at a time (the caller's loop re-checks)."""
        time.sleep(max(0.0, min(t - self.now(), slice_s)))


class VirtualClock:
    """The event time of N simulated devices (see the module docstring); starts at 0 s."""

    virtual = True

    def __init__(self) -> None:
        self._t = 0.0

    def start(self) -> None:
        """Reset to 0 s."""
        self._t = 0.0

    def now(self) -> float:
        """The time of the event being processed (s)."""
        return self._t

    def advance(self, t: float) -> None:
        """Move to ``t`` (s); never backwards."""
        if t > self._t:
            self._t = t

    def idle_until(self, t: float, **_kw) -> None:
        """Jump to ``t`` (s): simulated devices do not wait."""
        self.advance(t)


class DeviceSlots:
    """Device ids free per node, handed out lowest first.

    Args:
        nodes: nodes of the cluster.
        gpus_per_node: devices per node.

    Raises:
        RuntimeError: a placement asks a node for more devices than are free there, or returns
            ids that are not held (the engine's double-booking rule).
    """

    def __init__(self, nodes: int, gpus_per_node: int) -> None:
        self.gpn = gpus_per_node
        self.free = [list(range(n * gpus_per_node, (n + 1) * gpus_per_node)) for n in range(nodes)]
        self.busy_until: dict[int, float] = {}  # device -> end of the last work of a closed group (clock s)

    def ready_s(self, ids: Sequence[int]) -> float:
        """When all of ``ids`` have finished the work of the groups that held them before (s)."""
        return max((self.busy_until.get(d, 0.0) for d in ids), default=0.0)

    def take(self, placement: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """Reserve the devices of ``placement``; their ids, ascending."""
        out: list[int] = []
        for node, k in placement:
            if not 0 <= node < len(self.free) or k > len(self.free[node]):
                raise RuntimeError(f"placement {tuple(placement)} asks node {node} for {k} device(s); free: "
                                   f"{self.free[node] if 0 <= node < len(self.free) else 'no such node'}")
            out += self.free[node][:k]
            del self.free[node][:k]
        return tuple(sorted(out))

    def give_back(self, ids: Sequence[int], busy_until_s: float = 0.0) -> None:
        """Return devices taken by :meth:`take`, busy until ``busy_until_s`` (s)."""
        for d in ids:
            self.busy_until[d] = busy_until_s
            node = d // self.gpn
            if d in self.free[node]:
                raise RuntimeError(f"device {d} returned twice")
            self.free[node].append(d)
            self.free[node].sort()
