"""The profiled step formula is one implementation (``tlora_sim.sim.costmodel.profiled.formula``):
the vectorised rows give, element by element, what one-row calls and the scalar model give, bit
for bit; and the scalar answers are the ones main's code gave before the formula was made one
(a small table of golden values: a regression guard)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.profiled.formula import FusedBatch, layer_formula, layer_ms, mix_features, seq_groups
from tlora_sim.sim.costmodel.profiled.tables import libm, piecewise, tables_of

# Step times (s, as float.hex) of main's code at 77808bb, before the formula was made one: for each
# row (GPU, MODEL, MIX, N, PLAN, NANO), in a checkout of that commit (its installed package, no
# PYTHONPATH),
#   python -c "from tlora_sim.sim.costmodel.factory import default_cost_model as d; \
#     from tlora_sim.sim.costmodel.interface import Member as M; \
#     print(d(GPU).step_time_s(MODEL, GPU, tuple(M(*x) for x in MIX), N, PLAN, NANO).hex())"
GOLDEN = [
    ("H100", "llama3-8b", ((16, 4, 1024),), 1, "fused", 1, "0x1.50fd0c80bc969p-2"),
    ("H100", "llama3-8b", ((8, 2, 512), (16, 4, 1024), (64, 1, 2048)), 1, "fused", 1, "0x1.2599d98f808f4p-1"),
    ("H100", "llama3-8b", ((8, 2, 512), (16, 4, 1024), (64, 1, 2048)), 1, "fused", 3, "0x1.32166700caf53p-1"),
    ("H100", "qwen3-8b", ((4, 1, 300), (32, 8, 700)), 1, "fused", 2, "0x1.f86b292e945abp-2"),
    ("H100", "llama3-8b", ((8, 2, 512), (16, 4, 1024)), 1, "loop", 1, "0x1.ea2364a7b3656p-2"),
    ("H100", "llama3-8b", ((8, 64, 4096),), 1, "alone", 1, "0x1.82aca372fa383p+4"),
    ("H100", "qwen2.5-32b", ((8, 2, 512), (128, 16, 2048)), 1, "lorafusion", 1, "0x1.3a7f867dffc2cp+4"),
    ("H100", "llama3-70b", ((16, 8, 1024), (32, 8, 2048)), 8, "fused", 1, "0x1.21c68c726dccbp+1"),
    ("H100", "llama3-8b", ((16, 8, 1024), (32, 3, 512), (8, 1, 4096)), 4, "fused", 2, "0x1.14846612c6604p-1"),
    ("H200", "llama3-8b", ((8, 2, 512), (16, 4, 1024), (64, 1, 2048)), 1, "fused", 1, "0x1.18ccf27a2a583p-1"),
    ("H200", "qwen3-8b", ((8, 1, 96), (16, 300, 512)), 1, "fused", 4, "0x1.56548ff1ceeffp+3"),
    ("H200", "llama3-70b", ((16, 8, 1024), (32, 8, 2048)), 16, "fused", 1, "0x1.18a9de0e5108ep+0"),
]

# Peak memory per GPU (bytes, float.hex) and the planner's plan, the same way:
#   cm = d(GPU); ms = tuple(M(*x) for x in MIX)
#   print(float(cm.memory_bytes(MODEL, GPU, ms, N, PLAN, MICRO)).hex(), cm.parallelism(MODEL, GPU, ms, N, PLAN))
GOLDEN_MEMORY = [
    ("H100", "llama3-8b", ((8, 2, 512), (16, 4, 1024), (64, 1, 2048)), 1, "fused", 1, "0x1.11d1a6c987853p+35", "dp1"),
    ("H100", "llama3-70b", ((16, 8, 1024), (32, 8, 2048)), 8, "fused", 1, "0x1.3a28285150d0ap+36", "tp4-dp2"),
    ("H200", "qwen2.5-32b", ((8, 64, 4096),), 2, "alone", 2, "0x1.b70780b33f4ccp+37", "fsdp2"),
    ("H100", "llama3-70b", ((16, 8, 1024), (32, 8, 2048)), 2, "fused", 1, "0x1.ced87c854342ap+36", "fsdp2"),
]

RANKS = [1, 4, 8, 16, 32, 64, 128, 256, 300]
SEQS = [64, 96, 300, 512, 700, 1024, 2048, 3000, 4096, 8192]  # measured lengths, between and beyond
MIX = st.lists(st.tuples(st.sampled_from(RANKS), st.integers(1, 300), st.sampled_from(SEQS)), min_size=1, max_size=8)


@pytest.mark.parametrize("gpu, model, mix, n, plan, nano, want", GOLDEN)
def test_step_times_are_mains(gpu, model, mix, n, plan, nano, want):
    cm = default_cost_model(gpu)
    got = cm.step_time_s(model, gpu, tuple(Member(*x) for x in mix), n, plan, nano)
    assert got.hex() == want


@pytest.mark.parametrize("gpu, model, mix, n, plan, micro, want, par", GOLDEN_MEMORY)
def test_memory_and_plans_are_mains(gpu, model, mix, n, plan, micro, want, par):
    cm = default_cost_model(gpu)
    ms = tuple(Member(*x) for x in mix)
    assert float(cm.memory_bytes(model, gpu, ms, n, plan, micro)).hex() == want
    assert cm.parallelism(model, gpu, ms, n, plan) == par


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(MIX, st.integers(1, 9)), min_size=1, max_size=12), st.sampled_from(["H100", "H200"]),
       st.sampled_from(["llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"]))
def test_rows_equal_one_row_calls_and_the_scalar_model(groups, gpu, model):
    cm = default_cost_model(gpu)
    fb = FusedBatch.of(cm, model, gpu, 1)
    members = [tuple(sorted(Member(*x) for x in mix)) for mix, _ in groups]
    rows = [fb.row(m) for m in members]
    if any(r is None for r in rows):
        return  # more sequence lengths than the columns hold: the batch declines (tested elsewhere)
    rows, nano = np.array(rows), np.array([k for _, k in groups], float)
    together = fb.step_times(rows, nano)  # rows not asked before are evaluated together
    # a fresh batch (no answers kept) asked one row at a time, with the nano count as a float
    one = FusedBatch.of(cm, model, gpu, 1)
    for m in members:
        one.row(m)  # number the sequence lengths in the same order
    alone = [float(one.step_times(r[None, :], float(k))[0]) for r, k in zip(rows, nano)]
    scalar = [cm.step_time_s(model, gpu, m, 1, "fused", int(k)) for m, k in zip(members, nano)]
    assert together.tolist() == alone == scalar


@settings(max_examples=60, deadline=None)
@given(st.lists(MIX, min_size=1, max_size=10), st.sampled_from(["H100", "H200"]),
       st.sampled_from(["loop", "fused", "lorafusion", "grouped"]), st.integers(1, 6), st.sampled_from([1.0, 0.5, 0.25]),
       st.sampled_from([1.0, 1.37]))
def test_the_layer_formula_on_arrays_is_the_formula_on_floats(mixes, gpu, plan, nano, gpu_scale, host_scale):
    """Every plan family (their p of 4, 8, 16 and 64: the power path and the max path): the
    formula over arrays of mixes' features equals ``layer_ms`` of each mix."""
    cm = default_cost_model(gpu)
    model = "qwen3-8b"
    tab, pe = tables_of(cm.key, model), cm.artifact["models"][model]["plans"][plan]
    pe = {k: v for k, v in pe.items() if k != "coverage"}
    feats = [mix_features(m) for m in mixes]
    cols = {k: np.array([f[k] for f in feats]) for k in feats[0]}
    T = cols["tokens"]
    at = np.array([sum(tab.attn_values(s, b) for s, b in sorted(seq_groups(m).items())) for m in mixes])
    groups = np.array([len(seq_groups(m)) for m in mixes])
    N = np.full(len(mixes), float(nano))
    got = layer_formula(pe, cols, tab.l0g_ms(T / N), at, groups, N, True, plan, gpu_scale, host_scale)
    want = [layer_ms(tab, pe, m, nano, plan=plan, gpu_scale=gpu_scale, host_scale=host_scale)[0] for m in mixes]
    assert got.tolist() == want


def test_the_c_library_helpers_and_piecewise_agree_with_floats():
    rng = np.random.default_rng(1)
    x = np.exp(rng.uniform(-5, 20, 2000))
    assert libm(math.log, x).tolist() == [math.log(v) for v in x.tolist()]
    assert libm(math.exp, x[:50] / 1e8).tolist() == [math.exp(v) for v in (x[:50] / 1e8).tolist()]
    assert libm(pow, x / x.max(), 8.0).tolist() == [v ** 8.0 for v in (x / x.max()).tolist()]
    cases = [("<", 10.0, lambda t: t * 3.0), (">", 1e6, lambda t: t / 7.0), ("<", 20.0, lambda t: t - 1.0)]
    got = piecewise(x, cases, lambda t: t + 1.0)
    assert got.tolist() == [piecewise(v, cases, lambda t: t + 1.0) for v in x.tolist()]
    tab = tables_of(default_cost_model("H100").key, "llama3-8b")
    t = np.concatenate([np.geomspace(1.0, 1e7, 300), [64.0, 128.0, 1536.0]])
    assert tab.l0g_ms(t).tolist() == [tab.l0g(v)[0] for v in t.tolist()]
    assert tab.head_ms(t).tolist() == [tab.head(v)[0] for v in t.tolist()]
    b = np.geomspace(0.5, 1e5, 200)
    for s in (64, 512, 1000, 4096, 20000):
        assert tab.attn_values(s, b).tolist() == [tab.attg(s, v)[0] for v in b.tolist()]
