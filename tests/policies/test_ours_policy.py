"""tLoRA's promise against its own kernel, the regroup pause priced in the join test, the
``run_slowdown`` reference, and our ``lookahead`` configuration (issue 40)."""

from __future__ import annotations

import pytest

from conftest import CM, group_view, make_job, policy, run_engine, snapshot
from tlora_sim.sim.core import metrics
from tlora_sim.sim.core.snapshot import AddMembers, StartGroup


def started(actions):
    return [i for a in actions if isinstance(a, StartGroup) for i in a.job_indices]


def fused_alone(j):
    return CM.step_time_s(j.model, "H100", (j.member,), j.num_gpus, "fused")


def pair_between_references():
    """Two small jobs whose fused pair step is within max_slowdown x the eager step but not
    within max_slowdown x the fused-alone step."""
    a, b = make_job(0, rank=4, batch=1, seq=512), make_job(1, rank=4, batch=1, seq=512)
    pair = CM.step_time_s(a.model, "H100", (a.member, b.member), 1, "fused")
    lo, hi = pair / a.isolated_step_time_s, pair / fused_alone(a)
    assert lo < hi  # the fused kernel alone is faster than eager LoRA
    sd = (lo + hi) / 2
    return [make_job(i, rank=4, batch=1, seq=512, slowdown=sd, steps=10**6) for i in range(2)]


def test_the_own_reference_refuses_a_group_the_eager_one_accepts():
    q = pair_between_references()
    snap = snapshot(q, spec="1x1xH100")
    eager = policy("tlora", ordering="fifo", slowdown_reference="eager", regroup_pause_s=0.0).decide(snap)
    assert started(eager) == [0, 1]  # one group of both
    own = policy("tlora", ordering="fifo", regroup_pause_s=0.0).decide(snap)
    assert started(own) == [0]
    assert policy("tlora").job_bound_s  # public: the bound other code reads


def test_the_join_test_prices_the_regroup_pause():
    small = [make_job(10 + i, rank=4, batch=1, seq=512, slowdown=2.0, steps=10**6) for i in range(2)]
    running = group_view(3, small, ((0, 1),))
    short = make_job(0, rank=4, batch=1, seq=512, slowdown=2.0, steps=3)  # a 30 s pause breaks its bound
    long = make_job(0, rank=4, batch=1, seq=512, slowdown=2.0, steps=10**6)
    opts = dict(ordering="fifo", slowdown_reference="eager")
    for job, joins in ((long, True), (short, False)):
        snap = snapshot([job], spec="1x1xH100", groups=[running])
        acts = policy("tlora", **opts).decide(snap)
        assert (acts == [AddMembers(3, (0,))]) is joins
        # not priced (pause 0): both join
        assert policy("tlora", **opts, regroup_pause_s=0.0).decide(snap) == [AddMembers(3, (0,))]


def test_run_slowdown_is_against_the_policys_own_plan():
    jobs = [make_job(i, rank=4, batch=1, seq=512, slowdown=3.0, steps=200) for i in range(3)]
    res = run_engine(jobs, policy("tlora"), spec="1x1xH100")
    df = metrics.jobs_table(res)
    assert (df["max_group_size"] > 1).any()
    ref = [fused_alone(j) for j in jobs]
    ran = df["finish_time_s"] - df["start_time_s"]
    assert df["run_slowdown"].tolist() == pytest.approx((ran / (df["steps_trained"] * ref)).tolist())
    assert df["run_slowdown_eager"].tolist() == pytest.approx(
        (ran / (df["steps_trained"] * [j.isolated_step_time_s for j in jobs])).tolist())
    assert (df["run_slowdown"] > df["run_slowdown_eager"]).all()
    assert metrics.promise_kept(df)["over_max_slowdown"] == 0
    base = metrics.jobs_table(run_engine(jobs, policy("independent"), spec="1x1xH100"))
    assert base["run_slowdown"].tolist() == base["run_slowdown_eager"].tolist()  # eager is its own plan


def test_lookahead_is_a_configuration_of_tlora():
    pol = policy("lookahead")
    assert (pol.order, pol.backfill, pol.config.backfill_order, pol.config.join_rule) == \
        ("srpt-aged", "easy", "sjf", "throughput")
    assert pol.plan == "fused" and pol.reference_plan == "fused"


def test_backfill_order_tries_the_shortest_first():
    # 8 GPUs, 6 held until t=1000 s, the 8-GPU head reserved there; two 2-GPU candidates both end
    # before t=1000 but only one fits the 2 free GPUs: FIFO backfilling takes the earlier (longer)
    # one, shortest-first the shorter, even with FIFO priority order
    running = [make_job(10, gpus=6, steps=100)]
    g = group_view(0, running, ((0, 6),), plan="alone", remaining=[1000.0 / running[0].isolated_step_time_s])
    head = make_job(0, gpus=8, steps=10)
    step = make_job(1, gpus=2).isolated_step_time_s
    longer, shorter = make_job(1, gpus=2, steps=int(500 / step)), make_job(2, gpus=2, steps=int(100 / step))
    snap = snapshot([head, longer, shorter], spec="1x8xH100", groups=[g])
    assert started(policy("tlora", order="fifo", grouping=False, plan_alone="alone").decide(snap)) == [1]
    assert started(policy("lookahead", order="fifo", grouping=False, plan_alone="alone").decide(snap)) == [2]


def test_srpt_aged_puts_a_starved_long_job_first():
    from tlora_sim.policies.ordering import AGING_FACTOR, order_queue

    long = make_job(0, gpus=8, steps=100_000)  # arrived at 0
    run = long.isolated_runtime_s
    before, after = AGING_FACTOR * run * 0.99, AGING_FACTOR * run * 1.01
    short = make_job(1, submit=after, gpus=1, steps=10)  # just arrived
    assert [j.index for j in order_queue([long, short], "srpt", after)] == [1, 0]  # SRPT: never first
    assert [j.index for j in order_queue([long, short], "srpt-aged", before)] == [1, 0]
    assert [j.index for j in order_queue([long, short], "srpt-aged", after)] == [0, 1]  # starved: first
    # both starved: the more urgent first (the short one has waited more runtimes of its own)
    late = after + 1e3 * (AGING_FACTOR + 1) * run
    assert [j.index for j in order_queue([long, short], "srpt-aged", late)] == [1, 0]
    # every starved job goes ahead of the fresh ones, the more urgent first
    t = 3 * AGING_FACTOR * run  # both long jobs starved, the shorter one more urgent
    longer = make_job(2, submit=0.0, gpus=8, steps=150_000)
    fresh = make_job(3, submit=t, gpus=1, steps=10)
    assert [j.index for j in order_queue([longer, long, fresh], "srpt-aged", t)] == [0, 2, 3]


def test_srpt_aged_reservation_goes_to_the_starved_job():
    # 8 GPUs, 6 held until now + 1000 s; a starved 8-GPU job and a shorter 1-GPU job that would
    # end after that: under srpt the 1-GPU job is first and starts at once; under srpt-aged the
    # starved 8-GPU job is first and reserved at now + 1000 s, so the 1-GPU job (it would delay
    # the reservation) waits
    from tlora_sim.policies.ordering import AGING_FACTOR

    head = make_job(0, gpus=8, steps=100_000)
    now = 2 * AGING_FACTOR * head.isolated_runtime_s
    running = [make_job(10, gpus=6, steps=100)]
    g = group_view(0, running, ((0, 6),), plan="alone", remaining=[1000.0 / running[0].isolated_step_time_s])
    other = make_job(1, submit=now, gpus=1, steps=int(2000 / make_job(1).isolated_step_time_s))
    assert 1000.0 < other.isolated_runtime_s < head.isolated_runtime_s
    snap = snapshot([head, other], spec="1x8xH100", groups=[g], now=now)
    opts = dict(grouping=False, plan_alone="alone")
    assert started(policy("lookahead", order="srpt", **opts).decide(snap)) == [1]
    assert started(policy("lookahead", order="srpt-aged", **opts).decide(snap)) == []


def test_queue_table_orders_srpt_aged_as_order_queue():
    """The array sort (long queues) and the short-queue sort give ``order_queue``'s order."""
    from tlora_sim.policies.ordering import order_queue
    from tlora_sim.policies.tlora.queue import SHORT, QueueTable

    jobs = [make_job(i, submit=37.0 * i, gpus=1 + i % 4, steps=10 + (i * 7919) % 500) for i in range(3 * SHORT)]
    table = QueueTable()
    for queue in (tuple(jobs), tuple(jobs[:SHORT // 2])):
        for now in (0.0, 800.0, 3_000.0, 1e6):
            got = table.order(queue, "srpt-aged", now)
            assert [got.job(p).index for p in range(len(got))] == \
                [j.index for j in order_queue(queue, "srpt-aged", now)]


def test_srpt_aged_indexed_walk_matches_the_plain_walk():
    """A whole contended simulation of ``lookahead`` (``srpt-aged``): the queue-table walk decides
    what the plain walk over ``order_queue`` decides, and the guard changes the schedule."""
    from tlora_sim.policies.lookahead import Lookahead, LookaheadConfig
    from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload

    from tlora_sim.policies.ordering import urgency, AGING_FACTOR
    from tlora_sim.policies.tlora.queue import SHORT

    class Plain(Lookahead):
        index_queue = False
        longest, starved = 0, 0

        def decide(self, snap):
            self.longest = max(self.longest, len(snap.queue))
            self.starved += any(urgency(j, snap.now_s) > AGING_FACTOR for j in snap.queue)
            return super().decide(snap)

    spec = "2x8xH100"
    jobs, _, model, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=250,seed=5,load=1.6,gpus=16",
                                                    policy="lookahead", cluster=spec, seed=0, cost_model="roofline"))
    cfg = LookaheadConfig(regroup_pause_s=0.0, tick_s=300.0)
    a = run_engine(jobs, Lookahead(cfg), spec, cost_model=model, check=False)
    plain = Plain(cfg)
    b = run_engine(jobs, plain, spec, cost_model=model, check=False)
    assert plain.longest > SHORT and plain.starved > 0  # both sort paths, and starved jobs, seen
    rec = lambda res: [(r.start_s, r.finish_s, r.max_group_size) for r in res.records]
    assert rec(a) == rec(b)
    srpt = run_engine(jobs, Lookahead(LookaheadConfig(regroup_pause_s=0.0, tick_s=300.0, order="srpt")), spec,
                      cost_model=model, check=False)
    assert rec(srpt) != rec(a), "the starvation guard must change the schedule on a contended workload"
