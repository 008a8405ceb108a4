"""The invariant checker: each invariant is broken on purpose and the violation is caught, with the
event history that led to it; a correct run passes them all; switching checks off costs nothing else."""

from __future__ import annotations

import pickle

import pytest

from conftest import CM, cluster, make_job, policy, run_engine
from tlora_sim.sim.core import engine as engine_mod
from tlora_sim.sim.core.engine import Engine, InvariantError
from tlora_sim.sim.core.invariants import InvariantChecker, InvariantViolation
from tlora_sim.sim.core.snapshot import RemoveMembers, StartGroup


def caught(info, check, reliability):
    """Assert the violation names ``check`` and carries a non-empty, bounded event history."""
    err = info.value
    assert isinstance(err, InvariantViolation) and isinstance(err, InvariantError)
    assert err.check == check, str(err)
    assert 1 <= len(err.history) <= 50
    assert "oldest first" in str(err) and err.history[-1] in str(err)
    assert str(err).splitlines()[0].startswith(f"[{check}] t=")
    reliability("violations_caught")
    return err


class Script:
    name = "script"
    plan = "fused"
    timer_s = None

    def __init__(self, fn):
        self.fn = fn

    def decide(self, snap):
        return list(self.fn(snap))


def test_invariant_error_is_the_engine_one():
    assert engine_mod.InvariantError is InvariantError
    assert issubclass(InvariantViolation, InvariantError) and issubclass(InvariantError, RuntimeError)


def test_violation_survives_pickling_between_processes():
    err = InvariantViolation("gpus", "broken", ["t=0 a", "t=1 b"])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is InvariantViolation and back.check == "gpus" and back.history == err.history
    assert str(back) == str(err)


def test_gpu_allocated_twice_is_caught_even_if_the_engine_books_wrongly(monkeypatch, reliability):
    jobs = [make_job(0, gpus=8), make_job(1, gpus=8)]
    pol = Script(lambda s: [StartGroup((j.index,), ((0, 8),), "alone") for j in s.queue])
    eng = Engine(jobs, cluster("1x8xH100"), CM, pol)
    monkeypatch.setattr(eng.free, "apply", lambda placement, sign: None)  # an engine accounting bug
    with pytest.raises(InvariantViolation) as info:
        eng.run()
    err = caught(info, "gpus", reliability)
    assert "allocated twice" in str(err) or "engine counts" in str(err)


def test_double_booking_policy_is_rejected_with_history(reliability):
    jobs = [make_job(0, gpus=6), make_job(1, submit=5.0, gpus=6)]
    pol = Script(lambda s: [StartGroup((j.index,), ((0, 6),), "alone") for j in s.queue])
    with pytest.raises(InvariantViolation) as info:
        run_engine(jobs, pol, "1x8xH100")
    err = caught(info, "action", reliability)
    assert "double-books" in str(err) and any("start" in h for h in err.history)


def test_group_over_gpu_memory_is_caught(reliability):
    big = [make_job(i, rank=16, batch=8, seq=4096) for i in range(12)]
    assert CM.memory_bytes("llama3-8b", "H100", [j.member for j in big], 1, "fused") > 80 * 2**30
    pol = Script(lambda s: [StartGroup(tuple(j.index for j in s.queue), ((0, 1),), "fused")] if s.queue else [])
    with pytest.raises(InvariantViolation) as info:
        run_engine(big, pol, "1x8xH100")
    assert "GiB per GPU" in str(caught(info, "memory", reliability))


class NeverStarts:
    name = "lazy"
    plan = "alone"
    timer_s = None

    def decide(self, snap):
        return []


def test_jobs_left_unfinished_are_caught(reliability):
    with pytest.raises(InvariantViolation) as info:
        run_engine([make_job(0), make_job(1, submit=3.0)], NeverStarts(), "1x8xH100")
    assert "never finished" in str(caught(info, "jobs", reliability))


def test_jobs_left_unfinished_are_an_error_with_checks_off_too():
    with pytest.raises(InvariantError, match="unfinished"):
        run_engine([make_job(0)], NeverStarts(), "1x8xH100", check=False)


class ForgetfulDict(dict):
    """Loses preempted progress: a restarted job would train its whole total again."""

    def pop(self, key, default=None):
        super().pop(key, None)
        return default


def test_trained_work_mismatch_is_caught(reliability):
    from test_engine import NewestFirst

    a = make_job(0, steps=1000)
    b = make_job(1, submit=300.5 * a.isolated_step_time_s, steps=200)
    eng = Engine([a, b], cluster("1x1xH100"), CM, NewestFirst())
    eng.remaining_queued = ForgetfulDict()  # an engine bug: preemption drops the kept progress
    with pytest.raises(InvariantViolation) as info:
        eng.run()
    err = caught(info, "work", reliability)
    assert "trained steps" in str(err) and any("preempt" in h for h in err.history)


def test_independent_below_isolated_runtime_is_caught(reliability):
    # the job claims an isolated step twice as long as the cost model gives it alone
    job = make_job(0, steps=100, iso_scale=2.0)
    with pytest.raises(InvariantViolation) as info:
        run_engine([job], policy("independent"), "1x8xH100")
    assert "isolated runtime" in str(caught(info, "isolation", reliability))
    # checks off: the same run "succeeds" with a JCT below the isolated runtime (why they are on by default)
    res = run_engine([job], policy("independent"), "1x8xH100", check=False)
    assert res.records[0].finish_s < job.isolated_runtime_s


class BrokenCost:
    """The roofline model, except that groups of two run in negative time."""

    name = "broken"

    def __getattr__(self, attr):
        return getattr(CM, attr)

    def step_time_s(self, model, gpu, members, n, plan, nano_batches=1, micro_batches=1):
        t = CM.step_time_s(model, gpu, members, n, plan, nano_batches, micro_batches)
        return -t if len(members) == 2 else t


def test_non_positive_step_time_is_caught_before_time_runs_backwards(reliability):
    jobs = [make_job(0), make_job(1)]
    pol = Script(lambda s: [StartGroup((0, 1), ((0, 1),), "fused")] if len(s.queue) == 2 else [])
    eng = Engine(jobs, cluster("1x8xH100"), BrokenCost(), pol)
    with pytest.raises(InvariantViolation) as info:
        eng.run()
    caught(info, "cost", reliability)


def test_time_running_backwards_is_caught(reliability):
    chk = InvariantChecker([make_job(0)], cluster("1x8xH100"), CM)
    chk.at(5.0, "timer", 0)
    with pytest.raises(InvariantViolation) as info:
        chk.at(4.0, "timer", 0)
    caught(info, "time", reliability)
    with pytest.raises(InvariantViolation, match="not finite"):
        InvariantChecker([make_job(0)], cluster("1x8xH100"), CM).at(float("nan"), "x", 0)


def test_finishing_twice_and_phantom_jobs_are_caught(reliability):
    jobs = [make_job(0, steps=10), make_job(1, steps=10)]
    chk = InvariantChecker(jobs, cluster("1x8xH100"), CM)
    chk.arrive(0.0, [0, 1])
    chk.start(0, "llama3-8b", 1, ((0, 1),), "fused", [0], [7])
    chk.retime(0, "llama3-8b", 1, "fused", [jobs[0].member], [0], 0.5)
    chk.progress([0], 10.0)
    chk.finish(0, 0)
    with pytest.raises(InvariantViolation, match="finished twice") as info:
        chk.finish(0, 0)
    caught(info, "jobs", reliability)
    with pytest.raises(InvariantViolation, match="not queued"):
        chk.join(0, [0])  # a finished job cannot join a group
    with pytest.raises(InvariantViolation, match="arrived twice"):
        chk.arrive(1.0, [1, 1])


class Flapper:
    """Swaps the running and the waiting job on one GPU at every decision: time never advances."""

    name = "flapper"
    plan = "fused"
    timer_s = None

    def decide(self, snap):
        out = []
        for g in snap.groups.values():
            out.append(RemoveMembers(g.group_id, tuple(j.index for j in g.members)))
        if snap.queue:
            out.append(StartGroup((snap.queue[0].index,), ((0, 1),), "fused"))
        return out


def test_livelock_at_one_instant_is_caught(reliability):
    with pytest.raises(InvariantViolation, match="livelock") as info:
        run_engine([make_job(0), make_job(1, submit=5.0)], Flapper(), "1x1xH100")
    caught(info, "time", reliability)


def test_history_is_a_bounded_ring_buffer():
    jobs = [make_job(i, submit=10.0 * i, steps=50) for i in range(40)]
    eng = Engine(jobs, cluster("1x8xH100"), CM, policy("independent"))
    eng.run()
    (checker,) = [x for x in eng._obs.listeners if isinstance(x, InvariantChecker)]
    assert len(checker.events) == 50  # far more than 50 events happened
    assert checker.events[-1][1] == "end"


def test_checks_off_means_no_checker():
    eng = Engine([make_job(0)], cluster(), CM, policy("independent"), check_invariants=False)
    assert eng._obs is None
    eng.run()


def test_cli_reports_a_violation_with_exit_status_3(tmp_path, monkeypatch, capsys, reliability):
    from tlora_sim.policies import registry
    from tlora_sim.sim.cli.main import main

    registry.available()  # load the built-ins before adding one

    @registry.register("broken-test", type("Cfg", (), {"__dataclass_fields__": {}}), "test only")
    class Broken:
        name = "broken-test"
        plan = "alone"
        timer_s = None

        def __init__(self, config=None):
            self.config = config

        def decide(self, snap):
            return [StartGroup((j.index,), ((0, 8),), "alone") for j in snap.queue]

    try:
        rc = main(["replay", "--trace", "synthetic:jobs=5", "--cluster", "1x8xH100", "--policy", "broken-test",
                   "--out", str(tmp_path / "run"), "--no-progress", "--no-plots"])
    finally:
        registry.unregister("broken-test")
    err = capsys.readouterr().err
    assert rc == 3
    assert err.startswith("tlora-sim: invariant violated: [action]") and "oldest first" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "jobs.csv").exists()  # no results from a broken run
    reliability("violations_caught")


def test_replay_checks_by_default_and_records_it(tmp_path):
    from tlora_sim.sim.experiments.replay import replay, ReplayConfig
    import json

    cfg = ReplayConfig(trace="synthetic:jobs=20", policy="tlora", cluster="2x8xH100")
    replay(cfg, tmp_path / "on", progress=False, plots=False)
    replay(cfg, tmp_path / "off", progress=False, plots=False, check_invariants=False)
    assert json.loads((tmp_path / "on" / "perf.json").read_text())["invariants_checked"] is True
    assert json.loads((tmp_path / "off" / "perf.json").read_text())["invariants_checked"] is False
    for f in ("jobs.csv", "summary.json", "timeline.csv"):
        assert (tmp_path / "on" / f).read_bytes() == (tmp_path / "off" / f).read_bytes()
