"""The engine as ``validate-run`` sets it up: rebuild pauses the way the executor pays them.

The SimPy engine (``sim/core/engine.py``) pauses a group for ``regroup_pause_s`` whenever its
members change, and a change that comes while the group is still paused only extends the pause to
``now + regroup_pause_s``: two changes a fraction of a second apart cost little more than one
pause. The executor (``sim/executor/runtime.py``) cannot do that. It decides between steps, so a
change that comes while a group rebuilds waits for the rebuild and the step after it, and then
pays a whole rebuild of its own; and a rebuild's cost grows with the members saved and restored
(on the third H100 lease a one-member rebuild took 0.39-0.47 s, a four-member one 0.76-0.94 s).

:class:`ExecutorReplayEngine` keeps the engine and changes only the pause a change sets:

* **serial rebuilds**: a change to a group paused by a change at an *earlier* instant queues its
  pause after that one (``paused_until = paused_until + pause``) instead of overlapping it; all
  changes at one instant still cost one pause (the executor rebuilds once per instant);
* **pause by size**: the pause of a change is ``pause_by_size[members after it]`` where the run
  measured that size (:func:`pauses_by_size`), else ``regroup_pause_s``.

On ``h100_third/tlora`` replayed with its own step times these two turn the replay from the first
decision that differed at 17.7 s (half of the jobs placed differently, average JCT -14.7%) into
the executed schedule, every placement the same (``docs/executor.md``). The engine could take both
as options (``Engine(serial_pauses=True, pause_s=callable)``); until it does, this subclass wraps
its four membership-changing methods.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from tlora_sim.sim.core.engine import Engine


def pauses_by_size(steps: pd.DataFrame, extra_s: float = 0.0) -> dict[int, float]:
    """Mean measured ``regroup`` time by members after the change (s), plus ``extra_s`` (the
    first-step excess a rebuilt group pays, ``steptable.first_step_excess_s``)."""
    r = steps[steps.event == "regroup"]
    if r.empty:
        return {}
    n = r.jobs.astype(str).str.count(";") + 1
    return {int(k): float(v) / 1e3 + extra_s for k, v in r.ms.groupby(n).mean().items()}


class ExecutorReplayEngine(Engine):
    """``Engine`` with serial rebuild pauses and pauses by group size (module docstring).

    Args:
        *args, **kwargs: ``Engine``'s.
        pause_by_size: members after a change -> its pause (s); sizes not in it pause
            ``regroup_pause_s``.
        serial: queue a change's pause after a pause set at an earlier instant (default True).
    """

    def __init__(self, *args, pause_by_size: Mapping[int, float] | None = None, serial: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pause_by_size = dict(pause_by_size or {})
        self.serial = bool(serial)
        self.serial_pauses = 0  # changes whose pause was queued after another
        self._pause_from: dict[int, float] = {}  # group id -> instant its current pause was set

    def _change(self, gid: int, size: int, apply) -> None:
        """Apply one membership change of group ``gid`` (``size`` members after it) with the pause
        this engine charges for it."""
        now, base = self.env.now, self.regroup_pause_s
        g = self.groups.get(gid)
        until = g.paused_until_s if g is not None else 0.0
        busy = g is not None and until > now and self._pause_from.get(gid, now) < now
        pause = self.pause_by_size.get(size, base) if size > 0 else base
        self.regroup_pause_s = pause
        try:
            apply()
        finally:
            self.regroup_pause_s = base
        g = self.groups.get(gid)
        if g is None or g.paused_until_s == until:
            return  # closed, or no pause set
        if self.serial and busy:  # rebuild after the one in progress (and the step between them)
            g.paused_until_s = until + pause
            self.serial_pauses += 1
            self._retime(g)
        elif self._pause_from.get(gid) != now:
            self._pause_from[gid] = now

    def _start_group(self, a) -> None:
        gid = self._next_gid
        super()._start_group(a)
        self._pause_from[gid] = self.env.now

    def _add_members(self, a) -> None:
        g = self.groups.get(a.group_id)
        size = len(g.members) + len(a.job_indices) if g is not None else 0
        self._change(a.group_id, size, lambda: super(ExecutorReplayEngine, self)._add_members(a))

    def _remove_members(self, a) -> None:
        g = self.groups.get(a.group_id)
        size = len(g.members) - len(a.job_indices) if g is not None else 0
        self._change(a.group_id, size, lambda: super(ExecutorReplayEngine, self)._remove_members(a))

    def _finish(self, g, done: list[int]) -> None:
        size = len(g.members) - len(done)
        self._change(g.gid, size, lambda: super(ExecutorReplayEngine, self)._finish(g, done))
