"""``mlora`` reads the size of a running group before copying it into the planner, so that a
decision with many full groups of the head's kind does not copy them all (issue 20); the groups it
skips could not take a job, so whole simulations must match the plain reading of
``Planner.candidates``, and the engine's ``size`` must be the view's member count."""

from __future__ import annotations

import pytest

from conftest import run_engine
from tlora_sim.policies.mlora import MLoRA, MLoRAConfig
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload


class Plain(MLoRA):
    """``mlora`` that copies every candidate group (``Planner.candidates``)."""

    def _open(self, snap, plan, job):
        yield from plan.candidates(job)


class Counting(MLoRA):
    """``mlora`` that counts the full groups skipped by size and checks the size against the view."""

    skipped = 0

    def _open(self, snap, plan, job):
        kind = (job.model, job.num_gpus)
        for gid in snap.kinds.get(kind, ()):
            assert snap.groups.size(gid) == len(snap.groups[gid].members)
        seen = {g.group_id for g in super()._open(snap, plan, job)}
        self.skipped += sum(1 for gid in snap.kinds.get(kind, ()) if gid not in seen)
        yield from super()._open(snap, plan, job)


@pytest.mark.parametrize("concurrency", [2, 4])
def test_skipping_full_groups_matches_the_plain_candidates(concurrency):
    jobs, _, model, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=700,seed=8,load=1.8,gpus=32",
                                                    policy="mlora", cluster="4x8xH100", seed=0,
                                                    cost_model="roofline"))
    cfg = MLoRAConfig(concurrency_num=concurrency)
    a = run_engine(jobs, (fast := Counting(cfg)), "4x8xH100", cost_model=model, check=False)
    b = run_engine(jobs, Plain(cfg), "4x8xH100", cost_model=model, check=False)
    assert fast.skipped > 100, "full groups must be skipped"
    assert max(r.max_group_size for r in a.records) == concurrency, "groups must fill up"
    assert [(r.start_s, r.finish_s, r.max_group_size) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size) for r in b.records]
    assert a.timeline == b.timeline
