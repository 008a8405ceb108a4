"""tLoRA's queue walk through ``QueueTable`` (issue 20) decides exactly what the plain walk does.

``TLoRA`` with ``index_queue`` orders the queue with array sorts, visits one head per job shape once
GPU admission has closed, and keeps a shape's "no join target" answer across decisions, asking only
the groups that changed since (``TLoRAIndex._still_no_target``). ``Plain`` is ``tlora-ref``
(``policies/tlora/reference.py``): the plain walk of ``rules.walk_queue`` (every head, in order,
every decision) with no answer carried. Whole simulations on contended workloads (queues of 50 to
hundreds of jobs) must give identical job records and timelines under every queue discipline, with
joins from the queue actually happening.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from conftest import run_engine
from tlora_sim.policies.tlora import columns as tlora_column
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig
from tlora_sim.policies.tlora import rules
from tlora_sim.policies.tlora.reference import TLoRAReference
from tlora_sim.policies.tlora.queue import QueueTable, sort_first
from tlora_sim.policies.ordering import order_queue
from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload


class Plain(TLoRAReference):
    """``tlora-ref``, counting the longest queue and the joins from it."""

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        super().__init__(config)
        self.max_queue = 0
        self.joins_from_queue = 0

    def decide(self, snap):
        self.max_queue = max(self.max_queue, len(snap.queue))
        acts = super().decide(snap)
        self.joins_from_queue += sum(1 for a in acts if type(a).__name__ == "AddMembers")
        return acts


@pytest.mark.parametrize("ordering", ["urgency", "srpt", "fifo", "backfill"])
@pytest.mark.slow
@pytest.mark.parametrize("trace, spec, cost_model", [
    ("synthetic:jobs=800,seed=4,load=1.6,gpus=32", "4x8xH100", "profiled"),
    ("synthetic:jobs=700,seed=7,load=1.6,gpus=32", "4x8xH100", "roofline"),
])
def test_indexed_queue_walk_matches_the_plain_walk(trace, spec, cost_model, ordering, reliability, monkeypatch):
    jobs, _, model, *_ = load_workload(ReplayConfig(trace=trace, policy="tlora", cluster=spec, seed=0,
                                                    cost_model=cost_model))
    monkeypatch.setattr(tlora_column, "COLUMN_MIN", 2)  # columns from 2 waiting shapes: used here, not only on long queues
    cfg = TLoRAConfig(regroup_pause_s=0.0, tick_s=300.0, ordering=ordering)
    plain, indexed = Plain(cfg), TLoRA(cfg)
    a = run_engine(jobs, indexed, spec, cost_model=model, check=False)
    b = run_engine(jobs, plain, spec, cost_model=model, check=False)
    assert plain.max_queue >= 50, "the workload must build a long queue"
    ix = indexed.index
    assert ix.shapes_asleep > 0, "shapes whose kind did not change must be left unasked"
    assert ix.shapes_by_member > 0, "shapes refused by every changed group's member answer must be left unasked"
    if cost_model == "profiled":  # the batch cost model columns need (none for the roofline)
        assert ix.columns.made > 0, "changed groups must be screened against every waiting shape at once"
        assert ix.shapes_in_bulk > 0, "shapes must be found without a target all at once"
    assert plain.joins_from_queue > 0, "queued jobs must join running groups"
    assert [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in a.records] == \
           [(r.start_s, r.finish_s, r.max_group_size, r.group_changes) for r in b.records]
    assert a.timeline == b.timeline
    reliability("determinism_cases", 1)


@pytest.mark.parametrize("how", ["urgency", "srpt", "fifo", "backfill"])
def test_queue_table_orders_as_order_queue(how):
    """The array sort gives ``order_queue``'s order (ties broken by job index) at several instants."""
    jobs, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=400,seed=3,load=1.0,gpus=32", policy="tlora",
                                          cluster="4x8xH100", seed=0, cost_model="roofline"))
    table = QueueTable()
    queue = tuple(jobs[::3])
    for now in (0.0, 5_000.0, 1e6):
        got = table.order(queue, how, now)
        assert [got.job(p).index for p in range(len(got))] == [j.index for j in order_queue(queue, how, now)]
        assert got.min_gpus() == min(j.num_gpus for j in queue)




@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 1.5, 2.5, float("nan"), float("inf")]) | st.floats(-1e6, 1e6),
                          st.sampled_from([1.0, 1.5, 3.0])), max_size=40))
@example([(float("nan"), 3.0), (float("nan"), 1.0), (0.0, 1.0)])
def test_sort_first_is_lexsort(rows):
    """The argsort shortcut gives ``lexsort``'s order: ties, signed zeros, NaN and inf included."""
    primary = np.array([r[0] for r in rows], float)
    second = np.array([r[1] for r in rows], float)
    idx = np.arange(len(rows))[::-1].copy()  # a tie-break key that is not the position
    want = np.lexsort((idx, second, primary))
    assert sort_first(primary, lambda: (idx, second, primary)).tolist() == want.tolist()

def test_queue_order_shape_positions_match_a_plain_reading():
    """``first_of_shapes``, ``shape_positions`` and ``next_of_shapes`` (one stable sort of the shape
    ids per decision) answer what a scan of the queue order answers, from every start position and
    with placed jobs skipped."""
    jobs, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=600,seed=5,load=1.0,gpus=32", policy="tlora",
                                          cluster="4x8xH100", seed=0, cost_model="roofline"))
    queue = tuple(jobs[::2])
    got = QueueTable().order(queue, "urgency", 7_000.0)
    shape = [int(x) for x in got.shape]
    n = len(shape)
    assert len(set(shape)) >= 10, "the queue must hold several shapes"
    placed = {got.job(p).index for p in range(0, n, 3)}  # every third position placed
    for start in (0, 1, 7, n // 2, n - 1, n):
        first, ids = got.first_of_shapes(start)
        want = {}
        for p in range(start, n):
            want.setdefault(shape[p], p)
        assert ids.tolist() == sorted(want) and first.tolist() == [want[s] for s in sorted(want)]
        shapes = sorted(set(shape)) + [max(shape) + 1]  # one absent shape id
        nxt = got.next_of_shapes(shapes[::-1], start - 1, placed)
        plain = [(next(p for p in range(start, n) if shape[p] == s and got.job(p).index not in placed), s)
                 for s in shapes[::-1] if any(shape[p] == s and got.job(p).index not in placed for p in range(start, n))]
        assert nxt == plain
    for s in set(shape):
        assert got.shape_positions(s).tolist() == [p for p in range(n) if shape[p] == s]

class Checked(TLoRA):
    """tLoRA that, whenever a carried "no join target" answer is kept, asks the plain rule
    (``rules.residual_target`` over every group of the job's kind) too."""

    def __init__(self, config: TLoRAConfig | None = None) -> None:
        super().__init__(config)
        self.kept = self.wrong = self.kept_by_member = self.kept_in_bulk = 0
        ix = self.index
        still, bulk = ix._still_no_target, ix.columns.bulk_no_target

        def still_no_target(snap, plan, job, can_start, kind, recent, since, jkey, kv, **kw) -> bool:
            kept = still(snap, plan, job, can_start, kind, recent, since, jkey, kv, **kw)
            if kept:
                self.kept += 1
                self.kept_by_member += bool(kw.get("by_member"))
                self.wrong += self.plain_target(snap, plan, job, can_start) is not None
            return kept

        def bulk_no_target(snap, plan, kind, sids):
            got = bulk(snap, plan, kind, sids)
            if got is None:
                return got
            q, first, ids = ix.columns.waiting()
            for s in got[4][got[0] | got[1]].tolist():
                job = q.job(int(first[ids == s][0]))  # the shape's first waiting job
                self.kept_in_bulk += 1
                self.wrong += self.plain_target(snap, plan, job, False) is not None
            return got

        ix._still_no_target, ix.columns.bulk_no_target = still_no_target, bulk_no_target

    def plain_target(self, snap, plan, job, can_start):
        return rules.residual_target(snap, plan.candidates(job), job, can_start, plan=self.plan,
                                     bound_job_s=self.job_bound_s(job), ok=self.merge_ok)


@pytest.mark.parametrize("ordering", ["urgency", "fifo", "backfill"])
@pytest.mark.parametrize("trace, spec, cost_model", [
    ("synthetic:jobs=800,seed=4,load=1.6,gpus=32", "4x8xH100", "profiled"),
    ("synthetic:jobs=700,seed=7,load=1.6,gpus=32", "4x8xH100", "roofline"),
])
def test_a_kept_no_target_answer_is_what_the_full_search_says(trace, spec, cost_model, ordering, monkeypatch):
    """Every time the carried answer is kept (running groups changed since it, groups planned in
    this decision, a join that is undone by a finish before the next decision; asking ``merge_ok``
    or reading only the groups' refusals of the shape's member), the full search finds no target
    either; and both shortcuts are taken often, so this checks something."""
    jobs, _, model, *_ = load_workload(ReplayConfig(trace=trace, policy="tlora", cluster=spec, seed=0,
                                                    cost_model=cost_model))
    monkeypatch.setattr(tlora_column, "COLUMN_MIN", 2)  # the columns' refusals checked too
    pol = Checked(TLoRAConfig(regroup_pause_s=0.0, tick_s=300.0, ordering=ordering))
    run_engine(jobs, pol, spec, cost_model=model, check=False)
    assert pol.kept > 100 and pol.kept_by_member > 10 and pol.wrong == 0
    if cost_model == "profiled":
        assert pol.kept_in_bulk > 10


def test_target_memo_keeps_answers_as_a_dict_would():
    """``TargetMemo`` answers as the (kind, job shape) -> (validity, answer, stamp) dict it replaced:
    "no target" answers in arrays (one at a time or many at once), group answers in a dict, a
    later answer replacing an earlier one of the other sort, validities that are stamps or
    (serial, kind version) pairs."""
    from tlora_sim.policies.tlora.tables import TargetMemo

    memo, plain = TargetMemo(), {}
    keys = [(("m", g), ("member", r, 1.5, False)) for g in (1, 2) for r in range(300)]  # grows past 256 ids
    for n, k in enumerate(keys):
        valid = n if n % 3 else (10**6 + n, n % 5)
        ans = None if n % 2 else f"group {n}"
        memo.put(memo.key(*k), valid, ans, n - 1)
        plain[k] = (valid, ans, n - 1)
    mids = np.array([memo.key(*k) for k in keys[::7]])
    memo.put_none(mids, (123, 4), 77)  # group answers among them become "no target"
    for k in keys[::7]:
        plain[k] = ((123, 4), None, 77)
    memo.put(memo.key(*keys[1]), 5, "group x", 3)  # a "no target" answer replaced by a group
    plain[keys[1]] = (5, "group x", 3)
    assert len(memo) == len(plain)
    assert all(memo.get(memo.key(*k)) == v for k, v in plain.items())
    assert memo.get(memo.key(("m", 9), ("other", 1, 1.0, False))) is None
    assert memo.code(-1) == -1 and memo.decode(memo.code((2**40, 2**21 - 1))) == (2**40, 2**21 - 1)
    with pytest.raises(ValueError):
        memo.code((1, 2**21))
    memo.clear()
    assert len(memo) == 0 and all(memo.get(memo.key(*k)) is None for k in keys)
