"""tLoRA's constant per-decision cost (issue 20, session 15): each shortcut decides exactly what the
plain computation decides.

* ``TLoRA.defer_idle``: a decision with an empty queue between ticks returns at once and its changed
  groups are noted with the next decision's; whole simulations with and without it give identical
  job records and timelines.
* ``QueueTable._order_short``: a short queue sorted in Python gives the numpy path's order (ties,
  signed zeros, zero and infinite runtimes and NaN keys fall back to it).
* ``NanoBatchTuner.steady``: where it applies, the tuner ends in the state ``observe`` leaves, and
  ``rules.settle_nano`` would settle on the same count.
* ``KindTable.chk_hi``: a consolidation source refused by every partner while freed GPUs were worth
  1 stays refused, by its unchanged partners, when they are worth 0 (the brute-force reading agrees).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from conftest import make_job, run_engine
from tlora_sim.policies.tlora import queue as tlora_queue
from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig
from tlora_sim.policies.tlora.queue import QueueTable
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload


class Eager(TLoRA):
    """tLoRA noting every decision's changes at once (no idle decision deferred)."""

    defer_idle = False


class Counting(TLoRA):
    """tLoRA counting the idle decisions it deferred."""

    deferred = 0

    def decide(self, snap):
        before = self.index.stamp
        out = super().decide(snap)
        if not out and not snap.queue and self._idle_changed and self.index.stamp == before + 1:
            self.deferred += 1
        return out


@pytest.mark.parametrize("rules", [("urgency", "residual"), ("srpt", "throughput")])  # tlora, lookahead
@pytest.mark.parametrize("trace, spec, cost_model", [
    ("synthetic:jobs=500,seed=3,load=0.6,gpus=32", "4x8xH100", "profiled"),
    ("synthetic:jobs=400,seed=8,load=0.5,gpus=32", "4x8xH100", "roofline"),
])
def test_deferred_idle_decisions_decide_as_noting_every_change(trace, spec, cost_model, rules, reliability):
    jobs, _, model, *_ = load_workload(ReplayConfig(trace=trace, policy="tlora", cluster=spec, seed=0,
                                                    cost_model=cost_model))
    cfg = TLoRAConfig(regroup_pause_s=0.0, tick_s=300.0, ordering=rules[0], join_rule=rules[1])
    fast, eager = Counting(cfg), Eager(cfg)
    a = run_engine(jobs, fast, spec, cost_model=model, check=False)
    b = run_engine(jobs, eager, spec, cost_model=model, check=False)
    assert fast.deferred > 50, "the workload must have idle decisions with changed groups"
    assert sum(r.group_changes for r in b.records) > 0, "groups must change membership"
    assert [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in b.records]
    assert a.timeline == b.timeline
    reliability("determinism_cases", 1)


_VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.5, 100.0, float("inf"), float("nan")]) | st.floats(-1e4, 1e4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VALUES, st.sampled_from([0, 1, 50, 1000]), st.sampled_from([0.0, 0.5, 1.0, float("inf")]),
                          st.sampled_from([1.0, 1.5, 3.0, float("nan")]), st.sampled_from([1, 2, 8])),
                min_size=1, max_size=tlora_queue.SHORT),
       st.sampled_from(["urgency", "srpt", "fifo", "backfill"]), st.sampled_from([0.0, 50.0, 1e4]))
@example([(0.0, 0, 1.0, 1.5, 1), (0.0, 50, 0.0, 1.5, 2)], "urgency", 10.0)
@example([(-0.0, 50, 1.0, 1.5, 1), (0.0, 50, 1.0, 1.5, 1)], "urgency", 0.0)
def test_short_queue_order_is_the_array_order(rows, how, now):
    base = make_job(0)
    jobs = [replace(base, index=i * 7 % 31 + 31 * (i // 31), job_id=f"j{i}", submit_time_s=sub, total_steps=steps,
                    isolated_step_time_s=iso, max_slowdown=sd, num_gpus=g)
            for i, (sub, steps, iso, sd, g) in enumerate(rows)]
    assert len({j.index for j in jobs}) == len(jobs)
    short, long = QueueTable(), QueueTable()
    old = tlora_queue.SHORT
    with np.errstate(divide="ignore", invalid="ignore"):  # zero runtimes (the Python path falls back to numpy)
        got = short.order(tuple(jobs), how, now)
        tlora_queue.SHORT = -1  # the numpy path
        try:
            want = long.order(tuple(jobs), how, now)
        finally:
            tlora_queue.SHORT = old
    assert got.index.tolist() == want.index.tolist()
    assert [got.job(p) for p in range(len(got))] == [want.job(p) for p in range(len(want))]
    assert got.kind.tolist() == want.kind.tolist() and got.shape.tolist() == want.shape.tolist()
    assert got.min_gpus() == min(j.num_gpus for j in jobs)


def _tuner(draw_seen, n, best_n, best, since, down):
    t = NanoBatchTuner(n=n, best_n=best_n, best_time_s=best, _since_probe=since, _down_next=down)
    t._seen = dict(draw_seen)
    return t


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.integers(1, 40), st.floats(0.01, 10.0) | st.just(float("inf")), max_size=5),
       st.integers(1, 40), st.integers(1, 40), st.floats(0.01, 10.0) | st.just(float("inf")),
       st.integers(0, 9), st.booleans(), st.floats(0.01, 10.0) | st.just(float("inf")) | st.just(float("nan")))
@example({}, 5, 5, 1.0, 6, False, 1.0)
@example({5: 1.0}, 5, 5, 1.0, 0, False, 0.995)
def test_steady_is_observe_where_it_applies(seen, n, best_n, best, since, down, t):
    a = _tuner(seen, n, best_n, best, since, down)
    b = copy.deepcopy(a)
    if a.steady(t):
        nxt = b.observe(t)
        assert nxt == b.best_n == a.n and b.has_measured(nxt)  # ``rules.settle_nano`` stops here
        assert a == b or (t != t and repr(a) == repr(b))
    else:
        assert repr(a) == repr(_tuner(seen, n, best_n, best, since, down))


def lowered(cfg: TLoRAConfig) -> TLoRA:
    """tLoRA counting (in ``.lowered``) the consolidation sources whose refusal at a freed value of 1
    stood at 0."""
    pol = TLoRA(cfg)
    pol.lowered = 0
    ix = pol.index
    real = ix.pair_candidates

    def pair_candidates(kind, views, at, freed_value):
        tab = ix.table(kind)
        if not freed_value and len(views) >= 2:
            hi, lo, stamp = tab.chk_hi[at], tab.chk_lo[at], tab.stamp[at]
            pol.lowered += int(((hi > lo) & (stamp <= hi)).sum())
        return real(kind, views, at, freed_value)

    ix.pair_candidates = pair_candidates
    return pol


@pytest.mark.parametrize("trace, spec, cost_model", [
    ("synthetic:jobs=600,seed=5,load=0.9,gpus=64", "8x8xH100", "profiled"),
    ("synthetic:jobs=500,seed=2,load=0.6,gpus=32", "4x8xH100", "roofline"),
])
def test_refusals_at_a_higher_freed_value_stand_at_a_lower_one(trace, spec, cost_model):
    """A source refused by every partner while freed GPUs were worth 1 is not asked again about
    unchanged partners when they are worth 0 (``KindTable.chk_hi``): the same merges as the
    brute-force reading (every pair of every kind on every tick)."""
    from tlora_sim.policies.tlora.reference import TLoRAReference

    jobs, _, model, *_ = load_workload(ReplayConfig(trace=trace, policy="tlora", cluster=spec, seed=0,
                                                    cost_model=cost_model))
    cfg = TLoRAConfig(regroup_pause_s=0.0, tick_s=300.0)
    fast, ref = lowered(cfg), TLoRAReference(cfg)
    a = run_engine(jobs, fast, spec, cost_model=model, check=False)
    b = run_engine(jobs, ref, spec, cost_model=model, check=False)
    assert fast.lowered > 0, "sources refused at freed value 1 must be read at 0"
    assert ref.merges > 0, "the workload must merge groups"
    assert [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in b.records]
    assert a.timeline == b.timeline
