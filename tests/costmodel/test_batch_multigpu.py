"""The vectorised planner bound (``tlora_sim.sim.costmodel.profiled.multigpu``) gives, per plan family, the
scalar ``plan_step`` times of the profiled multi-GPU model, and never exceeds the planner's step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlora_sim.sim.costmodel.profiled.formula import MAX_SEQ_LENS, REL_MARGIN
from tlora_sim.sim.costmodel.profiled.multigpu import PlannerBatch, collective_ms_rows, lpt_gpus
from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import Parallelism, candidates, per_gpu_mixes
from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
from tlora_sim.sim.costmodel.profiled.multigpu import best_plan, plan_step
from tlora_sim.sim.costmodel.roofline import RooflineCostModel

SEQS = [128, 512, 1000, 2048, 3000, 4096, 8192, 20000]  # measured lengths, between them and beyond them
NANOS = (1, 2, 3, 8, 29)
TOLERANCE = 0.0  # the batch is the scalar formula on arrays: bit for bit (callers act only beyond REL_MARGIN)


def _group(rng, most=16):
    return [Member(int(rng.integers(1, 257)), int(rng.integers(1, 65)), int(rng.choice(SEQS)))
            for _ in range(int(rng.integers(1, most + 1)))]


def _scalar(cm, model, gpu, members, n, nano):
    """``plan_step`` times of every plan the planner may weigh: (the non-local ones by plan, local or inf)."""
    m, ms = get_model(model), tuple(sorted(members))
    plans = dict.fromkeys(candidates(m, n, len(ms), False) + candidates(m, n, len(ms), True))
    t = {p: plan_step(cm.artifact, cm.key, model, gpu, ms, p, "fused", nano, 1, True, memory=False)[0] for p in plans}
    local = [s for p, s in t.items() if p.kind == "local"]
    assert bool(local) == (len(ms) >= 2)
    return {p: s for p, s in t.items() if p.kind != "local"}, (local[0] if local else np.inf)


def _rel(got, want):
    """0 where equal bit for bit, else their relative difference (at least the smallest float)."""
    if got == want:
        return 0.0
    return max(abs(got / want - 1), 5e-324) if np.isfinite(want) else np.inf


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_each_part_equals_plan_step_and_the_bound_is_below_the_planner(gpu):
    cm = default_cost_model(gpu)
    rng = np.random.default_rng(11)
    worst, attained, total = 0.0, 0, 0
    for model in [x for x in ("llama3-8b", "qwen2.5-32b", "llama3-70b") if x in cm.artifact["models"]]:
        for n in (2, 4, 8, 16):
            pb = PlannerBatch.of(cm, model, gpu, n)
            groups = [_group(rng) for _ in range(5)]
            rows = np.array([pb.row(g) for g in groups])
            assert rows.shape == (len(groups), pb.WIDTH)
            for nano in NANOS:
                each, st_ = pb.plan_times(rows, nano), pb.step_times(rows, nano)
                lo, lb = pb.local_step_times(groups, nano), pb.lower_bound_s(rows, groups, nano)
                for i, g in enumerate(groups):
                    want, want_local = _scalar(cm, model, gpu, g, n, nano)
                    assert set(want) == set(pb.plans)
                    worst = max(worst, _rel(lo[i], want_local), _rel(st_[i], min(want.values())),
                                *(_rel(each[j, i], want[p]) for j, p in enumerate(pb.plans)))
                    assert lb[i] == min(st_[i], lo[i])
                    planner = best_plan(cm.key, model, gpu, tuple(sorted(g)), n, "fused", nano, 1, True)[1]
                    assert lb[i] <= planner * (1 + TOLERANCE)
                    attained += lb[i] >= planner * (1 - TOLERANCE)
                    total += 1
    assert worst == TOLERANCE < REL_MARGIN
    assert 0 < attained < total  # where the fastest plan fits memory the bound is the planner's step


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_merged_rows_are_the_rows_of_the_union(gpu):
    cm = default_cost_model(gpu)
    rng = np.random.default_rng(5)
    for n in (2, 8, 16):
        pb = PlannerBatch.of(cm, "llama3-8b", gpu, n)
        a, bs = _group(rng, 8), [_group(rng, 8) for _ in range(6)]
        merged = PlannerBatch.merge(pb.row(a), np.array([pb.row(b) for b in bs]))  # (W,) with (P, W)
        union = np.array([pb.row(a + b) for b in bs])
        assert np.array_equal(merged, union)
        nanos = rng.choice(NANOS, len(bs))
        got, want = pb.step_times(merged, nanos), pb.step_times(union, nanos)
        assert np.array_equal(got, want)
        for b, k, t in zip(bs, nanos, got):
            assert t == min(_scalar(cm, "llama3-8b", gpu, a + b, n, int(k))[0].values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 256), st.integers(1, 64), st.sampled_from(SEQS)), min_size=1, max_size=16),
       st.sampled_from([2, 3, 4, 6, 8, 12, 16]), st.integers(1, 32))
def test_the_bound_matches_plan_step_on_any_mix(mix, n, nano):
    cm = default_cost_model("H100")
    members = [Member(*x) for x in mix]
    pb = PlannerBatch.of(cm, "qwen3-8b", "H100", n)
    want, want_local = _scalar(cm, "qwen3-8b", "H100", members, n, nano)
    got = pb.plan_times(pb.row(members)[None, :], nano)[:, 0]
    got_local = float(pb.local_step_times([members], np.array([nano]))[0])
    assert [float(t) for t in got] == [want[p] for p in pb.plans]
    assert got_local == want_local


def test_collectives_equal_the_scalar_curves():
    cm = default_cost_model("H200")
    pb = PlannerBatch.of(cm, "llama3-8b", "H200", 16)
    coll, net = pb._coll, pb._net
    sizes = np.geomspace(1.0, 1e11, 89)  # below, inside and beyond the measured sizes
    for n in (1, 2, 3, 8, 16):
        for cap in (None, net):
            got = collective_ms_rows(pb._curve, sizes, np.full(len(sizes), float(n)),
                                 np.full(len(sizes), np.inf if cap is None else cap))
            want = np.array([coll.time_ms("all_reduce", float(b), n, cap)[0] for b in sizes])
            assert np.array_equal(got, want)


def test_the_local_placement_is_per_gpu_mixes():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.choice([2, 3, 4, 8, 16]))
        members = [Member(int(rng.choice([8, 16, 64])), int(rng.choice([1, 2, 4])), int(rng.choice([512, 1024, 2048])))
                   for _ in range(int(rng.integers(2, 3 * n)))]  # ties and more members than GPUs
        gpus = lpt_gpus(members, n)
        mine = sorted(sorted((x.rank, float(x.batch_size), x.seq_len) for x, g in zip(members, gpus) if g == k)
                      for k in set(gpus))
        theirs = sorted(sorted(mix) for mix in per_gpu_mixes(members, Parallelism("local", n), 1))
        assert mine == theirs


def test_edges_empty_inputs_single_members_and_too_many_lengths():
    cm = default_cost_model("H100")
    pb = PlannerBatch.of(cm, "llama3-8b", "H100", 4)
    assert pb.step_times(np.zeros((0, pb.WIDTH)), 2).shape == (0,)
    assert pb.local_step_times([], 2).shape == (0,)
    solo = [Member(16, 8, 1024)]
    assert pb.local_step_times([solo], 3)[0] == np.inf  # no local plan for one adapter
    assert pb.lower_bound_s(pb.row(solo), [solo], 3)[0] == pb.step_times(pb.row(solo), 3)[0]
    many = [Member(8, 2, 100 + s) for s in range(MAX_SEQ_LENS + 1)]
    assert pb.row(many) is None  # one sequence length too many for the columns
    got = pb.local_step_times([many], 5)[0]  # answered by the scalar model
    assert got == _scalar(cm, "llama3-8b", "H100", many, 4, 5)[1]
    assert [p.name for p in pb.plans] == ["dp4", "fsdp4", "tp2-dp2", "tp4", "pp2-dp2", "pp4"]


def test_the_batch_declines_what_it_cannot_describe():
    cm = default_cost_model("H100")
    assert PlannerBatch.of(cm, "llama3-8b", "H100", 1) is None  # one GPU: FusedBatch
    assert PlannerBatch.of(RooflineCostModel(), "llama3-8b", "H100", 8) is None
    assert PlannerBatch.of(cm, "llama3-8b", "A100", 8) is None  # the artifact has no tables for that GPU
    assert PlannerBatch.of(cm, "llama3-8b", "H200", 8) is None  # another GPU's artifact
    art = copy.deepcopy(cm.artifact)
    art.pop("_sha256")  # its own key: the shipped artifact's stays untouched
    art["models"]["llama3-8b"]["plans"]["fused"]["correction"] = {"points": [], "log_ratio": [], "scale": [1, 1, 1],
                                                                  "prior": 1.0}
    corrected = ProfiledCostModel(art)
    assert PlannerBatch.of(corrected, "llama3-8b", "H100", 8) is None
    assert PlannerBatch.of(corrected, "llama3-70b", "H100", 8) is not None
