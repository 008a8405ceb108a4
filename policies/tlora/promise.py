"""tLoRA's promise kept as stated (issue 40): a job's tolerated slowdown measured against its
isolated run in the policy's own plan, and the regroup pause a join or merge costs priced against
each member's remaining budget. A mixin of ``TLoRA`` (it reads the policy's ``config``,
``reference_plan`` and ``_pause_priced``; ``TLoRA.__init__``/``_reset`` set its state)."""

from __future__ import annotations

from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, AddMembers, Snapshot, StartGroup

NANO_PLANS = ("fused", "lorafusion", "grouped")
"""Plans that take nano-batches (``tlora_sim.sim.costmodel.interface``): the tuner runs only there."""

SLOWDOWN_REFERENCES = ("own", "eager")
"""Values of ``TLoRAConfig.slowdown_reference``."""


class Promise:
    """The reference step, the per-job bound and the pause test (see module docstring)."""

    def reference_step_s(self, job: Job) -> float:
        """``job``'s isolated step time in ``reference_plan`` (s): alone on its GPUs in the
        policy's own lone-job plan (the fused kernel for tLoRA), under the cost model of the
        current decision; its eager step (``Job.isolated_step_time_s``) for ``alone``. Kept per
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

    def _use_cost_model(self, snap: Snapshot) -> None:
        """Point the reference steps at ``snap``'s cost model and GPU (forgotten when they change)."""
        cm = (snap.cost_model, snap.cluster.gpu.name)
        if cm[0] is not self._ref_cm[0] or cm[1] != self._ref_cm[1]:
            self._ref_cm = cm
            self._refs = {}

    def _note_starts(self, snap: Snapshot, actions: list[Action]) -> None:
        """Record the first start of every job the actions place (the pause test's elapsed time)."""
        if not self._pause_priced:
            return
        now = snap.now_s
        started = self._started
        for a in actions:
            if isinstance(a, (StartGroup, AddMembers)):
                for i in a.job_indices:
                    if i not in started:
                        started[i] = now

    def budget_ok(self, snap: Snapshot, members: list[Job], step_s: float, pause_s: float) -> bool:
        """Whether every one of ``members`` keeps its promise through a regroup now: its elapsed
        running time, plus the pause ``pause_s`` (s), plus its remaining steps at ``step_s`` (s),
        within max_slowdown x its reference runtime (total steps x ``reference_step_s``). A queued
        job has run 0 s and has all its steps left; a running one's remaining steps are read from
        its group in ``snap``. This prices the pause a join or merge costs (issue 40): the per-step
        test alone lets short jobs break their bound by the pause."""
        pause, now = pause_s, snap.now_s
        for j in members:
            t0 = self._started.get(j.index)
            if t0 is None:
                elapsed, rest = 0.0, float(j.total_steps)
            else:
                elapsed, rest = now - t0, float(j.total_steps)
                gid = self._member_gid.get(j.index)
                view = snap.groups.get(gid) if gid is not None else None
                if view is not None:
                    for m, r in zip(view.members, view.remaining_steps):
                        if m.index == j.index:
                            rest = r
                            break
            if elapsed + pause + rest * step_s > self.job_bound_s(j) * j.total_steps * (1 + 1e-12):
                return False
        return True
