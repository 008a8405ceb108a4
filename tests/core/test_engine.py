"""The SimPy engine: rate-based progress, regroup pauses, stale timers, preemption, completion."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tlora_sim.sim.core.listeners import EngineListener, EventCounter

from conftest import CM, cluster, make_job, policy, reindex, run_engine
from tlora_sim.sim.core.engine import Engine, InvariantError, PauseOptions
from tlora_sim.sim.core.snapshot import AddMembers, RemoveMembers, StartGroup


class Scripted:
    """A test policy: ``script(snapshot) -> actions``; records every snapshot it saw (with its queue
    copied: an engine snapshot's queue is readable only while the policy decides)."""

    name = "scripted"
    plan = "fused"
    timer_s = None

    def __init__(self, script):
        self.script = script
        self.seen = []

    def decide(self, snap):
        self.seen.append(dataclasses.replace(snap, queue=tuple(snap.queue)))
        return list(self.script(snap))


def start_all_together(snap):
    """Start every queued job in one group on node 0 (all share its GPU count)."""
    if not snap.queue or snap.groups:
        return []
    n = snap.queue[0].num_gpus
    return [StartGroup(tuple(j.index for j in snap.queue), ((0, n),), "fused")]


def approx(x, rel=1e-12):
    return pytest.approx(x, rel=rel, abs=1e-9)


# ---- rate-based progress ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpus, spec", [(1, "1x8xH100"), (4, "1x8xH100"), (16, "4x8xH100")])
def test_single_job_alone_finishes_at_submit_plus_isolated_runtime(gpus, spec, reliability):
    job = make_job(0, submit=123.5, gpus=gpus, steps=777, rank=16, batch=4, seq=2048)
    res = run_engine([job], policy("independent"), spec)
    rec = res.records[0]
    assert rec.start_s == 123.5
    assert rec.finish_s == approx(123.5 + 777 * job.isolated_step_time_s)
    assert rec.steps_trained == approx(777)
    assert rec.max_group_size == 1 and rec.group_changes == 0
    reliability("invariant_cases")


def test_two_jobs_in_one_group_progress_at_the_group_step_time(reliability):
    a = make_job(0, steps=100, rank=8)
    b = make_job(1, steps=250, rank=16, batch=4)
    res = run_engine([a, b], Scripted(start_all_together), "1x8xH100")
    t2 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member], 1, "fused")
    t1 = CM.step_time_s("llama3-8b", "H100", [b.member], 1, "fused")
    assert t2 > t1  # the pair is slower per step than b alone
    assert res.records[0].finish_s == approx(100 * t2)
    # b trained 100 steps at the pair's pace, then its last 150 alone (no pause: a member leaving is free)
    assert res.records[1].finish_s == approx(100 * t2 + 150 * t1)
    assert res.records[0].max_group_size == res.records[1].max_group_size == 2
    # the timeline's token rate equals the members' tokens over the group step time
    first = res.timeline[0]
    assert first[5] == approx((a.tokens_per_step + b.tokens_per_step) / t2)
    reliability("invariant_cases")


def join_on_arrival(snap):
    """Start the first job alone; add later arrivals to the running group."""
    if snap.groups:
        gid = next(iter(snap.groups))
        return [AddMembers(gid, tuple(j.index for j in snap.queue))] if snap.queue else []
    return [StartGroup((snap.queue[0].index,), ((0, 1),), "fused")] if snap.queue else []


@pytest.mark.parametrize("pause", [0.0, 7.25, 300.0])
def test_regroup_pause_delays_completion_by_exactly_the_pause(pause, reliability):
    a = make_job(0, steps=1000)
    b = make_job(1, submit=50.0, steps=400, rank=4)
    base = run_engine([a, b], Scripted(join_on_arrival), "1x8xH100", pause=0.0)
    paused = run_engine([a, b], Scripted(join_on_arrival), "1x8xH100", pause=pause)
    for i in (0, 1):
        assert paused.records[i].finish_s == approx(base.records[i].finish_s + pause, rel=1e-11)
        assert paused.records[i].steps_trained == approx([1000, 400][i], rel=1e-9)
    # and the analytic value: a trains alone until b arrives, pauses, then shares the group
    t1 = CM.step_time_s("llama3-8b", "H100", [a.member], 1, "fused")
    t2 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member], 1, "fused")
    done_a = 50.0 / t1
    finish_b = 50.0 + pause + 400 * t2
    assert paused.records[1].finish_s == approx(finish_b, rel=1e-11)
    assert paused.records[0].finish_s == approx(finish_b + (1000 - done_a - 400) * t1, rel=1e-11)
    assert paused.records[0].group_changes == 1
    reliability("invariant_cases", 2)


def test_pause_shows_as_zero_token_rate_in_the_timeline():
    a = make_job(0, steps=1000)
    b = make_job(1, submit=50.0, steps=400)
    res = run_engine([a, b], Scripted(join_on_arrival), "1x8xH100", pause=100.0)
    rows = {round(r[0], 6): r for r in res.timeline}
    assert rows[50.0][5] == 0.0 and rows[50.0][1] == 2  # two members, paused
    assert rows[150.0][5] > 0.0  # resumed


def test_stale_timers_are_ignored_and_every_job_finishes_once(reliability):
    a = make_job(0, steps=1000)
    b = make_job(1, submit=50.0, steps=400)
    finishes = []

    class Spy(EngineListener):
        def finish(self, gid, i, *, early=False):
            finishes.append((eng.env.now, i))

    eng = Engine([a, b], cluster("1x8xH100"), CM, Scripted(join_on_arrival), regroup_pause_s=30.0,
                 listeners=[Spy()])
    res = eng.run()
    # a's first timer (at 1000 x T alone) fired after the regroup and was ignored: exactly one finish each
    assert sorted(i for _, i in finishes) == [0, 1]
    alone_finish = 1000 * CM.step_time_s("llama3-8b", "H100", [a.member], 1, "fused")
    assert res.records[0].finish_s > alone_finish
    assert all(t != pytest.approx(alone_finish) for t, _ in finishes)
    reliability("invariant_cases")


def leave_and_restart_together(snap):
    """Start the first job alone; when another arrives, take the first out of its group (which
    closes it) and start both together in a new group."""
    if snap.groups:
        (g,) = snap.groups.values()
        return [RemoveMembers(g.group_id, tuple(m.index for m in g.members))] if snap.queue else []
    return [StartGroup(tuple(j.index for j in snap.queue), ((0, 1),), "fused")] if snap.queue else []


@pytest.mark.parametrize("script", [join_on_arrival, leave_and_restart_together])
def test_a_stale_timer_of_a_changed_or_closed_group_changes_nothing(script):
    """a's first timer (due at 1000 x its alone step time) outlives its group's state: the group
    changed (AddMembers: a newer version) or closed (RemoveMembers; a new group takes both jobs).
    When it fires it is ignored: no timer event, no finish, and both jobs finish exactly when the
    steps they trained say."""
    a = make_job(0, steps=1000)
    b = make_job(1, submit=50.0, steps=400)
    timers, finishes = [], []

    class Spy(EngineListener):
        def at(self, now, kind, detail=""):
            if kind == "timer":
                timers.append(now)

        def finish(self, gid, i, *, early=False):
            finishes.append((eng.env.now, i))

    eng = Engine([a, b], cluster("1x8xH100"), CM, Scripted(script), regroup_pause_s=0.0, listeners=[Spy()])
    res = eng.run()
    t1 = CM.step_time_s("llama3-8b", "H100", [a.member], 1, "fused")
    t2 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member], 1, "fused")
    finish_b = 50.0 + 400 * t2
    finish_a = finish_b + (1000 - 50.0 / t1 - 400) * t1
    assert 1000 * t1 < finish_a  # the stale timer fired while the run went on
    assert sorted(finishes) == [(approx(finish_b, rel=1e-11), 1), (approx(finish_a, rel=1e-11), 0)]
    assert timers == [approx(finish_b, rel=1e-11), approx(finish_a, rel=1e-11)]
    assert res.records[0].steps_trained == approx(1000, rel=1e-9) and res.records[1].steps_trained == approx(400)


# ---- whole runs --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["independent", "mlora", "tlora"])
def test_every_job_finishes_exactly_once_with_its_total_steps(name, synthetic_jobs, reliability):
    jobs, spec = synthetic_jobs
    res = run_engine(jobs, policy(name), spec)
    assert len(res.records) == len(jobs)
    for j, r in zip(jobs, res.records):
        assert r.start_s is not None and r.finish_s is not None
        assert j.submit_time_s <= r.start_s <= r.finish_s
        assert r.steps_trained == pytest.approx(j.total_steps, rel=1e-6, abs=1e-3)
        assert not r.early_exit
    times = [row[0] for row in res.timeline]
    assert times == sorted(times)
    assert res.timeline[-1][1:6] == (0, 0, 0, 0, 0.0)  # empty, idle cluster at the end
    reliability("invariant_cases")


def test_independent_never_beats_isolated_runtime(synthetic_jobs, reliability):
    jobs, spec = synthetic_jobs
    res = run_engine(jobs, policy("independent"), spec)
    for j, r in zip(jobs, res.records):
        assert r.finish_s - j.submit_time_s >= j.isolated_runtime_s * (1 - 1e-12)
        assert r.finish_s - r.start_s == pytest.approx(j.isolated_runtime_s, rel=1e-9)
    reliability("invariant_cases")


def test_invariants_off_gives_identical_results(synthetic_jobs):
    jobs, spec = synthetic_jobs
    on = run_engine(jobs, policy("tlora"), spec, check=True)
    off = run_engine(jobs, policy("tlora"), spec, check=False)
    assert on.records == off.records and on.timeline == off.timeline


@pytest.fixture(scope="module")
def synthetic_jobs():
    """60 synthetic jobs (seed 0) on a 4x8 H100 cluster, steps derived under the roofline model the
    engine runs with here (``run_engine`` uses ``CM``)."""
    from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload
    from tlora_sim.sim.core.workload import build_jobs

    _, spec_cluster, _, frame, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=60,seed=3", policy="independent",
                                                               cluster="4x8xH100"))
    jobs, _ = build_jobs(frame, spec_cluster, CM)
    return jobs, "4x8xH100"


# ---- preemption ----------------------------------------------------------------------------------
class NewestFirst:
    """Preempts the running job when a newer one waits (one GPU), then starts the newest queued job."""

    name = "newest-first"
    plan = "alone"
    timer_s = None

    def decide(self, snap):
        if not snap.queue:
            return []
        if snap.free.total == 0:
            (g,) = snap.groups.values()
            newest = max(j.submit_time_s for j in snap.queue)
            if newest > g.members[0].submit_time_s:
                return [RemoveMembers(g.group_id, (g.members[0].index,))]
            return []
        j = max(snap.queue, key=lambda j: j.submit_time_s)
        return [StartGroup((j.index,), snap.free.find(1), "alone")]


def test_preemption_keeps_progress_and_the_engine_asks_again(reliability):
    a = make_job(0, steps=1000)
    t_a = a.isolated_step_time_s
    b = make_job(1, submit=300.5 * t_a, steps=200, rank=4)
    res = run_engine([a, b], NewestFirst(), "1x1xH100", pause=30.0)
    # b starts as soon as a is preempted (the engine asks the policy again at the same instant)
    assert res.records[1].start_s == approx(b.submit_time_s)
    finish_b = b.submit_time_s + 200 * b.isolated_step_time_s
    assert res.records[1].finish_s == approx(finish_b, rel=1e-11)
    # a resumes with the 699.5 steps it had left (progress kept; its group closed, so no pause)
    assert res.records[0].finish_s == approx(finish_b + (1000 - 300.5) * t_a, rel=1e-11)
    assert res.records[0].steps_trained == approx(1000, rel=1e-9)
    assert res.records[0].group_changes == 1
    reliability("invariant_cases")


def test_preempting_part_of_a_group_pauses_the_rest():
    a, b = make_job(0, steps=500), make_job(1, steps=500)
    state = {"done": False}

    def script(snap):
        if not snap.groups and len(snap.queue) == 2 and not state["done"]:
            return [StartGroup((0, 1), ((0, 1),), "fused")]
        if snap.groups and not state["done"] and snap.now_s > 0:
            state["done"] = True
            (g,) = snap.groups.values()
            return [RemoveMembers(g.group_id, (1,))]
        if snap.queue and snap.free.total:
            return [StartGroup((snap.queue[0].index,), snap.free.find(1), "fused")]
        return []

    c = make_job(2, submit=10.0, steps=1)  # an arrival at t=10 triggers the preemption
    res = run_engine([a, b, c], Scripted(script), "1x2xH100", pause=20.0)
    t2 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member], 1, "fused")
    t1 = CM.step_time_s("llama3-8b", "H100", [a.member], 1, "fused")
    # a: 10 s in the pair, 20 s paused, the rest alone
    assert res.records[0].finish_s == approx(10.0 + 20.0 + (500 - 10.0 / t2) * t1, rel=1e-11)
    assert all(r.steps_trained == approx(j.total_steps, rel=1e-9) for j, r in zip([a, b, c], res.records))


# ---- bad actions are rejected ----------------------------------------------------------------------
@pytest.mark.parametrize("actions, match", [
    ([StartGroup((0,), ((0, 9),), "fused")], "double-books"),
    ([StartGroup((0,), ((5, 1),), "fused")], "double-books"),
    ([StartGroup((0, 0), ((0, 1),), "fused")], "twice"),
    ([StartGroup((7,), ((0, 1),), "fused")], "not queued"),
    ([StartGroup((), ((0, 1),), "fused")], "no jobs"),
    ([StartGroup((0, 1), ((0, 1),), "fused")], "mixes base models"),
    ([AddMembers(3, (0,))], "not running"),
    ([RemoveMembers(3, (0,))], "not running"),
    (["not an action"], "unknown action"),
])
@pytest.mark.parametrize("check", [True, False])
def test_impossible_actions_raise_invariant_error(actions, match, check):
    jobs = [make_job(0), make_job(1, model="qwen3-8b")]
    with pytest.raises(InvariantError, match=match):
        run_engine(jobs, Scripted(lambda snap: actions), "1x8xH100", check=check)


def test_engine_rejects_bad_construction():
    with pytest.raises(ValueError, match="index"):
        Engine([make_job(1)], cluster(), CM, policy("independent"))
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="regroup_pause_s"):
            Engine([make_job(0)], cluster(), CM, policy("independent"), regroup_pause_s=bad)


def test_same_time_arrivals_are_one_decision_in_index_order():
    jobs = reindex([make_job(i, submit=5.0, job_id=f"x{i}") for i in range(4)])
    pol = Scripted(lambda snap: [StartGroup((j.index,), snap.free.take(1), "alone") for j in snap.queue])
    run_engine(jobs, pol, "1x8xH100")
    first = pol.seen[0]
    assert first.now_s == 5.0 and [j.index for j in first.queue] == [0, 1, 2, 3]


def test_listeners_see_every_state_change_and_change_nothing():
    """An EventCounter listening in does not change a simulation, and counts what happened."""
    jobs = [make_job(i, submit=10.0 * i, steps=5000) for i in range(6)]
    quiet = Engine(jobs, cluster("1x8xH100"), CM, Scripted(join_on_arrival), check_invariants=False).run()
    counter = EventCounter()
    loud = Engine(jobs, cluster("1x8xH100"), CM, Scripted(join_on_arrival), listeners=[counter]).run()
    assert [(r.start_s, r.finish_s) for r in quiet.records] == [(r.start_s, r.finish_s) for r in loud.records]
    assert counter.counts["finishes"] == 6 and counter.counts["starts"] >= 1
    assert counter.counts["joins"] >= 1 and counter.counts["retimes"] > counter.counts["joins"]
    assert counter.counts["decisions"] == loud.decisions


# ---- how pauses are charged (validate-run's options) ---------------------------------------------
@pytest.mark.parametrize("serial", [False, True])
def test_a_join_during_a_rebuild_pays_its_own_pause_only_with_serial_pauses(serial):
    """Jobs 1 and 2 join job 0's group 10 s apart while each pause lasts 30 s: the plain engine
    extends the first pause to 10 + 30 s after the first join; ``serial_pauses`` queues the second
    rebuild after the first (30 + 30 s). Two joins at one instant cost one pause either way."""
    a = make_job(0, steps=2000)
    b = make_job(1, submit=100.0, steps=300, rank=4)
    c = make_job(2, submit=110.0, steps=300, rank=16)
    d = make_job(3, submit=110.0, steps=300, rank=2)

    def join(snap):
        if not snap.groups:
            return [StartGroup((0,), ((0, 1),), "fused")] if snap.queue else []
        return [AddMembers(0, tuple(j.index for j in snap.queue))] if snap.queue else []

    eng = Engine([a, b, c, d], cluster("1x8xH100"), CM, Scripted(join), regroup_pause_s=30.0,
                 pauses=PauseOptions(serial_pauses=serial))
    res = eng.run()
    t4 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member, c.member, d.member], 1, "fused")
    resume = 100.0 + 30.0 + 30.0 if serial else 110.0 + 30.0
    # b, c and d share every step after the last resume and c, d start it with all their steps left
    assert res.records[2].finish_s == approx(resume + 300 * t4, rel=1e-9)
    assert eng.serial_pause_count == (1 if serial else 0)


def test_pause_by_size_prices_a_rebuild_by_the_members_after_it():
    """``pause_by_size``: the join that leaves 2 members pauses 5 s, other sizes ``regroup_pause_s``."""
    a = make_job(0, steps=1000)
    b = make_job(1, submit=50.0, steps=400, rank=4)
    eng = Engine([a, b], cluster("1x8xH100"), CM, Scripted(join_on_arrival), regroup_pause_s=30.0,
                 pauses=PauseOptions(pause_by_size={2: 5.0}))
    res = eng.run()
    t2 = CM.step_time_s("llama3-8b", "H100", [a.member, b.member], 1, "fused")
    assert res.records[1].finish_s == approx(50.0 + 5.0 + 400 * t2, rel=1e-11)
    with pytest.raises(ValueError):
        Engine([a, b], cluster("1x8xH100"), CM, Scripted(join_on_arrival), pauses=PauseOptions(pause_by_size={2: -1.0}))


def test_snapshot_queue_is_read_in_place_and_only_while_deciding():
    """An engine snapshot's queue reads the engine's own queue (no copy per decision, issue 20):
    arrival order by iteration and by index, and any read after ``decide`` returns raises."""
    jobs = reindex([make_job(i, submit=5.0, job_id=f"q{i}") for i in range(5)])
    kept = []

    def script(snap):
        assert [j.index for j in snap.queue] == [0, 1, 2, 3, 4] and len(snap.queue) == 5
        assert snap.queue[-1].index == 4 and [j.index for j in snap.queue[1:3]] == [1, 2]
        kept.append(snap.queue)
        return [StartGroup((j.index,), snap.free.take(1), "alone") for j in snap.queue]

    run_engine(jobs, type("Keep", (Scripted,), {"decide": lambda self, s: list(self.script(s))})(script), "1x8xH100")
    with pytest.raises(RuntimeError, match="after the decision returned"):
        len(kept[0])
    with pytest.raises(RuntimeError, match="after the decision returned"):
        kept[0][0]


@pytest.mark.parametrize("short", [0, 100])
def test_queue_keys_follow_the_queue_dict(short, monkeypatch):
    """``QueueKeys`` (the engine's queue keys kept as an array from its reported changes) reads
    back the dict's keys in order after any run of arrivals, removals, re-sorts and unread spells
    (``short``: queues below it are read from the dict; 0: always kept incrementally)."""
    import random

    import numpy as np

    from tlora_sim.sim.core.snapshot import QueueKeys, QueueView

    monkeypatch.setattr(QueueKeys, "SHORT", short)
    rng = random.Random(5)
    q: dict[int, str] = {}
    keys, nxt = QueueKeys(), 0
    for step in range(3000):
        r = rng.random()
        if r < 0.45:  # arrivals: new keys at the end
            new = list(range(nxt, nxt + rng.randint(1, 4)))
            nxt = new[-1] + 1
            q.update((k, "j") for k in new)
            keys.added(new)
        elif r < 0.9 and q:  # starts: some queued keys leave
            gone = rng.sample(list(q), min(len(q), rng.randint(1, 3)))
            for k in gone:
                del q[k]
            keys.removed(gone)
        elif r < 0.93 and q:  # preempted jobs back in the queue, re-sorted
            back = list(range(max(0, nxt - 50), nxt))
            q.update((k, "j") for k in back if rng.random() < 0.2)
            q = dict(sorted(q.items()))
            keys.reset()
        if rng.random() < 0.7:  # most decisions read it (others leave the changes to pile up)
            got = QueueView(q, keys).indices()
            assert got.dtype == np.int64 and got.tolist() == list(q), step
