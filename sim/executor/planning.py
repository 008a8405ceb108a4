"""A policy that plans with the cost model of an executed run while the engine advances time with
another (``validate-run`` with measured or scaled step times).

In an executed run the policy saw the profiled model of the GPU type: ``Snapshot.cost_model`` and
every running group's ``GroupView.step_time_s`` were that model's predictions, whatever the steps
really took. When the simulator replays the run with other step times (the run's measured table,
``sim/executor/steptable.py``), :class:`PlanningPolicy` hands the policy the snapshot it would
have had: the same planning model, and the groups' step times as that model predicts them. Only
time itself (now, remaining steps, pauses) follows the replay's step times. So the policy's
choices depend on the same numbers as in the executed run, and the replay tests the schedule.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tlora_sim.sim.core.snapshot import GroupView, Snapshot


class PlanningPolicy:
    """Wrap ``policy`` so that it plans with ``planning`` (a cost model) on GPU type ``gpu``.

    Every other attribute (``plan``, ``timer_s``, ``name``, ``config``) is the wrapped policy's.
    """

    def __init__(self, policy, planning, gpu: str):
        self.policy, self.planning, self.gpu = policy, planning, gpu

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def decide(self, snap: Snapshot) -> list:
        """The wrapped policy's decision on the planning view of ``snap``."""
        return self.policy.decide(replace(snap, cost_model=self.planning,
                                          groups=_PlannedViews(snap.groups, self.planning, self.gpu)))


class _PlannedViews(Mapping):
    """``snap.groups`` with each view's ``step_time_s`` predicted by the planning model (lazily)."""

    def __init__(self, groups: Mapping[int, GroupView], planning, gpu: str):
        self._groups, self._cm, self._gpu, self._views = groups, planning, gpu, {}

    def __getitem__(self, gid: int) -> GroupView:
        v = self._views.get(gid)
        if v is None:
            g = self._groups[gid]
            step = self._cm.step_time_s(g.model, self._gpu, g.adapters, g.n_gpus, g.plan, g.nano_batches,
                                        g.micro_batches)
            v = self._views[gid] = replace(g, step_time_s=step)
        return v

    def __iter__(self):
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, gid) -> bool:
        return gid in self._groups
