"""Decision statistics (``sim/core/decision_stats.py``): an engine listener with named fields, the
source of ``perf.json``'s ``decision_ms_by_queue``."""

from __future__ import annotations

import pytest

from conftest import CM, cluster, make_job, policy
from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.decision_stats import CPU_ALL, CPU_SAMPLE, DecisionStats, QueueDecade, decade
from tlora_sim.sim.core.engine import Engine


def test_decades_and_the_cpu_sample():
    assert [decade(n) for n in (0, 1, 9, 10, 99, 100, 12345)] == [0, 1, 1, 2, 2, 3, 5]
    st = DecisionStats()
    weights = []
    for _ in range(CPU_ALL + 3 * CPU_SAMPLE):
        w = st.cpu_weight(50)
        weights.append(w)
        st.decided(0.0, 50, 1e-3, 2e-4 if w else None, placed=0)
    assert weights[:CPU_ALL] == [1] * CPU_ALL
    assert weights[CPU_ALL:] == ([CPU_SAMPLE] + [0] * (CPU_SAMPLE - 1)) * 3
    r = st.by_queue[2]
    assert (r.decisions, r.cpu_timed, r.queue_sum) == (CPU_ALL + 3 * CPU_SAMPLE, CPU_ALL + 3, 50 * len(weights))
    # each sampled decision stands for CPU_SAMPLE: the estimate is 2e-4 s per decision
    assert r.cpu_s == pytest.approx(2e-4 * (CPU_ALL + 3 * CPU_SAMPLE))
    assert (r.idle_decisions, r.idle_cpu_timed, r.placed_jobs) == (r.decisions, r.cpu_timed, 0)


def test_a_listening_copy_sees_what_the_engine_counts_and_perf_reads_it():
    jobs = [make_job(i, submit=2.0 * i, steps=400) for i in range(40)]
    mine = DecisionStats()
    eng = Engine(jobs, cluster("1x4xH100"), CM, policy("mlora"), listeners=[mine])
    res = eng.run()
    by_queue = res.decisions_by_queue
    assert by_queue is eng.decision_stats.by_queue and set(by_queue) == set(mine.by_queue)
    for d, r in by_queue.items():  # the same decisions (times differ: the listener is told them)
        m = mine.by_queue[d]
        assert isinstance(r, QueueDecade)
        assert (m.decisions, m.queue_sum, m.cpu_timed, m.idle_decisions, m.placed_jobs) == \
            (r.decisions, r.queue_sum, r.cpu_timed, r.idle_decisions, r.placed_jobs)
    assert sum(r.decisions for r in by_queue.values()) == res.decisions
    assert sum(r.placed_jobs for r in by_queue.values()) == len(jobs)  # mLoRA never preempts
    assert sum(r.wall_s for r in by_queue.values()) == pytest.approx(res.decision_time_s)
    perf = metrics.decisions_by_queue(by_queue)
    assert list(perf) == ["0" if d == 0 else f"{10 ** (d - 1)}-{10 ** d - 1}" for d in sorted(by_queue)]
    for d, row in zip(sorted(by_queue), perf.values()):
        r = by_queue[d]
        assert row["decisions"] == r.decisions and row["placed_jobs"] == r.placed_jobs
        assert row["mean_queue"] == pytest.approx(r.queue_sum / r.decisions)
        assert row["idle_decisions"] == r.idle_decisions and row["cpu_timed"] == r.cpu_timed
