"""tLoRA's tick path (issue 20, session 16): each shortcut decides exactly what the plain
computation decides.

* ``Tuners.defer_steady`` (``policies/tlora/tune.py``): a group whose tuner would only observe its unchanged step time
  steadily until its next re-probe is not visited on those ticks; its observations are applied
  when it changes or the re-probe falls due. Whole simulations with and without it give identical
  job records and timelines, and every tuner, read with its pending observations applied, is in the
  same state after every tick.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from conftest import run_engine
from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig
from tlora_sim.policies.tlora.tune import Tuners
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload


def tuner_state(t: NanoBatchTuner) -> tuple:
    """Everything a tuner's later answers depend on."""
    return (t.n, t.best_n, t.best_time_s, t._since_probe, t._down_next, sorted(t._seen.items()))


class Logged(Tuners):
    """Tuners logging, after every tick, each live tuner's state with its deferred observations
    applied (on copies: the run itself is not touched)."""

    def __init__(self, plan, bound_of, defer: bool):
        super().__init__(plan, bound_of)
        self.defer_steady = defer
        self.log: list[tuple] = []
        self.skipped = 0

    def step(self, snap, tick, changed, skip, live, kind_of):
        before = self.tick_no
        out = super().step(snap, tick, changed, skip, live, kind_of)
        if self.tick_no != before:
            state = {}
            for gid, (tuner, _, members) in self.of.items():
                t = copy_tuner(tuner)
                if gid in self.deferred:
                    t0, until, step_s = self.deferred[gid]
                    if min(self.tick_no, until) > t0:
                        t._seen[t.n], t.best_time_s = step_s, step_s
                        t._since_probe += min(self.tick_no, until) - t0
                    self.skipped += 0 < self.tick_no - t0 <= until - t0
                state[gid] = (tuple(j.index for j in members), tuner_state(t))
            self.log.append((snap.now_s, state, [(a.group_id, a.nano_batches) for a in out]))
        return out


def logged(cfg: TLoRAConfig, defer: bool) -> TLoRA:
    """``TLoRA`` whose tuners are ``Logged`` (``defer``: ``defer_steady``)."""
    pol = TLoRA(cfg)
    pol.tuners = Logged(pol.plan, pol.job_bound_s, defer)
    return pol


@pytest.mark.parametrize("rules", [("urgency", "residual"), ("srpt", "throughput")])  # tlora, lookahead
@pytest.mark.parametrize("trace, spec, cost_model", [
    ("synthetic:jobs=500,seed=3,load=0.6,gpus=32", "4x8xH100", "profiled"),
    ("synthetic:jobs=400,seed=8,load=1.1,gpus=32", "4x8xH100", "roofline"),
])
def test_deferred_steady_ticks_decide_as_visiting_every_group(trace, spec, cost_model, rules, reliability):
    jobs, _, model, *_ = load_workload(ReplayConfig(trace=trace, policy="tlora", cluster=spec, seed=0,
                                                    cost_model=cost_model))
    cfg = TLoRAConfig(regroup_pause_s=0.0, tick_s=120.0, ordering=rules[0], join_rule=rules[1])
    fast, plain = logged(cfg, True), logged(cfg, False)
    a = run_engine(jobs, fast, spec, cost_model=model, check=False)
    b = run_engine(jobs, plain, spec, cost_model=model, check=False)
    assert fast.tuners.skipped > 100, "groups must sit out ticks"
    assert plain.tuners.skipped == 0 and not plain.tuners.deferred
    assert any(acts for _, _, acts in plain.tuners.log), "the tuner must change counts"
    assert fast.tuners.log == plain.tuners.log
    assert [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in b.records]
    assert a.timeline == b.timeline
    reliability("determinism_cases", 1)


def copy_tuner(t: NanoBatchTuner) -> NanoBatchTuner:
    """An independent copy of ``t``."""
    c = NanoBatchTuner(**{f: getattr(t, f) for f in ("threshold", "step", "max_n", "reprobe_every", "n", "best_n",
                                                     "best_time_s")})
    c._since_probe, c._down_next, c._seen = t._since_probe, t._down_next, dict(t._seen)
    return c


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 40), st.sampled_from([0.0, 0.01, 0.2, -0.05]), st.integers(1, 9),
       st.lists(st.sampled_from([1.0, 0.97, 0.5, 2.0, float("inf"), float("nan")]), min_size=1, max_size=8))
def test_quiet_ticks_count_the_steady_observations(n0, threshold, every, times):
    """After any history of observations, ``Tuners.quiet_ticks`` is exactly the number of following
    observations of the last step time that ``steady`` takes while the count stays the one the
    group runs (the ticks a deferred group sits out), and ``Tuners.wake`` leaves the tuner as they do."""
    tuner = NanoBatchTuner(threshold=threshold, reprobe_every=every, n=n0, best_n=n0)
    for t in times:
        tuner.observe(t)
    step_s, nano = times[-1], tuner.n
    k = Tuners.quiet_ticks(tuner, step_s, nano)
    probe = copy_tuner(tuner)
    taken = 0
    while probe.steady(step_s) and (probe.best_n if probe.best_time_s < float("inf") else nano) == nano:
        taken += 1
    assert k == taken
    for j in range(k + 1):  # woken after j of the k ticks
        pol = Tuners("fused", lambda job: 1.0)
        woken = copy_tuner(tuner)
        pol.of, pol.deferred = {7: (woken, 0.0, ())}, {7: (3, 3 + k, step_s)}
        pol.wake(7, 3 + j)
        want = copy_tuner(tuner)
        for _ in range(j):
            assert want.steady(step_s)
        assert tuner_state(woken) == tuner_state(want) and 7 not in pol.deferred

