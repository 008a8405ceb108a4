"""``Planner.open_candidates`` reads the size of a running group before copying it, so that an
``mlora`` decision with many full groups of the head's kind does not copy them all (issue 20); the
groups it skips could not take a job, so whole simulations must match the plain filter of
``Planner.candidates``, and the engine's ``size`` must be the view's member count."""

from __future__ import annotations

import pytest

from conftest import run_engine
from tlora_sim.policies.mlora import MLoRA, MLoRAConfig
from tlora_sim.policies.planner import Planner
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload
from tlora_sim.sim.core.snapshot import GroupViews


@pytest.mark.parametrize("concurrency", [2, 4])
def test_skipping_full_groups_matches_the_plain_candidates(concurrency, monkeypatch):
    jobs, _, model, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=700,seed=8,load=1.8,gpus=32",
                                                    policy="mlora", cluster="4x8xH100", seed=0,
                                                    cost_model="roofline"))
    cfg = MLoRAConfig(concurrency_num=concurrency)
    sizes = GroupViews.size
    skipped = []

    def size(views, gid):
        n = sizes(views, gid)
        assert n == len(views[gid].members)
        skipped.append(n >= concurrency)
        return n

    with monkeypatch.context() as m:
        m.setattr(GroupViews, "size", size)
        a = run_engine(jobs, MLoRA(cfg), "4x8xH100", cost_model=model, check=False)
    with monkeypatch.context() as m:  # the plain filter: every candidate copied
        m.setattr(Planner, "open_candidates",
                  lambda self, job, below: (g for g in self.candidates(job) if len(g.members) < below))
        b = run_engine(jobs, MLoRA(cfg), "4x8xH100", cost_model=model, check=False)
    assert sum(skipped) > 100, "full groups must be skipped"
    assert max(r.max_group_size for r in a.records) == concurrency, "groups must fill up"
    assert [(r.start_s, r.finish_s, r.max_group_size) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size) for r in b.records]
    assert a.timeline == b.timeline
