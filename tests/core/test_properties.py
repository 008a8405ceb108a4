"""Property-based tests (Hypothesis): random traces x clusters x policies x regroup pauses, every run
checked against every invariant of ``tlora_sim.sim.core.invariants`` while it simulates, plus end-of-run checks.

Example counts are modest (the ``ci`` profile in conftest.py); ``HYPOTHESIS_PROFILE=thorough``
runs 500 examples per test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import CM
from tlora_sim.policies.registry import ABLATION_SUFFIX, available, make_policy
from tlora_sim.sim.core.cluster import ClusterSpec
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.core.engine import Engine
from tlora_sim.sim.core.workload import build_jobs


def policy_names() -> list[str]:
    """Every registered policy and its no-grouping ablation where it has one."""
    names = []
    for e in available():
        names.append(e.name)
        if any(f == "grouping" for f in e.config_cls.__dataclass_fields__):
            names.append(e.name + ABLATION_SUFFIX)
    return names


POLICIES = policy_names()


@st.composite
def scenarios(draw, sweeps: bool | None = None):
    """A random cluster, trace (with LoRA attributes, maybe sweeps) and regroup pause."""
    nodes = draw(st.integers(1, 3))
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    gpu = draw(st.sampled_from(sorted(GPUS)))
    cluster = ClusterSpec(nodes, gpn, GPUS[gpu], nodes_per_rack=draw(st.sampled_from([1, 2, 4])))
    n = draw(st.integers(1, 24))
    # arrivals: gaps often zero (same-instant ties) or short (contention), sometimes long (idle cluster)
    gaps = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.001, 60.0), st.floats(60.0, 900.0),
                                   st.floats(900.0, 30000.0)), min_size=n, max_size=n))
    submit = np.cumsum(gaps) - gaps[0]
    rows = []
    for i in range(n):
        rows.append({
            "job_id": f"p{i}", "submit_time_s": float(submit[i]),
            "duration_s": draw(st.one_of(st.floats(1.0, 600.0), st.floats(600.0, 20000.0), st.floats(2e4, 2e5))),
            "num_gpus": draw(st.sampled_from([1, 1, 1, 2, 4, 8, 16])),
            "tenant": draw(st.sampled_from(["", "a", "b"])),
            "model": draw(st.sampled_from(["llama3-8b", "llama3-8b", "qwen3-8b", "qwen2.5-32b"])),
            "rank": draw(st.sampled_from([2, 4, 8, 16, 64])),
            "batch_size": draw(st.sampled_from([1, 1, 2, 4, 8])),
            "seq_len": draw(st.sampled_from([256, 512, 1024, 2048])),
            "max_slowdown": draw(st.sampled_from([1.0, 1.25, 1.5, 2.0, 3.0, 3.0])),
        })
    frame = pd.DataFrame(rows)
    frame.attrs["path"] = "generated"
    use_sweeps = draw(st.booleans()) if sweeps is None else sweeps
    if use_sweeps:
        from tlora_sim.traces.sweeps import expand_sweeps

        frame = expand_sweeps(frame, np.random.default_rng(draw(st.integers(0, 2**16))), 0.6, (2, 3),
                              {2: 0.25, 4: 0.25, 8: 0.25, 16: 0.25})
    jobs, skipped = build_jobs(frame, cluster, CM)
    pause = draw(st.sampled_from([0.0, 5.0, 30.0, 300.0]))
    return jobs, cluster, pause, skipped, len(frame)


def check_result(jobs, res) -> None:
    """End-of-run checks on top of the engine's own (which already ran)."""
    assert len(res.records) == len(jobs)
    for j, r in zip(jobs, res.records):
        assert r.finish_s is not None and r.start_s is not None
        assert j.submit_time_s <= r.start_s <= r.finish_s
        if not r.early_exit:
            assert r.steps_trained == pytest.approx(j.total_steps, rel=1e-6, abs=1e-3)
        else:
            assert 0 <= r.steps_trained <= j.total_steps * (1 + 1e-6)
    times = [row[0] for row in res.timeline]
    assert times == sorted(times)
    assert all(0 <= row[4] for row in res.timeline)  # GPUs allocated never negative
    assert res.timeline[-1][4] == 0 and res.timeline[-1][1] == 0


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=40)
@given(scenario=scenarios())
def test_random_workloads_keep_every_invariant(name, scenario, reliability):
    jobs, cluster, pause, skipped, _ = scenario
    assume(jobs)
    res = Engine(jobs, cluster, CM, make_policy(name), regroup_pause_s=pause).run()  # invariants on
    check_result(jobs, res)
    if name == "independent":
        for j, r in zip(jobs, res.records):
            assert r.finish_s - j.submit_time_s >= j.isolated_runtime_s * (1 - 1e-9)
    reliability("invariant_cases")


@settings(max_examples=25)
@given(scenario=scenarios(), name=st.sampled_from(POLICIES))
def test_same_inputs_same_simulation(scenario, name, reliability):
    jobs, cluster, pause, _, _ = scenario
    assume(jobs)
    a = Engine(jobs, cluster, CM, make_policy(name), regroup_pause_s=pause).run()
    b = Engine(jobs, cluster, CM, make_policy(name), regroup_pause_s=pause, check_invariants=False).run()
    assert a.records == b.records and a.timeline == b.timeline
    assert a.gpu_seconds_held == b.gpu_seconds_held
    reliability("invariant_cases")


@settings(max_examples=30)
@given(scenario=scenarios(sweeps=False), name=st.sampled_from(["mlora", "tlora", "lorafusion", "lookahead"]))
def test_grouping_policies_use_no_more_gpu_seconds_than_runs_alone_would_need(scenario, name):
    """GPU-seconds held are at least the work's minimum: every group holds its GPUs while it trains."""
    jobs, cluster, pause, _, _ = scenario
    assume(jobs)
    res = Engine(jobs, cluster, CM, make_policy(name), regroup_pause_s=pause).run()
    makespan = max(r.finish_s for r in res.records) - min(j.submit_time_s for j in jobs)
    assert 0 < res.gpu_seconds_held <= cluster.total_gpus * makespan * (1 + 1e-9)


@settings(max_examples=30)
@given(scenario=scenarios(sweeps=False))
def test_skips_are_counted_never_silent(scenario):
    jobs, cluster, _, skipped, rows = scenario
    assert len(jobs) + sum(skipped.values()) == rows
    for j in jobs:
        assert j.num_gpus <= cluster.total_gpus
    assert set(skipped) <= {"oversized", "memory"}
    assert all(v > 0 for v in skipped.values())
