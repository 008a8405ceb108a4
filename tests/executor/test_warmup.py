"""The executor's warm-up before the clock starts (``trainer.warm_up``): every distinct job shape
is stepped alone, then one group over all ranks, so that no kernel compiles inside a job's first
step (H200, 2026-12-02: a cold Triton cache made workload B's first step take 4.4 s)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


class _Group:
    def __init__(self, log, members):
        self.log, self.members = log, members

    def step(self, nano: int = 1, micro: int = 1) -> float:
        self.log.append(tuple((r, b, s) for _, r, b, s in self.members))
        return 1.0


class _Trainer:
    def __init__(self):
        self.log, self.states = [], {"left": 1}

    def group(self, model, plan, members):
        return _Group(self.log, members)


def test_every_job_shape_is_stepped_alone_then_all_ranks_together():
    from tlora_sim.sim.executor.trainer import warm_up

    t = _Trainer()
    shapes = [(16, 1, 512), (2, 8, 2048), (16, 1, 512), (4, 2, 1024)]
    warm_up(t, "llama3-8b", "fused", shapes, [16, 2, 4, 2])
    assert t.log == [((2, 8, 2048),), ((4, 2, 1024),), ((16, 1, 512),), ((2, 1, 64), (4, 1, 64), (16, 1, 64))]
    assert t.states == {}


def test_execute_warms_the_shapes_of_each_base_model():
    from tlora_sim.sim.executor.execute import ExecuteConfig, warm_shapes
    from tlora_sim.sim.executor.workload import scaled_workload

    jobs = scaled_workload(ExecuteConfig(trace="synthetic:jobs=30", policy="tlora", jobs=12, lora_dist="tlora"),
                           "H100")[0]
    for model in {j.model for j in jobs}:
        shapes, ranks = warm_shapes(jobs, model)
        mine = [j for j in jobs if j.model == model]
        assert set(shapes) == {(j.rank, j.batch_size, j.seq_len) for j in mine}
        assert ranks == sorted({j.rank for j in mine})
