"""The paper policies beyond the first three: LoRAFusion's packing, tLoRA's nano-batch tuner,
ALTO's sweeps and early exit, our ``lookahead``, orderings and the ``-nogroup`` ablations."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from tlora_sim.policies.contract import check_policy
from hypothesis import given
from hypothesis import strategies as st

from conftest import CM, group_view, make_job, policy, reindex, run_engine, snapshot
from tlora_sim.policies.binpack import first_fit_decreasing, milp_pack, pack_micro_batches
from tlora_sim.policies.lorafusion import head_tail_pairs
from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.ordering import order_queue
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import SetExecution, StartGroup, StopMembers
from tlora_sim.traces.sweeps import expand_sweeps, loss_at, parse_sweeps


# ---- LoRAFusion -------------------------------------------------------------------------------------
def test_milp_beats_first_fit_decreasing_where_ffd_is_suboptimal():
    sizes, cap = [5, 5, 4, 4, 3, 3], 12  # FFD: {5,5} {4,4,3} {3}; optimum {5,4,3} {5,4,3}
    assert len(first_fit_decreasing(sizes, cap)) == 3
    exact = milp_pack(sizes, cap, max_bins=3)
    assert exact is not None and len(exact) == 2
    bins, how = pack_micro_batches(sizes, cap)
    assert how == "milp" and len(bins) == 2
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(sizes[i] for i in b) <= cap for b in bins)


@given(st.lists(st.integers(1, 10), min_size=1, max_size=14), st.integers(10, 20))
def test_packing_is_a_partition_within_capacity_and_no_worse_than_greedy(sizes, cap):
    bins, _ = pack_micro_batches(sizes, cap, time_limit_s=0.5)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= cap for b in bins)
    assert math.ceil(sum(sizes) / cap) <= len(bins) <= len(first_fit_decreasing(sizes, cap))


def test_packing_rejects_an_item_over_capacity():
    with pytest.raises(ValueError, match="capacity"):
        pack_micro_batches([9000], 8192)


def test_head_tail_pairing_pairs_longest_with_shortest():
    jobs = [make_job(i, seq=s) for i, s in enumerate([512, 4096, 1024, 2048, 3072])]
    pairs = head_tail_pairs(jobs)
    assert [[j.seq_len for j in p] for p in pairs] == [[4096, 512], [3072, 1024], [2048]]


def test_lorafusion_groups_the_head_with_its_pair_and_packs_micro_batches():
    jobs = [make_job(i, seq=s, batch=4) for i, s in enumerate([512, 2048, 1024, 4096])]
    acts = policy("lorafusion", group_size=2).decide(snapshot(jobs, free=[1]))
    assert len(acts) == 1 and isinstance(acts[0], StartGroup)
    members = sorted(jobs[i].seq_len for i in acts[0].job_indices)
    assert members == [512, 4096]  # the head (512) pairs with the longest
    # 4 x 512 + 4 x 4096 tokens into 8192-token micro-batches: at least ceil(18432 / 8192) = 3
    assert acts[0].micro_batches == 3 and acts[0].plan == "lorafusion"


def test_lorafusion_nogroup_keeps_fifo_and_runs_jobs_alone():
    jobs = [make_job(i) for i in range(3)]
    acts = policy("lorafusion-nogroup").decide(snapshot(jobs, free=[2]))
    assert [a.job_indices for a in acts] == [(0,), (1,)]


def test_lorafusion_kernel_cost_grows_with_the_largest_rank():
    small = [make_job(0, rank=8).member, make_job(1, rank=16).member]
    big = [make_job(0, rank=8).member, make_job(1, rank=128).member]
    lf = lambda m: CM.step_time_s("llama3-8b", "H100", m, 1, "lorafusion")  # noqa: E731
    fused = lambda m: CM.step_time_s("llama3-8b", "H100", m, 1, "fused")  # noqa: E731
    assert lf(big) / lf(small) > fused(big) / fused(small)
    assert fused(big) < lf(big)


# ---- tLoRA nano-batching ------------------------------------------------------------------------------
def run_tuner(curve, steps=80):
    t = NanoBatchTuner()
    for _ in range(steps):
        t.observe(curve(t.n))
    return t


@pytest.mark.parametrize("best", [1, 5, 9, 13, 21])
def test_tuner_finds_the_best_nano_batch_count_on_a_known_curve(best):
    curve = lambda n: 1.0 + 0.05 * abs(n - best)  # noqa: E731  V-shaped, minimum at ``best``
    t = run_tuner(curve)
    assert t.best_n == best


def test_published_rule_sticks_at_one_where_the_tuner_does_not():
    # step time improves from 1 to 5, then stays flat: the published rule halves back down to 1
    curve = lambda n: 1.0 if n == 1 else 0.8  # noqa: E731
    n = 1
    prev = float("inf")
    for _ in range(20):
        now = curve(n)
        n, prev = (n + 4, now) if now < prev * 0.99 else (max(1, n // 2), now)
    assert n == 1
    assert run_tuner(curve).n > 1


def test_tuner_follows_a_moving_curve_by_reprobing():
    t = NanoBatchTuner()
    for _ in range(40):
        t.observe(1.0 + 0.05 * abs(t.n - 5))
    assert t.best_n == 5
    for _ in range(200):  # the optimum moves to 13 (e.g. members joined)
        t.observe(1.0 + 0.05 * abs(t.n - 13))
    assert t.best_n == 13


def test_tlora_tunes_nano_batches_of_a_running_group_on_ticks():
    jobs = [make_job(i, batch=8, seq=2048) for i in range(4)]
    g = group_view(0, jobs, ((0, 1),))
    pol = policy("tlora")
    acts = pol.decide(snapshot([], groups=[g], now=1000.0))
    sets = [a for a in acts if isinstance(a, SetExecution)]
    # the controller's probes ran (a few steps each) and it settled on the fastest count it found
    assert sets and sets[0].group_id == 0 and sets[0].nano_batches > 1
    members = [j.member for j in jobs]
    t = {n: CM.step_time_s("llama3-8b", "H100", members, 1, "fused", nano_batches=n) for n in (1, 5, 9, 13)}
    chosen = CM.step_time_s("llama3-8b", "H100", members, 1, "fused", nano_batches=sets[0].nano_batches)
    assert chosen < t[1] and chosen <= min(t.values()) * (1 + 1e-9)


def test_tlora_tuner_never_takes_a_member_past_its_bound():
    """A probe whose predicted step time breaks a member's tolerated slowdown is not run."""
    from tlora_sim.policies.nanobatch import NanoBatchTuner
    from tlora_sim.policies.tlora.rules import settle_nano

    jobs = [make_job(i, batch=8, seq=2048, slowdown=1.01) for i in range(4)]
    g = group_view(0, jobs, ((0, 1),))
    pol = policy("tlora", slowdown_reference="eager")
    members = [j.member for j in jobs]
    bound = min(j.max_slowdown * j.isolated_step_time_s for j in jobs)
    tuner = NanoBatchTuner(n=1)
    snap = snapshot([], groups=[g], now=1000.0)
    pol.promise.use_cost_model(snap)
    got = settle_nano(snap, (g.model, g.n_gpus), g.members, tuner, 1, 1, g.step_time_s, plan=pol.plan,
                      bound_of=pol.job_bound_s)
    pred = CM.step_time_s("llama3-8b", "H100", members, 1, "fused", nano_batches=got)
    assert pred <= max(bound, g.step_time_s) * (1 + 1e-9)
    refused = [n for n, t in tuner._seen.items() if t == float("inf")]
    for n in refused:  # each refused probe really would have broken the bound and been slower
        t = CM.step_time_s("llama3-8b", "H100", members, 1, "fused", nano_batches=n)
        assert t > max(bound, g.step_time_s)


# ---- ALTO ---------------------------------------------------------------------------------------------
def test_sweep_expansion_is_seeded_and_keeps_arrival_gpus_duration():
    frame = pd.DataFrame({"job_id": ["a", "b", "c"], "submit_time_s": [0.0, 5.0, 9.0], "duration_s": [100.0] * 3,
                          "num_gpus": [1, 2, 4], "tenant": [""] * 3, "model": ["llama3-8b"] * 3, "rank": [8] * 3,
                          "batch_size": [2] * 3, "seq_len": [1024] * 3, "max_slowdown": [1.5] * 3})
    out = expand_sweeps(frame, np.random.default_rng(0), 1.0, (4,), {4: 0.5, 16: 0.5})
    again = expand_sweeps(frame, np.random.default_rng(0), 1.0, (4,), {4: 0.5, 16: 0.5})
    pd.testing.assert_frame_equal(out, again)
    assert len(out) == 12 and set(out["sweep_id"]) == {"a", "b", "c"}
    for sid, fam in out.groupby("sweep_id"):
        src = frame[frame.job_id == sid].iloc[0]
        assert (fam["submit_time_s"] == src.submit_time_s).all() and (fam["num_gpus"] == src.num_gpus).all()
        assert (fam["duration_s"] == src.duration_s).all() and fam["job_id"].is_unique
    assert out["loss_floor"].min() >= 1.0


def test_loss_model_decays_to_its_floor():
    assert loss_at(1.2, 0, 1000) == pytest.approx(2.5)
    assert loss_at(1.2, 1000, 1000) < loss_at(1.2, 100, 1000) < loss_at(1.2, 10, 1000)
    assert loss_at(1.2, 1e9, 1000) == pytest.approx(1.2, abs=1e-3)


@pytest.mark.parametrize("spec", ["x", "0:4", "1.5:4", "0.3:1", "0.3:a"])
def test_bad_sweep_specs_are_input_errors(spec):
    with pytest.raises(InputError, match="sweeps"):
        parse_sweeps(spec)


def sweep_family(n=4, floors=(1.0, 1.05, 1.4, 1.6), steps=2000):
    jobs = [replace(make_job(i, steps=steps, seq=512, batch=1), sweep_id="s0", loss_floor=f, job_id=f"s0/c{i}")
            for i, f in enumerate(floors[:n])]
    return reindex(jobs)


def test_early_exit_stops_weak_configurations_and_keeps_the_best():
    from tlora_sim.policies.early_exit import EarlyExitConfig, WithEarlyExit

    jobs = sweep_family()
    res = run_engine(jobs, WithEarlyExit(policy("alto"), EarlyExitConfig(tick_s=60.0)), spec="1x8xH100")
    early = {j.loss_floor: r.early_exit for j, r in zip(res.jobs, res.records)}
    assert early[1.0] is False and early[1.4] and early[1.6]
    for j, r in zip(res.jobs, res.records):
        assert r.finish_s is not None
        if r.early_exit:
            assert r.steps_trained < j.total_steps
        else:
            assert r.steps_trained == pytest.approx(j.total_steps)


def test_alto_co_locates_a_family_and_nogroup_does_not():
    jobs = sweep_family()
    acts = policy("alto").decide(snapshot(jobs, free=[1]))
    assert len(acts) == 1 and len(acts[0].job_indices) == 4 and acts[0].plan == "grouped"
    acts = policy("alto-nogroup").decide(snapshot(jobs, free=[2]))
    assert [a.job_indices for a in acts] == [(0,), (1,)]
    assert [a.plan for a in acts] == ["alone", "alone"]  # ALTO runs jobs outside a family alone


def test_alto_runs_a_job_outside_any_family_alone():
    jobs = [replace(j, sweep_id="") for j in sweep_family()[:2]]
    acts = policy("alto").decide(snapshot(jobs, free=[2]))
    assert [(a.job_indices, a.plan) for a in acts] == [((0,), "alone"), ((1,), "alone")]


def test_early_exit_keeps_at_least_keep_configurations():
    from tlora_sim.policies.early_exit import EarlyExitConfig, EarlyExitRule

    jobs = sweep_family(floors=(1.5, 1.6, 1.7, 1.8))
    g = group_view(0, jobs, ((0, 1),), plan="grouped", remaining=[j.total_steps * 0.5 for j in jobs])
    rule = EarlyExitRule(EarlyExitConfig(patience=1, keep=2, gap=0.0))
    acts = rule.stops(snapshot([], groups=[g], now=0.0))
    stopped = [i for a in acts if isinstance(a, StopMembers) for i in a.job_indices]
    assert len(stopped) == 2 and rule.stopped == 2


def test_early_exit_wraps_any_policy_and_reads_noisy_crossing_curves():
    from dataclasses import replace

    from tlora_sim.policies.early_exit import WithEarlyExit
    from tlora_sim.traces.sweeps import loss_at, observed_loss

    # a fast-converging worse configuration leads early; the slow better one wins at the end
    fast, slow = replace(make_job(0), loss_floor=1.3, loss_tau=0.01), replace(make_job(1), loss_floor=1.1, loss_tau=0.08)
    early, late = 10, 100
    assert loss_at(fast.loss_floor, early, 100, fast.loss_tau) < loss_at(slow.loss_floor, early, 100, slow.loss_tau)
    assert loss_at(fast.loss_floor, late, 100, fast.loss_tau) > loss_at(slow.loss_floor, late, 100, slow.loss_tau)
    # observations are noisy but deterministic
    assert observed_loss(fast, 10) == observed_loss(fast, 10) != observed_loss(fast, 11)
    w = WithEarlyExit(policy("tlora"))
    assert w.name == "tlora" and w.plan == "fused" and w.timer_s == 600.0
    assert check_policy(w) == []
# ---- orderings, ours, ablations -------------------------------------------------------------------------
def test_orderings():
    short_late = make_job(0, submit=100.0, steps=10)
    long_early = make_job(1, submit=0.0, steps=10_000)
    q = [long_early, short_late]
    assert [j.index for j in order_queue(q, "fifo", 200.0)] == [1, 0]
    assert [j.index for j in order_queue(q, "srpt", 200.0)] == [0, 1]
    # urgency = waited / isolated runtime: the short job has waited longer relative to its size
    assert [j.index for j in order_queue(q, "urgency", 200.0)] == [0, 1]
    with pytest.raises(InputError, match="order"):
        order_queue(q, "lifo", 0.0)


@pytest.mark.parametrize("n", [2, 30])  # 30 > SHORT: QueueTable's numpy path by default
def test_urgency_orders_jobs_arriving_together_shortest_first_at_the_instant_and_after(n, monkeypatch):
    """Jobs submitted at one instant, the longer ones the more tolerant (larger ``max_slowdown``).
    The engine decides at the instant itself, where every urgency (waited / runtime) is 0; a real
    scheduler decides a little later, where the urgencies order them shortest first. The order
    must be that one at both clocks (the order's limit at wait 0+), in ``order_queue`` and in both
    paths of tLoRA's ``QueueTable`` (Python sort for short queues, numpy for long ones)."""
    from tlora_sim.policies.tlora import queue as tlora_queue

    t0 = 100.0
    jobs = [make_job(i, submit=t0, steps=10 * (n - i) + 5, slowdown=1.1 + 0.1 * (n - i)) for i in range(n)]
    shortest_first = [j.index for j in sorted(jobs, key=lambda j: j.isolated_runtime_s)]
    assert shortest_first == list(range(n))[::-1]  # the longest job is the most tolerant: the keys disagree
    for now in (t0, t0 + 1e-3):
        assert [j.index for j in order_queue(jobs, "urgency", now)] == shortest_first, now
        for short in (tlora_queue.SHORT, -1):  # the default path for this n, then numpy's
            monkeypatch.setattr(tlora_queue, "SHORT", short)
            got = tlora_queue.QueueTable().order(tuple(jobs), "urgency", now)
            assert got.index.tolist() == shortest_first, (now, short)
    # the decision follows: one free GPU, tLoRA's order without grouping starts the shortest job
    acts = policy("tlora-nogroup").decide(snapshot(jobs, free=[1], now=t0))
    assert [a.job_indices for a in acts if isinstance(a, StartGroup)] == [(n - 1,)]


def test_lookahead_runs_the_shortest_job_first():
    jobs = [make_job(0, steps=50_000), make_job(1, steps=10, submit=1.0)]
    acts = policy("lookahead", grouping=False).decide(snapshot(jobs, free=[1], now=2.0))
    assert [a.job_indices for a in acts] == [(1,)]


@pytest.mark.parametrize("name", ["mlora", "tlora", "lorafusion", "alto", "lookahead"])
def test_every_grouping_policy_has_a_nogroup_ablation_that_never_co_locates(name):
    jobs = [make_job(i, batch=1, seq=512, slowdown=4.0) for i in range(6)]
    res = run_engine(jobs, policy(f"{name}-nogroup"), spec="1x2xH100")
    assert all(r.max_group_size == 1 for r in res.records)
    assert policy(f"{name}-nogroup").name == f"{name}-nogroup"


def test_independent_has_no_ablation():
    with pytest.raises(InputError, match="no grouping"):
        policy("independent-nogroup")
