"""The planner's shortcuts (``multigpu.best_plan``: ``fsdp`` and plans whose step without
the layer times already exceeds a fitting ``dp`` are not timed; ``plan_step``'s ``above``) give
the plain planner's answer bit for bit: every plan timed without a shared cache, the fastest that
fits memory (ties in candidate order), pipeline plans where none fits, else the least memory."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import Parallelism, candidates
from tlora_sim.sim.costmodel.profiled.tables import tables_of
from tlora_sim.sim.costmodel.profiled.multigpu import best_plan, plan_memory, plan_step

MODELS = ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b")
PLANS = ("fused", "loop", "lorafusion", "grouped", "alone")
SEQS = (128, 512, 1000, 2048, 4096, 8192, 20000)

members_st = st.lists(st.builds(Member, st.integers(1, 256), st.integers(1, 64), st.sampled_from(SEQS)),
                      min_size=1, max_size=12).map(lambda ms: tuple(sorted(ms)))
question_st = st.tuples(st.sampled_from(("H100", "H200")), st.sampled_from(MODELS), members_st,
                        st.sampled_from((2, 4, 8, 16, 32)), st.sampled_from(PLANS), st.sampled_from((1, 2, 3, 8, 29)),
                        st.sampled_from((1, 2, 4)), st.booleans())


def _plain(cm, model, gpu, members, n, plan, nano, micro, ckpt):
    """The planner without shortcuts: every candidate timed on its own (no shared cache)."""
    art, cap = cm.artifact, GPUS[gpu].memory_bytes
    tried = []

    def mem(t):
        if t[3] is None:
            t[3] = plan_memory(art, cm.key, model, gpu, members, t[0], micro, ckpt)
        return t[3]

    for pipeline in (False, True):
        for par in candidates(get_model(model), n, len(members), pipeline):
            if pipeline == (par.kind == "pp"):
                s, r, _ = plan_step(art, cm.key, model, gpu, members, par, plan, nano, micro, ckpt, memory=False)
                tried.append([par, s, r, None])
        for t in sorted(tried, key=lambda t: t[1]):
            if mem(t) <= cap:
                return tuple(t)
    return tuple(min(tried, key=mem))


def _same(got, want):
    assert got[0] == want[0] and got[2] == want[2]
    assert got[1].hex() == want[1].hex() and float(got[3]).hex() == float(want[3]).hex()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(question_st)
def test_best_plan_is_the_plain_planner(q):
    gpu, model, members, n, plan, nano, micro, ckpt = q
    cm = default_cost_model(gpu)
    got = best_plan(cm.key, model, gpu, members, n, plan, nano, micro, ckpt)
    _same(got, _plain(cm, model, gpu, members, n, plan, nano, micro, ckpt))


def test_the_shortcuts_are_taken_and_memory_decides_too():
    """The plain planner's answers include plans other than dp, and memory-bound questions (70B on
    two GPUs: no dp fits), so the comparison above covers both branches."""
    cm = default_cost_model("H100")
    ms = (Member(16, 8, 4096), Member(64, 16, 2048))
    for model, n, kinds in (("llama3-8b", 8, {"dp"}), ("llama3-70b", 2, {"fsdp", "pp", "tp"})):
        got = best_plan(cm.key, model, "H100", ms, n, "fused", 4, 1, True)
        _same(got, _plain(cm, model, "H100", ms, n, "fused", 4, 1, True))
        assert got[0].kind in kinds


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(question_st, st.sampled_from((0.0, 0.5, 0.9, 0.999, 1.0, 1.001, 2.0)))
def test_above_returns_none_only_for_a_slower_plan(q, f):
    gpu, model, members, n, plan, nano, micro, ckpt = q
    cm = default_cost_model(gpu)
    m = get_model(model)
    for par in candidates(m, n, len(members), True):
        want = plan_step(cm.artifact, cm.key, model, gpu, members, par, plan, nano, micro, ckpt, memory=False)
        above = want[0] * f
        got = plan_step(cm.artifact, cm.key, model, gpu, members, par, plan, nano, micro, ckpt, memory=False,
                        memo={}, above=above)
        if got is None:
            assert want[0] > above
        else:
            assert got[0].hex() == want[0].hex() and got[1] == want[1] and math.isnan(got[2])
        if f == 1.0:
            assert got is not None  # a plan is never dropped against its own step


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(question_st)
def test_fsdp_is_never_faster_than_dp(q):
    gpu, model, members, n, plan, nano, micro, ckpt = q
    cm = default_cost_model(gpu)
    dp, fsdp = (plan_step(cm.artifact, cm.key, model, gpu, members, Parallelism(k, n), plan, nano, micro, ckpt,
                          memory=False)[0] for k in ("dp", "fsdp"))
    assert fsdp >= dp


@pytest.mark.parametrize("model", MODELS)
def test_head_peak_memo_is_the_plain_value(model):
    cm = default_cost_model("H100")
    tab = tables_of(cm.key, model)
    for t in (1.0, 100.0, 3000.0, 4096.0, 65536.0, 1e6, 7.5):
        assert tab.head_peak(t) == tab._head_peak(t) == tab.head_peak(t)
