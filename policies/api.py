"""The public policy API: everything a policy module needs, and nothing else.

A policy is a class registered under a name, built from a config dataclass, that maps a read-only
:class:`Snapshot` of the cluster to a list of actions. It never touches the engine or the cost
model's implementation: predictions come through ``snapshot.step_time_s``,
``snapshot.fits_memory`` and ``snapshot.cost_model`` (the :class:`CostModel` interface). A
minimal policy (docs/writing-a-policy.md walks through it; docs/examples/equal_rank.py is a
complete one)::

    from dataclasses import dataclass
    from tlora_sim.policies.api import Snapshot, StartGroup, register

    @dataclass(frozen=True)
    class FifoConfig:
        pass

    @register("my-fifo", FifoConfig, "every job alone, arrival order")
    class MyFifo:
        plan = "alone"
        timer_s = None

        def __init__(self, config: FifoConfig):
            self.config = config

        def decide(self, snap: Snapshot) -> list:
            free, out = snap.free.copy(), []
            for job in snap.queue:
                placement = free.take(job.num_gpus)
                if placement is None:
                    break
                out.append(StartGroup((job.index,), placement, self.plan))
            return out

Load it with ``tlora-sim replay --policy-module my_fifo.py --policy my-fifo ...``, or ship it in
a distribution with an entry point in the group ``tlora_sim.policies``. Check it against the
contract with :func:`check_policy` before running a trace. :class:`Planner` (a scratch pad of one
decision: free GPUs and planned groups, :class:`PlannedGroup`, kept consistent; ``actions()`` at the
end) removes the bookkeeping of several starts and joins per decision. ``order_queue``,
``backfill_starts`` and ``resolve_discipline`` give a policy the shared queue discipline (priority
order x backfilling, docs/policies.md).
"""

from __future__ import annotations

from tlora_sim.policies.contract import Violation, check_policy
from tlora_sim.policies.ordering import ORDERINGS, backfill_starts, order_queue, resolve_discipline
from tlora_sim.policies.planner import PlannedGroup, Planner
from tlora_sim.policies.registry import Policy, available, load_policy_module, make_policy, register
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus, Placement
from tlora_sim.sim.core.snapshot import (Action, AddMembers, GroupView, RemoveMembers, SetExecution, Snapshot,
                                         StartGroup, StopMembers)
from tlora_sim.sim.costmodel.interface import PLANS, CostModel, Member

__all__ = ["Action", "AddMembers", "CostModel", "FreeGpus", "GroupView", "Job", "Member", "ORDERINGS", "PLANS",
           "Placement", "PlannedGroup", "Planner", "Policy", "RemoveMembers", "SetExecution", "Snapshot",
           "StartGroup", "StopMembers", "Violation", "available", "backfill_starts", "check_policy",
           "load_policy_module", "make_policy", "order_queue", "register", "resolve_discipline"]
