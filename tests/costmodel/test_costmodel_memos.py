"""The cost model's answer memos (the model's one memo, ``model.memo_of``, by the query;
``FusedBatch.step_times``, ``PlannerBatch.step_times`` and ``local_step_times`` by their inputs;
``Tables.l0g``, ``Tables.head`` and ``Tables.attn_ms`` by their arguments)
give, bit for bit, what a fresh evaluation gives, whatever was asked before and in whatever
company (rows asked alone, in batches, again, after the memo is cleared)."""

from __future__ import annotations

import numpy as np

from tlora_sim.sim.costmodel.profiled.formula import FusedBatch
from tlora_sim.sim.costmodel.profiled.multigpu import PlannerBatch
from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.interface import Member

RANKS = [4, 8, 16, 64, 256]
BATCHES = [1, 2, 4, 8, 32]
SEQS = [128, 512, 1536, 4096, 8192]


def _groups(rng, count, most=8):
    return [[Member(int(rng.choice(RANKS)), int(rng.choice(BATCHES)), int(rng.choice(SEQS)))
             for _ in range(int(rng.integers(1, most + 1)))] for _ in range(count)]


def test_fused_batch_memo_gives_the_fresh_answers():
    cm = default_cost_model("H100")
    rng = np.random.default_rng(3)
    fb = FusedBatch.of(cm, "llama3-8b", "H100", 1)
    rows = np.array([fb.row(g) for g in _groups(rng, 40)])
    nanos = rng.integers(1, 6, len(rows))
    fresh = fb._step_times(rows, nanos)  # evaluated, nothing kept
    first = fb.step_times(rows[:25], nanos[:25])  # some rows kept
    again = fb.step_times(rows, nanos)  # kept rows answered, the rest evaluated
    assert np.array_equal(first, fresh[:25]) and np.array_equal(again, fresh)
    assert np.array_equal(fb.step_times(rows, nanos), fresh)  # every row kept
    one = np.array([fb.step_times(r, int(k))[0] for r, k in zip(rows, nanos)])
    assert np.array_equal(one, fresh)
    scalar_nano = fb._step_times(rows, 3.0)
    assert np.array_equal(fb.step_times(rows, 3), scalar_nano)
    assert not np.array_equal(fb.step_times(rows, 1), scalar_nano)  # nano is part of the key
    fb._step_memo.clear()
    assert np.array_equal(fb.step_times(rows, nanos), fresh)


def test_planner_batch_memos_give_the_fresh_answers():
    cm = default_cost_model("H100")
    rng = np.random.default_rng(5)
    pb = PlannerBatch.of(cm, "llama3-8b", "H100", 8)
    groups = _groups(rng, 30, most=12)
    rows = np.array([pb.row(g) for g in groups])
    nanos = rng.integers(1, 6, len(rows))
    fresh = pb.plan_times(rows, nanos).min(axis=0)
    assert np.array_equal(pb.step_times(rows[::2], nanos[::2]), fresh[::2])
    assert np.array_equal(pb.step_times(rows, nanos), fresh)
    assert np.array_equal(pb.step_times(rows[3], int(nanos[3])), fresh[3:4])
    lists = [tuple(g) for g in groups]
    fresh_local = pb._local_step_times([g for g in lists if len(g) >= 2],
                                       np.array([float(k) for g, k in zip(lists, nanos) if len(g) >= 2]))
    got = pb.local_step_times(lists[:10], nanos[:10])
    got = np.concatenate([got, pb.local_step_times(lists[10:], nanos[10:])])
    assert np.isinf(got[[len(g) < 2 for g in lists]]).all()  # no local plan for one member
    assert np.array_equal(got[[len(g) >= 2 for g in lists]], fresh_local)
    assert np.array_equal(pb.local_step_times(lists, nanos), got)  # all kept
    multi = [g for g in lists if len(g) >= 2]
    at_two = pb.local_step_times(lists, 2)  # one nano for all: a new key for every list
    assert np.array_equal(at_two[[len(g) >= 2 for g in lists]], pb._local_step_times(multi, np.full(len(multi), 2.0)))

def test_table_memos_give_the_fresh_answers():
    cm = default_cost_model("H100")
    from tlora_sim.sim.costmodel.profiled.tables import Tables, tables_of

    tab = tables_of(cm.key, "llama3-8b")
    fresh = lambda: Tables("llama3-8b", "H100", cm.artifact["models"]["llama3-8b"])  # noqa: E731 no answers kept
    for t in (1.0, 100.0, 3000.5, 1e5, 1e7):
        assert tab.l0g(t) == fresh().l0g(t) == tab.l0g(t)
        assert tab.head(t) == fresh().head(t) == tab.head(t)
    for s in (100, 512, 1000, 4096, 20000):
        for b in (0, 0.5, 1, 3, 64, 1e4):
            for gpu in (False, True):
                assert tab.attn_ms(s, b, gpu) == fresh().attn_ms(s, b, gpu) == tab.attn_ms(s, b, gpu)


def test_the_models_one_memo_gives_the_fresh_answers_and_is_shared():
    """``model.memo_of``: one memo per artifact and memory convention, keyed by the query, shared
    by instances; answers asked through it (in any order, after it is emptied) are the fresh ones."""
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel, memo_of

    cm = default_cost_model("H100")
    other = ProfiledCostModel(cm.artifact)
    assert other.memo is cm.memo is memo_of(cm.key, True)
    assert ProfiledCostModel(cm.artifact, checkpointing=False).memo is not cm.memo
    rng = np.random.default_rng(9)
    qs = [(tuple(g), int(n), plan, int(k)) for g, n, plan, k in zip(
        _groups(rng, 30, 5), rng.choice([1, 2, 8, 16], 30), rng.choice(["fused", "loop", "alone"], 30),
        rng.integers(1, 5, 30))]

    def answers(model, order=qs):
        return [(model.step_time_s("llama3-8b", "H100", g, n, plan, k),
                 model.memory_bytes("llama3-8b", "H100", g, n, plan),
                 model.predict("llama3-8b", "H100", g, n, plan, k)) for g, n, plan, k in order]

    cm.memo.clear()
    fresh = answers(cm)
    assert ("predict", "llama3-8b", "H100", tuple(sorted(qs[0][0])), qs[0][1], qs[0][2], qs[0][3], 1, None) in cm.memo
    counted = other.describe()["predictions"]
    assert answers(other) == fresh  # the same memo: the normalised answers kept
    # ... and each instance still counts the distinct questions asked of it (config.json)
    assert other.describe()["predictions"] == cm.describe()["predictions"] > counted
    cm.memo.clear()
    assert answers(other, qs[::-1]) == fresh[::-1]  # asked in the other order, from nothing


def test_values_memoised_gives_the_fresh_values():
    from tlora_sim.sim.costmodel.profiled.formula import values_memoised
    from tlora_sim.sim.costmodel.profiled.tables import tables_of

    tab = tables_of(default_cost_model("H100").key, "llama3-8b")
    rng = np.random.default_rng(4)
    memos: dict = {tab.l0g_ms: {}, tab.head_ms: {}}  # one memo per function: kept across the rounds
    for _ in range(5):
        t = rng.choice([10.0, 64.0, 700.5, 1536.0, 4096.0, 1e5], 12)
        for fn, memo in memos.items():
            assert values_memoised(memo, t, fn).tolist() == fn(t).tolist() == [fn(float(v)) for v in t]
    assert set(memos[tab.head_ms]) <= {10.0, 64.0, 700.5, 1536.0, 4096.0, 1e5}
    assert values_memoised({}, np.zeros(0), tab.l0g_ms).shape == (0,)
