"""The real-time executor and validate-run on the CPU (tiny shape; the Triton interpreter).

Real training steps run, so the tests check the machinery end to end: every job trains exactly
its total steps, steps.csv agrees with jobs.csv, regroups save and restore state (and their
pauses are logged), N simulated devices run groups side by side on the virtual clock, and the
simulator replays the identical workload into validation.csv. The trace is the built-in
synthetic one (no data files needed); every job arrives at once (--time-scale 1e6), so a queue
forms and groups form and change. Without torch, one test still runs: the executor with steps that
take the cost model's time reproduces the engine (the two backends agree)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest


def _need_torch():
    pytest.importorskip("triton")
    return pytest.importorskip("torch")

LORA = str(Path(__file__).resolve().parents[2] / "profiler" / "validation" / "lora_validation.json")
JOBS = 10
RUNS = {"independent": ("independent", 1), "mlora": ("mlora", 1), "mlora-2dev": ("mlora", 2),
        "independent-2dev": ("independent", 2)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch = _need_torch()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tlora_sim.sim.executor.execute import ExecuteConfig, execute

    root = tmp_path_factory.mktemp("exec")
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; two pytest workers' thread pools on two cores would thrash
    try:
        for name, (pol, gpus) in RUNS.items():
            cfg = ExecuteConfig(trace="synthetic:default", policy=pol, gpus=gpus, device="cpu", tiny=True, jobs=JOBS,
                                min_steps=3, max_steps=10, time_scale=1e6, lora_dist=LORA)
            execute(cfg, root / name, progress=False, plots=name == "mlora")
            out[name] = root / name
    finally:
        torch.set_num_threads(threads)
    return out


def _members(cell) -> list[int]:
    return [int(i) for i in str(cell).split(";")]


def test_every_job_trains_its_steps_and_the_logs_agree(runs):
    for name, d in runs.items():
        jobs = pd.read_csv(d / "jobs.csv").set_index("index")
        work = pd.read_csv(d / "workload.csv").set_index("index")
        steps = pd.read_csv(d / "steps.csv")
        assert len(jobs) == len(work) == JOBS
        assert (jobs.steps_trained == work.total_steps).all() and (jobs.finish_time_s.notna()).all()
        s = steps[steps.event == "step"]
        per_job = pd.Series([i for j in s.jobs for i in _members(j)]).value_counts().sort_index()
        assert per_job.tolist() == work.total_steps.tolist(), name  # every real step counted once per member
        assert (s.ms > 0).all() and (s.end_s >= s.start_s).all()
        for i, row in jobs.iterrows():  # a job's steps lie between its start and its finish, the last ends it
            mine = s[[i in _members(j) for j in s.jobs]]
            assert mine.start_s.min() >= row.start_time_s - 1e-9 and row.start_time_s >= row.submit_time_s - 1e-9
            assert mine.end_s.max() == pytest.approx(row.finish_time_s, abs=1e-9), (name, i)
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["executor"]["device"] == "cpu" and cfg["policy"] == RUNS[name][0]
        summary = json.loads((d / "summary.json").read_text())
        assert summary["executed"] and summary["steps_measured"] == len(s) and summary["jobs"] == JOBS
        assert math.isclose(summary["makespan_s"], jobs.finish_time_s.max() - jobs.submit_time_s.min())
    assert (runs["mlora"] / "figures").is_dir() and any((runs["mlora"] / "figures").glob("*.png"))


def test_grouping_policies_regroup_for_real_and_independent_never_does(runs):
    for name in ("independent", "independent-2dev"):
        jobs, steps = pd.read_csv(runs[name] / "jobs.csv"), pd.read_csv(runs[name] / "steps.csv")
        assert jobs.max_group_size.max() == 1 and not (steps.event == "regroup").any()
        assert (jobs.queue_s > 0).any()  # a queue formed
    for name in ("mlora", "mlora-2dev"):
        jobs, steps = pd.read_csv(runs[name] / "jobs.csv"), pd.read_csv(runs[name] / "steps.csv")
        regroups = steps[steps.event == "regroup"]
        assert jobs.max_group_size.max() > 1 and len(regroups) and (regroups.ms > 0).all()  # pauses measured
        assert (jobs.group_changes > 0).any()
        summary = json.loads((runs[name] / "summary.json").read_text())
        assert summary["regroups"] == len(regroups) and summary["regroup_pause_median_s"] > 0


def test_simulated_devices_run_side_by_side_on_the_virtual_clock(runs):
    d = runs["independent-2dev"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["cluster"] == "1x2xH100" and cfg["executor"]["clock"] == "virtual"
    steps = pd.read_csv(d / "steps.csv")
    s = steps[steps.event == "step"]
    assert set(s.devices.astype(str)) == {"0", "1"}
    for dev, rows in s.groupby(s.devices.astype(str)):  # one step at a time on each device
        rows = rows.sort_values("start_s")
        assert (rows.start_s.to_numpy()[1:] >= rows.end_s.to_numpy()[:-1] - 1e-12).all(), dev
        assert ((rows.end_s - rows.start_s) * 1e3 - rows.ms).abs().max() < 1e-6  # measured time charged
    d0, d1 = (s[s.devices.astype(str) == k] for k in ("0", "1"))
    overlap = max(0.0, min(d0.end_s.max(), d1.end_s.max()) - max(d0.start_s.min(), d1.start_s.min()))
    assert overlap > 0  # both devices busy at once although the CPU ran their steps one after another
    one = pd.read_csv(runs["independent"] / "jobs.csv")
    two = pd.read_csv(d / "jobs.csv")
    assert two.finish_time_s.max() < one.finish_time_s.max()  # twice the devices, shorter makespan


def test_adapter_state_survives_a_regroup():
    torch = _need_torch()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tlora_sim.sim.executor.trainer import DeviceTrainer

    t = DeviceTrainer("cpu", tiny=True)
    g = t.group("llama3-8b", "loop", [(0, 8, 1, 512), (1, 4, 1, 256)])
    g.step()
    g.save()
    saved = {k: v.clone() for k, v in t.states[0].A.items()}
    assert t.states[0].steps == 1 and t.states[0].mA  # weights and AdamW moments went to the host
    g2 = t.group("llama3-8b", "fused", [(1, 4, 1, 256), (0, 8, 1, 512)])  # another plan, another order
    a, _ = g2._pieces(g2.loras[0], "q", 1)
    assert torch.equal(a.detach().cpu(), saved[(0, "q")].to(a.dtype))
    p = g2.loras[0].A["q"]
    assert g2.opt.state[p]["exp_avg"][4:12].abs().sum() > 0  # job 0's moments, at its offset


def test_validate_run_replays_the_same_workload(runs, tmp_path):
    from tlora_sim.sim.cli.main import main
    from tlora_sim.sim.executor.validate import COLUMNS

    names = ["independent", "mlora"]
    assert main(["validate-run", *[str(runs[n]) for n in names], "--out", str(tmp_path / "v"), "--no-progress"]) == 0
    assert main(["validate-run", str(runs["mlora-2dev"]), "--out", str(tmp_path / "v2"), "--no-progress"]) == 0
    table = pd.concat([pd.read_csv(tmp_path / d / "validation.csv") for d in ("v", "v2")], ignore_index=True)
    assert list(table.columns[:len(COLUMNS)]) == COLUMNS
    assert list(table.policy) == ["independent", "mlora", "mlora"] and (table.jobs == JOBS).all()
    num = [c for c in COLUMNS[2:] if c not in ("avg_jct_error", "ratio_error", "ranking_kept")]
    assert table[num].map(math.isfinite).all().all() and (table[num] >= 0).all().all()
    assert (table.step_times == "measured").all() and (table.cpu_scale > 0).all()
    assert (table.table_hit_share > 0).all()  # the replay's steps were looked up in the run's measurements
    assert table.devices.tolist() == [1, 1, 2]
    per_job = pd.read_csv(tmp_path / "v" / "validation_jobs.csv")
    assert len(per_job) == 2 * JOBS and per_job.abs_error.notna().all()
    assert (tmp_path / "v" / "validation.png").is_file() and (tmp_path / "v" / "sim" / "mlora" / "jobs.csv").is_file()
    # the profiled model at the CPU's pace, on request
    assert main(["validate-run", str(runs["independent"]), "--out", str(tmp_path / "p"), "--step-times", "profiled",
                 "--no-progress"]) == 0
    assert pd.read_csv(tmp_path / "p" / "validation.csv").step_times.tolist() == ["profiled"]


def test_clear_errors(runs, tmp_path):
    from tlora_sim.sim.cli.main import main

    (tmp_path / "empty").mkdir()
    assert main(["validate-run", str(tmp_path / "empty"), "--out", str(tmp_path / "w")]) == 2
    assert main(["execute", "--trace", "synthetic:default", "--policy", "mlora", "--device", "cuda", "--gpus", "2",
                 "--out", str(tmp_path / "x")]) == 2
    assert main(["execute", "--trace", "synthetic:default", "--policy", "mlora", "--device", "cpu", "--tiny",
                 "--max-steps", "2", "--min-steps", "3", "--out", str(tmp_path / "y")]) == 2
    assert not (tmp_path / "w").exists() and not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


class _ModelledGroup:
    """A group whose steps take the cost model's time and whose build and save take the owner's
    (nothing trains); each build and save also sleeps the owner's ``sleep_s`` of host time."""

    def __init__(self, owner, model, plan, members):
        self.o, self.model, self.plan = owner, model, plan
        self.members = tuple(owner.jobs[m[0]].member for m in members)
        self.build_ms = owner.build_ms
        time.sleep(owner.sleep_s)

    def step(self, nano: int = 1, micro: int = 1) -> float:
        return self.o.cm.step_time_s(self.model, self.o.gpu, self.members, 1, self.plan, nano, micro) * 1e3

    def save(self) -> float:
        time.sleep(self.o.sleep_s)
        return self.o.save_ms


class _ModelledTrainer:
    def __init__(self, jobs, cm, gpu, build_ms: float = 0.0, save_ms: float = 0.0, sleep_s: float = 0.0):
        self.jobs, self.cm, self.gpu = jobs, cm, gpu
        self.build_ms, self.save_ms, self.sleep_s = build_ms, save_ms, sleep_s

    def group(self, model, plan, members):
        return _ModelledGroup(self, model, plan, members)

    def release(self) -> None:
        pass


def _modelled_run(policy: str, n_gpus: int, jobs: int = 24, **trainer):
    """(jobs table, steps log) of the executor on the virtual clock over ``jobs`` synthetic jobs
    on 1 x ``n_gpus`` x H100 with a ``_ModelledTrainer(**trainer)``; and the engine's inputs."""
    from dataclasses import replace

    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.executor.clock import VirtualClock
    from tlora_sim.sim.executor.execute import ExecuteConfig
    from tlora_sim.sim.executor.runtime import RealTimeExecutor
    from tlora_sim.sim.executor.workload import scaled_workload

    cfg = ExecuteConfig(trace="synthetic:default", policy=policy, jobs=jobs, time_scale=300, lora_dist=LORA)
    js, cluster, cm, _, _ = scaled_workload(cfg, "H100")
    c = replace(parse_cluster(f"1x{n_gpus}xH100"), gpu=cluster.gpu)
    ex = RealTimeExecutor(js, c, cm, make_policy(policy, {}), _ModelledTrainer(js, cm, "H100", **trainer),
                          clock=VirtualClock())
    return metrics.jobs_table(ex.run()), pd.DataFrame(ex.log), (js, c, cm)


@pytest.mark.parametrize("policy", ["independent", "mlora", "tlora", "lorafusion"])
def test_the_executor_reproduces_the_engine_when_steps_take_the_modelled_time(policy):
    """Same policy object type, same jobs, steps lasting exactly the cost model's step time, no
    rebuild cost: the executor's virtual clock and the SimPy engine agree (exactly for independent;
    within the discreteness of whole steps where groups change). The virtual clock charges the
    trainer's reported build and save costs (0 here), not the host's time, so the bound holds on a
    loaded machine."""
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.engine import Engine, PauseOptions

    for n in (1, 2):
        real, _, (jobs, c, cm) = _modelled_run(policy, n)
        sim = metrics.jobs_table(Engine(jobs, c, cm, make_policy(policy, {}), regroup_pause_s=0.0,
                                        pauses=PauseOptions(pause_on_finish=True)).run())
        err = (real.jct_s - sim.jct_s).abs() / sim.jct_s
        assert real.steps_trained.tolist() == pytest.approx(sim.steps_trained.tolist(), abs=1e-6)
        assert real.jct_s.mean() == pytest.approx(sim.jct_s.mean(), rel=1e-12 if policy == "independent" else 0.05)
        if policy == "independent":
            assert err.max() < 1e-12, (policy, n)  # float rounding of the step sums only (~1e-14)
        else:
            # The executor acts at whole-step boundaries, the engine at the event itself, so a
            # grouping decision can go another way (start times apart by more than a step) and the
            # schedules part from there: with the H100 artifact of 2026-11-26, tlora on one GPU,
            # job 6 joins at 22.9 s in the engine and waits until 35.9 s in the executor (mean JCT
            # +3.4%). Until the first such decision they agree within whole steps.
            split = (real.start_time_s - sim.start_time_s).abs() > 1.0
            t_split = sim.start_time_s[split].min() if split.any() else float("inf")
            before = sim.finish_time_s < t_split
            assert before.sum() >= len(sim) // 4, (policy, n, t_split)  # enough of the run agrees to check
            assert err[before].max() < 0.05, (policy, n)
        assert real.max_group_size.max() == sim.max_group_size.max()


def test_the_virtual_clock_charges_the_trainers_rebuild_costs_not_the_hosts_time():
    """Builds and saves that take 50 ms of host time each (a loaded machine, a slow copy) but are
    modelled at 30 ms and 20 ms: the virtual clock charges 30 ms per build and 30 + 20 ms per
    regroup (steps.csv ``ms``) and gives the same JCTs as a trainer that does not sleep."""
    fast, fast_log, _ = _modelled_run("mlora", 2, jobs=8, build_ms=30.0, save_ms=20.0)
    slow, slow_log, _ = _modelled_run("mlora", 2, jobs=8, build_ms=30.0, save_ms=20.0, sleep_s=0.05)
    pd.testing.assert_frame_equal(slow, fast)
    pd.testing.assert_frame_equal(slow_log, fast_log)
    rebuilds = slow_log[slow_log.event != "step"]
    assert (rebuilds.event == "regroup").any()
    assert rebuilds[rebuilds.event == "start"].ms.tolist() == pytest.approx([30.0] * (rebuilds.event == "start").sum())
    assert rebuilds[rebuilds.event == "regroup"].ms.tolist() == pytest.approx([50.0] * (rebuilds.event == "regroup").sum())


def test_a_modelled_build_cost_is_the_engines_start_pause():
    """Under independent every job's group is built once (never saved): with builds modelled at
    250 ms the executor's JCTs are the engine's with a 0.25-s ``start_pause_s``."""
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.engine import Engine, PauseOptions

    for n in (1, 2):
        real, log, (jobs, c, cm) = _modelled_run("independent", n, jobs=12, build_ms=250.0, save_ms=1e6)
        sim = metrics.jobs_table(Engine(jobs, c, cm, make_policy("independent", {}), regroup_pause_s=0.0,
                                        pauses=PauseOptions(start_pause_s=0.25, pause_on_finish=True)).run())
        assert set(log.event) == {"start", "step"}
        assert ((real.jct_s - sim.jct_s).abs() / sim.jct_s).max() < 1e-12, n
        base, _, _ = _modelled_run("independent", n, jobs=12)
        assert (real.jct_s > base.jct_s).all()  # the pause is paid


def test_a_trainer_that_does_not_say_what_a_build_costs_is_refused_on_the_virtual_clock():
    with pytest.raises(ValueError, match="build_ms = None"):
        _modelled_run("independent", 2, jobs=2, build_ms=None)
