"""tLoRA's promise kept as stated (issue 40): a job's tolerated slowdown measured against its
isolated run in the policy's own plan, and the regroup pause a join or merge costs priced against
each member's remaining budget (``rules.budget_ok``). One ``Promise`` object per policy object
holds what that needs across decisions: the reference steps, each job's first start, and the
group each running job was last seen in."""

from __future__ import annotations

from typing import Sequence

from tlora_sim.policies.tlora import rules
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, AddMembers, Snapshot, StartGroup


class Promise:
    """The reference step, the per-job bound and the pause test of one policy object.

    Args:
        reference_plan: the plan a job's tolerated slowdown is measured against (``alone``: its
            eager step, ``Job.isolated_step_time_s``).
        pause_priced: whether the join test prices the regroup pause (then starts are recorded).
    """

    def __init__(self, reference_plan: str, pause_priced: bool) -> None:
        self.reference_plan = reference_plan
        self.pause_priced = pause_priced
        self._refs: dict[tuple, float] = {}  # (model, member, GPUs) -> isolated step in ``reference_plan`` (s)
        self._ref_cm: tuple = (None, "")  # (cost model, GPU name) the reference steps are for
        self._started: dict[int, float] = {}  # job index -> first start (s), from the policy's own actions
        self._group_of: dict[int, int] = {}  # job index -> the running group it was last seen in

    def reference_step_s(self, job: Job) -> float:
        """``job``'s isolated step time in ``reference_plan`` (s): alone on its GPUs in the policy's
        own lone-job plan (the fused kernel for tLoRA), under the cost model of the current decision
        (``use_cost_model``); its eager step (``Job.isolated_step_time_s``) for ``alone``. Kept per
        (model, cost-model member, GPU count)."""
        if self.reference_plan == "alone":
            return job.isolated_step_time_s
        key = (job.model, job.member, job.num_gpus)
        hit = self._refs.get(key)
        if hit is None:
            cm, gpu = self._ref_cm
            hit = self._refs[key] = cm.step_time_s(job.model, gpu, (job.member,), job.num_gpus, self.reference_plan)
        return hit

    def job_bound_s(self, job: Job) -> float:
        """Largest step time ``job`` tolerates in a group (s): max_slowdown x ``reference_step_s``."""
        return job.max_slowdown * self.reference_step_s(job)

    def use_cost_model(self, snap: Snapshot) -> None:
        """Point the reference steps at ``snap``'s cost model and GPU (forgotten when they change)."""
        cm = (snap.cost_model, snap.cluster.gpu.name)
        if cm[0] is not self._ref_cm[0] or cm[1] != self._ref_cm[1]:
            self._ref_cm = cm
            self._refs = {}

    def note_starts(self, snap: Snapshot, actions: Sequence[Action]) -> None:
        """Record the first start of every job the actions place (the pause test's elapsed time)."""
        if not self.pause_priced:
            return
        now = snap.now_s
        started = self._started
        for a in actions:
            if isinstance(a, (StartGroup, AddMembers)):
                for i in a.job_indices:
                    if i not in started:
                        started[i] = now

    def note_group(self, gid: int, members: Sequence[Job]) -> None:
        """Running group ``gid`` holds ``members`` now (where the pause test reads their remaining steps)."""
        if self.pause_priced:
            for j in members:
                self._group_of[j.index] = gid

    def budget_ok(self, snap: Snapshot, members: list[Job], step_s: float, pause_s: float) -> bool:
        """``rules.budget_ok`` for ``members`` at step time ``step_s`` (s) through a pause of
        ``pause_s`` (s) now: a running member's remaining steps are read from the group it was last
        noted in (``note_group``), all its steps if that group is gone."""

        def remaining(j: Job) -> float:
            gid = self._group_of.get(j.index)
            view = snap.groups.get(gid) if gid is not None else None
            if view is not None:
                for m, r in zip(view.members, view.remaining_steps):
                    if m.index == j.index:
                        return r
            return float(j.total_steps)

        started = self._started
        return rules.budget_ok(snap.now_s, members, step_s, pause_s, lambda j: started.get(j.index), remaining,
                               self.job_bound_s)
