"""Queue discipline as two axes (issue 40): priority order x backfilling, in every policy.

EASY backfilling works under any priority order (the reservation goes to the first job in
priority order that cannot start), ``none`` blocks the queue, ``conservative`` keeps a reservation
for every blocked job ahead, the legacy ``ordering`` values map onto both axes, and no policy's
default is strict head-of-line."""

from __future__ import annotations

import pytest

from conftest import group_view, make_job, policy, run_engine, snapshot
from tlora_sim.policies.discipline import DISCIPLINES, LEGACY_ORDERING, NATIVE, discipline_options
from tlora_sim.policies.ordering import backfill_starts, order_queue
from tlora_sim.policies.registry import available, make_policy
from tlora_sim.sim.core.snapshot import StartGroup
from tlora_sim.traces.errors import InputError

POLICIES = ["independent", "independent-fused", "mlora", "lorafusion", "alto", "tlora", "lookahead"]


def started(actions):
    return [i for a in actions if isinstance(a, StartGroup) for i in a.job_indices]


def blocked_queue(now: float = 500.0):
    """8 GPUs, 6 held by a group ending at t=1000 s. Queue: an old short 8-GPU job (first under
    urgency and fifo, cannot start) and a short 1-GPU job that ends before t=1000 s."""
    running = [make_job(10, gpus=6, steps=100)]
    g = group_view(0, running, ((0, 6),), plan="alone", remaining=[1000.0 / running[0].isolated_step_time_s])
    head = make_job(0, gpus=8, steps=10)
    short = make_job(1, submit=400.0, gpus=1, steps=1)
    return snapshot([head, short], spec="1x8xH100", groups=[g], now=now)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("order", ["fifo", "urgency", "srpt", "sjf"])
def test_easy_is_not_blocked_under_any_order_and_none_is(name, order):
    snap = blocked_queue()
    opts = {} if name.startswith("independent") else {"grouping": False}
    # the short job starts: by EASY backfilling (under srpt/sjf it is first and just starts)
    assert 1 in started(policy(name, order=order, **opts).decide(snap))
    if order in ("fifo", "urgency"):  # the 8-GPU job is first in these orders and cannot start
        assert started(policy(name, order=order, backfill="none", **opts).decide(snap)) == []


@pytest.mark.parametrize("name", ["tlora", "lookahead", "mlora"])
def test_easy_inside_a_grouping_walk(name):
    # grouping on: the first job in urgency order cannot start nor join; the short one backfills
    snap = blocked_queue()
    assert 1 in started(policy(name, order="urgency").decide(snap))
    assert started(policy(name, order="urgency", backfill="none").decide(snap)) == []


def test_reservation_goes_to_the_first_job_in_priority_order():
    # 8 GPUs, 6 busy until t=1000 s. Under srpt the 4-GPU job is first and gets the reservation
    # (4 of the 8 at t=1000, 4 spare): a long 2-GPU job fits the spare and starts. Under fifo the
    # 8-GPU job holds it (no spare): the long job would delay it and waits.
    running = [make_job(10, gpus=6, steps=100)]
    g = group_view(0, running, ((0, 6),), plan="alone", remaining=[1000.0 / running[0].isolated_step_time_s])
    mid = make_job(0, gpus=4, steps=20)
    long = make_job(1, gpus=2, steps=10**7)
    big = make_job(2, gpus=8, steps=10**6)
    snap = snapshot([big, long, mid], spec="1x8xH100", groups=[g])
    srpt = order_queue(snap.queue, "srpt", snap.now_s)
    assert [j.index for j in srpt] == [0, 2, 1]
    # mid (4 GPUs) cannot start on 2: reserved at t=1000 with 8 - 4 = 4 spare; long (2) fits the spare
    assert started(backfill_starts(snap, [], "alone", queue=srpt)) == [1]
    # fifo: big (8) is first; long would hold 2 of the 8 big needs at t=1000: not admitted
    assert started(backfill_starts(snap, [], "alone")) == []


def test_conservative_keeps_a_reservation_for_every_blocked_job():
    # 8 GPUs, 6 busy until t=1000. Queue: A and B (4 GPUs each, short), C (2 GPUs, long). EASY:
    # only A holds a reservation (4 spare at t=1000) and C takes 2 of them, delaying B;
    # conservative reserves B too (at t=1000) and C waits.
    running = [make_job(10, gpus=6, steps=100)]
    step = running[0].isolated_step_time_s
    g = group_view(0, running, ((0, 6),), plan="alone", remaining=[1000.0 / step])
    a = make_job(0, gpus=4, steps=10)  # starts at 1000 (4 of 8), 4 spare at the shadow
    b = make_job(1, gpus=4, steps=10)  # also fits at 1000 under conservative (4 + 4 = 8)
    c = make_job(2, gpus=2, steps=10**7)  # long: EASY lets it take 2 of A's spare 4; it delays B
    snap = snapshot([a, b, c], spec="1x8xH100", groups=[g], free=[2])
    assert started(backfill_starts(snap, [], "alone", rule="easy")) == [2]
    assert started(backfill_starts(snap, [], "alone", rule="conservative")) == []
    short = make_job(3, gpus=2, steps=1)  # ends before t=1000: delays nobody, both rules admit it
    snap = snapshot([a, b, short], spec="1x8xH100", groups=[g], free=[2])
    assert started(backfill_starts(snap, [], "alone", rule="conservative")) == [3]
    assert started(policy("independent", backfill="conservative").decide(snap)) == [3]


@pytest.mark.parametrize("name", POLICIES)
def test_no_default_is_strict_head_of_line(name):
    pol = make_policy(name)
    assert pol.backfill == "easy"
    assert pol.config.ordering is None


@pytest.mark.parametrize("legacy", sorted(LEGACY_ORDERING))
def test_legacy_ordering_overrides_both_axes(legacy):
    pol = make_policy("tlora", {"ordering": legacy, "order": "sjf", "backfill": "conservative"})
    assert (pol.order, pol.backfill) == LEGACY_ORDERING[legacy]


@pytest.mark.parametrize("bad", [{"order": "lifo"}, {"backfill": "aggressive"}, {"ordering": "random"},
                                 {"plan_alone": "magic"}])
def test_bad_axis_values_are_input_errors(bad):
    with pytest.raises(InputError):
        make_policy("tlora", bad)


def test_sjf_orders_by_whole_job_runtime():
    jobs = [make_job(0, steps=300), make_job(1, steps=10), make_job(2, steps=100)]
    assert [j.index for j in order_queue(jobs, "sjf", 0.0)] == [1, 2, 0]


def test_plan_alone_changes_step_times():
    jobs = [make_job(0, steps=50, rank=16)]
    eager = run_engine(jobs, make_policy("independent"), spec="1x8xH100")
    fused = run_engine(jobs, make_policy("independent-fused"), spec="1x8xH100")
    nog = run_engine(jobs, make_policy("tlora-nogroup", {"plan_alone": "alone"}), spec="1x8xH100")
    t = [r.records[0].finish_s - r.records[0].start_s for r in (eager, fused, nog)]
    assert t[0] != pytest.approx(t[1], rel=1e-3)
    assert t[2] == pytest.approx(t[0], rel=1e-9)  # tlora-nogroup on the eager plan runs the baseline's step
    assert make_policy("independent-fused").plan == "fused"
    assert make_policy("mlora-nogroup", {"plan_alone": "fused"}).plan == "fused"


def test_independent_fused_is_listed_and_discipline_options():
    assert "independent-fused" in [e.name for e in available()]
    assert discipline_options("tlora", "default") == {}
    assert discipline_options("mlora-nogroup", "shared") == {"order": "fifo", "backfill": "easy"}
    assert discipline_options("tlora-nogroup", "native") == NATIVE["tlora"]
    for d in DISCIPLINES:  # every option set builds every policy
        for name in POLICIES:
            make_policy(name, discipline_options(name, d))


def test_mlora_concurrency_default_is_its_repository_default():
    assert make_policy("mlora").config.concurrency_num == 2


@pytest.mark.parametrize("name", ["tlora", "mlora", "lorafusion", "alto"])
def test_every_ablation_runs_under_every_backfill(name):
    jobs = [make_job(0, gpus=8, steps=10**4), make_job(1, submit=1.0, steps=10), make_job(2, submit=2.0, steps=10)]
    for bf in ("easy", "conservative", "none"):
        res = run_engine(jobs, make_policy(name + "-nogroup", {"backfill": bf}), spec="1x8xH100")
        assert all(r.finish_s is not None for r in res.records)
