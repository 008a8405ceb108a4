"""``lorafusion`` finds a starting head's group candidates (the next ``window`` queued jobs of its
kind) with one array comparison over the engine's queue keys (issue 20: a start does not scan a
long queue job by job). The scan it replaces must decide the same: whole simulations on a
contended workload with several kinds give identical records and timelines."""

from __future__ import annotations

from conftest import run_engine
from tlora_sim.policies.lorafusion import LoRAFusion, LoRAFusionConfig
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload


class Scanning(LoRAFusion):
    """``lorafusion`` that always scans the queue for candidates."""

    def _kinds(self, queue):
        return None


class Counting(LoRAFusion):
    """``lorafusion`` counting the starts whose candidates came from the kind index."""

    indexed = 0

    def _candidates(self, queue, pos, head, taken, index):
        got = super()._candidates(queue, pos, head, taken, index)
        self.indexed += index[0] is not None
        return got


def test_indexed_candidates_match_the_scan():
    jobs, _, model, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=900,seed=6,load=1.8,gpus=32",
                                                    policy="lorafusion", cluster="4x8xH100", seed=0,
                                                    cost_model="roofline"))
    assert len({(j.model, j.num_gpus) for j in jobs}) >= 4, "several kinds, so candidates are sparse in the queue"
    cfg = LoRAFusionConfig(window=8)
    a = run_engine(jobs, (fast := Counting(cfg)), "4x8xH100", cost_model=model, check=False)
    b = run_engine(jobs, Scanning(cfg), "4x8xH100", cost_model=model, check=False)
    assert fast.indexed > 50, "starts must read the kind index"
    assert max(r.max_group_size for r in a.records) > 1, "groups must form"
    assert max(row[2] for row in a.timeline) >= 50, "the queue must grow long"
    assert [(r.start_s, r.finish_s, r.max_group_size) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size) for r in b.records]
    assert a.timeline == b.timeline
