"""The host-speed probe (``sim/executor/probe.py``) and ``execute``'s ``probes.csv`` (issue 43).

The executor is checked with a fake probe and a fake trainer on the wall clock (no torch): probes
come every ``probe_every_s`` between steps, never inside one, and through idle waits. Then small
CPU executions (tiny shape): ``probes.csv`` with the probe's columns, ``perf.json``'s figures,
``--probe-every 0`` and the virtual clock without probes, a negative value refused. Last, what a
wall-clock wake-up (after an idle wait or a probe) must not change: a decision on arrivals sees
their submit instant, as the engine's does."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest
from tlora_sim.sim.executor.probe import PARAMS, REPS, describe, what

LORA = str(Path(__file__).resolve().parents[2] / "profiler" / "validation" / "lora_validation.json")
COLUMNS = ["t_s", "probe_ms", "python_ms"]  # the names (probe.COLUMNS is checked against them)


class _SleepGroup:
    def __init__(self, owner):
        self.o = owner

    def step(self, nano: int = 1, micro: int = 1) -> float:
        self.o.in_step = True
        time.sleep(0.002)
        self.o.in_step = False
        return 2.0

    def save(self) -> None:
        pass


class _SleepTrainer:
    """Steps that take 2 ms of wall time (nothing trains)."""

    in_step = False

    def group(self, model, plan, members):
        return _SleepGroup(self)

    def release(self) -> None:
        pass


class _FakeProbe:
    """Records whether it ran inside a step; costs 1 ms."""

    def __init__(self, trainer):
        self.trainer, self.inside = trainer, 0

    def measure(self) -> dict:
        self.inside += self.trainer.in_step
        time.sleep(0.001)
        return {"probe_ms": 1.0, "python_ms": 0.5}


def _workload(time_scale: float):
    from tlora_sim.sim.executor.execute import ExecuteConfig
    from tlora_sim.sim.executor.workload import scaled_workload

    cfg = ExecuteConfig(trace="synthetic:jobs=20", policy="independent", jobs=4, min_steps=2, max_steps=5,
                        time_scale=time_scale, lora_dist=LORA)
    return scaled_workload(cfg, "H100")


def test_the_executor_probes_between_steps_and_through_idle_waits():
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.executor.runtime import RealTimeExecutor

    jobs, cluster, cm, _, _ = _workload(3000.0)  # arrivals over ~0.5 s, idle between them
    every = 0.05
    trainer = _SleepTrainer()
    probe = _FakeProbe(trainer)
    ex = RealTimeExecutor(jobs, cluster, cm, make_policy("independent", {}), trainer, probe=probe,
                          probe_every_s=every)
    res = ex.run()
    t = pd.Series([r["t_s"] for r in ex.probes])
    assert list(ex.probes[0]) == COLUMNS and probe.inside == 0
    assert t.iloc[0] < 0.05 and len(t) >= 3
    assert (t.diff().dropna() >= every - 1e-12).all()  # next due = the last probe's start + every
    steps = pd.DataFrame(ex.log)
    steps = steps[steps.event == "step"]
    for x in t:  # never inside a step
        assert not ((steps.start_s < x) & (x < steps.end_s)).any(), x
    last = max(r.finish_s for r in res.records)
    assert t.iloc[-1] <= last + 1e-9
    # idle waits end when a probe is due: no gap much longer than `every` (the steps take ms)
    assert t.diff().max() < every + 0.1, t.diff().max()
    assert ex.probe_s >= 1e-3 * len(t) and ex.probe_s <= res.wall_s


def test_a_probe_only_on_one_device_on_the_wall_clock():
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.executor.clock import VirtualClock
    from tlora_sim.sim.executor.runtime import RealTimeExecutor

    jobs, cluster, cm, _, _ = _workload(3000.0)
    pol = make_policy("independent", {})
    with pytest.raises(ValueError, match="wall clock"):
        RealTimeExecutor(jobs, cluster, cm, pol, _SleepTrainer(), clock=VirtualClock(), probe=_FakeProbe(None),
                         probe_every_s=1.0)
    with pytest.raises(ValueError, match="probe_every_s"):
        RealTimeExecutor(jobs, cluster, cm, pol, _SleepTrainer(), probe=_FakeProbe(None), probe_every_s=0.0)


def test_host_probe_on_the_cpu():
    torch = pytest.importorskip("torch")
    from tlora_sim.sim.executor.probe import COLUMNS as PROBE_COLUMNS, HostProbe

    assert PROBE_COLUMNS == COLUMNS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = HostProbe("cpu").measure()
    finally:
        torch.set_num_threads(threads)
    assert set(m) == {"probe_ms", "python_ms"}
    assert all(math.isfinite(v) and v > 0 for v in m.values()), m


def _execute(tmp_path, name, *extra):
    from tlora_sim.sim.cli.main import main

    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; two cores shared
    try:
        return main(["execute", "--trace", "synthetic:jobs=20", "--policy", "independent", "--device", "cpu",
                     "--tiny", "--jobs", "4", "--min-steps", "2", "--max-steps", "4", "--lora-dist", LORA,
                     "--no-progress", "--no-plots", "--out", str(tmp_path / name), *extra])
    finally:
        torch.set_num_threads(threads)


def test_execute_writes_probes_csv(tmp_path, capsys):
    every = 0.1
    assert _execute(tmp_path, "p", "--time-scale", "3000", "--probe-every", str(every)) == 0
    assert "probes (" in capsys.readouterr().out
    d = tmp_path / "p"
    probes = pd.read_csv(d / "probes.csv")
    assert probes.columns.tolist() == COLUMNS and len(probes) > 0
    assert (probes.t_s.diff().dropna() >= every - 1e-9).all() and probes.t_s.iloc[0] >= 0
    assert ((probes.probe_ms > 0) & (probes.python_ms > 0)).all()
    steps = pd.read_csv(d / "steps.csv")
    assert probes.t_s.iloc[-1] <= steps.end_s.max() + 1e-9  # the run's clock, as steps.csv
    perf = json.loads((d / "perf.json").read_text())
    assert perf["probes"] == len(probes)
    # a measurement runs REPS passes, REPS // 2 + 1 of them at least its median, and the loop
    assert perf["probe_s"] >= (((REPS // 2 + 1) * probes.probe_ms + probes.python_ms).sum() / 1e3) * 0.999
    assert 0 < perf["probe_s"] <= perf["wall_s"]
    assert perf["probe_share"] == pytest.approx(perf["probe_s"] / perf["wall_s"])
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["inputs"]["probe_every_s"] == every and cfg["executor"]["probe"]["every_s"] == every


@pytest.mark.parametrize("extra", [["--probe-every", "0"], ["--gpus", "2"]], ids=["off", "virtual-clock"])
def test_no_probes(tmp_path, extra):
    assert _execute(tmp_path, "n", "--time-scale", "1e6", *extra) == 0
    d = tmp_path / "n"
    assert not (d / "probes.csv").exists()
    perf = json.loads((d / "perf.json").read_text())
    assert perf["probes"] == 0 and perf["probe_s"] == 0 and perf["probe_share"] == 0
    assert json.loads((d / "config.json").read_text())["executor"]["probe"] is None


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_bad_probe_interval_is_refused(tmp_path, capsys, value):
    assert _execute(tmp_path, "b", "--probe-every", value) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--probe-every" in err[0]
    assert not (tmp_path / "b").exists()


class _Recording:
    """A policy that records (now_s, queued job indices) of every decision it is asked."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []
        self.name, self.timer_s = inner.name, getattr(inner, "timer_s", None)

    def decide(self, snap):
        actions = self.inner.decide(snap)
        self.seen.append((snap.now_s, tuple(j.index for j in snap.queue), repr(actions)))
        return actions


def test_a_decision_on_arrivals_sees_their_instant_and_orders_them_as_the_engine_does():
    """Three jobs arrive at one instant after an idle start; the wall clock wakes a little after it. The
    policy's clock for that decision is the instant (the engine decides there), and the policy orders
    them as the engine's replay does (H200 workload B, 2026-12-02: before this, the executor started job
    2 first, the replay job 1; tLoRA's urgency now breaks its zero-wait tie by runtime, so both orders
    agree even at the wall clock's instant, but the decision's clock must still be the arrivals')."""
    from dataclasses import replace

    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core.engine import Engine
    from tlora_sim.sim.executor.runtime import RealTimeExecutor

    jobs, cluster, cm, _, _ = _workload(3000.0)
    t1 = 0.2
    # job 0: longest and most tolerant, job 2 shortest (first by runtime, urgency's second key)
    jobs = [replace(jobs[1], submit_time_s=t1, total_steps=5, max_slowdown=2.0),
            replace(jobs[2], submit_time_s=t1, total_steps=4, max_slowdown=1.25),
            replace(jobs[3], submit_time_s=t1, total_steps=2, max_slowdown=1.25)]
    jobs = [replace(j, index=i, model=jobs[0].model) for i, j in enumerate(jobs)]
    assert len({j.isolated_runtime_s for j in jobs}) == 3
    policy = _Recording(make_policy("tlora", {}))
    RealTimeExecutor(jobs, cluster, cm, policy, _SleepTrainer()).run()
    at_arrival = [d for d in policy.seen if set(d[1]) >= {0, 1, 2}]
    assert at_arrival and at_arrival[0][0] == t1  # the instant itself, not the wall clock after it

    sim = _Recording(make_policy("tlora", {}))
    Engine(jobs, cluster, cm, sim).run()
    first_sim = [d for d in sim.seen if set(d[1]) >= {0, 1, 2}][0]
    assert at_arrival[0][1:] == first_sim[1:]  # the same queue and the same actions (which job starts)


def test_describe_names_the_probe_and_what_is_this_probe():
    assert what() == describe(PARAMS) == f"sim/executor/probe.py: 24x256 MLP fwd+bwd, median of {REPS}"
    # a run's config.json executor.probe (every_s, device and the probe's parameters) describes its probe
    assert describe({**PARAMS, "every_s": 2.0, "device": "cuda", "reps": 3}).endswith("median of 3")
    with pytest.raises(KeyError):
        describe({"layers": 24, "width": 256})
