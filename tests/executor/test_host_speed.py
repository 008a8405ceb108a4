"""validate-run follows the machine's host speed through a run (issue 43): the host factor series
of a run's probes.csv (window, quantisation, piecewise constant), the engine's re-timing instants
(``Engine(retime_at=...)``), the time-varying step model against a fixed one, and when ``auto``
turns it on. Inputs: copies of the committed H200 runs (profiler/data/validation/h200_2026-12-01/B)
with a probes.csv written here, and a copy of the shipped H200 artifact with a probe reference."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import CM, cluster, policy
from tlora_sim.sim.cli.main import main
from tlora_sim.sim.core.engine import Engine
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path
from tlora_sim.sim.executor import host_speed as hs
from tlora_sim.sim.executor.validate import HOST_COLUMNS, host_speed_mode, simulate
from tlora_sim.traces.errors import InputError

RUNS = Path(__file__).resolve().parents[2] / "profiler" / "data" / "validation" / "h200_2026-12-01" / "B"
REF_MS = 4.0


@pytest.fixture(scope="module")
def art_file(tmp_path_factory) -> Path:
    """The shipped H200 artifact with ``calibration.probe.ref_ms`` = REF_MS."""
    art = json.loads(artifact_path("H200").read_text())
    art.setdefault("calibration", {})["probe"] = {"ref_ms": REF_MS}
    p = tmp_path_factory.mktemp("art") / "h200_ref.json"
    p.write_text(json.dumps(art))
    return p


def _run_with_probes(tmp_path: Path, policy_name: str, factor, name: str | None = None, end_s: float = 200.0) -> Path:
    """A copy of B/<policy_name> with probes every 2 s of ``factor(t) * REF_MS`` (``factor``: a
    number or a function of t)."""
    d = tmp_path / (name or policy_name)
    shutil.copytree(RUNS / policy_name, d)
    t = np.arange(0.0, end_s, 2.0)
    f = np.array([factor(x) for x in t]) if callable(factor) else np.full(len(t), float(factor))
    pd.DataFrame({"t_s": t, "probe_ms": f * REF_MS, "python_ms": 20.0}).to_csv(d / hs.PROBES, index=False)
    return d


# ---- the factor series -----------------------------------------------------------------------------
def test_factor_series_window_quantum_and_steps(tmp_path):
    p = tmp_path / "probes.csv"
    # rows out of order on purpose; t = 0, 2, 4, 6, 20, 30
    pd.DataFrame({"t_s": [4, 0, 2, 6, 20, 30], "probe_ms": [14, 10, 12, 30, 11, 10.26],
                  "python_ms": 1.0}).to_csv(p, index=False)
    probes = hs.read_probes(p)
    assert probes.t_s.tolist() == [0, 2, 4, 6, 20, 30]
    s = hs.factor_series(probes, 10.0, window_s=2.5)
    # medians over |t - t_k| <= 2.5: {10,12}, {10,12,14}, {12,14,30}, {14,30}, {11}, {10.26}
    assert s.factors == (1.1, 1.2, 1.4, 2.2, 1.1, 1.025)  # 1.026 -> the nearest 0.5%
    assert hs.factor_series(probes, 10.0, window_s=0).factors == (1.0, 1.2, 1.4, 3.0, 1.1, 1.025)
    assert hs.factor_series(probes, 10.0, window_s=100).factors == (1.15,) * 6  # all six: (11 + 12) / 2
    # piecewise constant: the first value before the first probe, then each probe's from its t_s on
    assert [s.at(t) for t in (-5, 0, 1.999, 2, 5.9, 6, 19, 20, 29.9, 30, 1e6)] == \
        [1.1, 1.1, 1.1, 1.2, 1.4, 2.2, 2.2, 1.1, 1.1, 1.025, 1.025]
    assert s.instants() == [2.0, 4.0, 6.0, 20.0, 30.0]
    # a factor is one float per 0.5% step: quantising it again gives the same float
    assert all(hs.quantise(f) == f for f in s.factors) and hs.quantise(1.1 + 1e-9) == s.factors[0]
    assert hs.quantise(1.0074) == 1.005 and hs.quantise(1.0076) == 1.01
    assert s.quantiles() == pytest.approx((np.quantile(s.factors, 0.1), np.median(s.factors),
                                           np.quantile(s.factors, 0.9)))


def test_bad_probes_are_refused_in_one_line(tmp_path):
    p = tmp_path / "probes.csv"
    pd.DataFrame({"t_s": [0, 2, 4], "probe_ms": [3.0, -1.0, 3.0]}).to_csv(p, index=False)
    with pytest.raises(InputError) as e:
        hs.read_probes(p)
    assert e.value.row == 3 and e.value.field == "probe_ms"
    pd.DataFrame({"t": [0.0], "probe_ms": [3.0]}).to_csv(p, index=False)
    with pytest.raises(InputError, match="lacks column"):
        hs.read_probes(p)
    probes = pd.DataFrame({"t_s": [0.0], "probe_ms": [3.0]})
    for w in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError) as e:
            hs.factor_series(probes, 3.0, w)
        assert e.value.field == "--probe-window"


# ---- the engine's re-timing instants ----------------------------------------------------------------
def _jobs_60():
    from tlora_sim.sim.core.workload import build_jobs
    from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload

    _, spec_cluster, _, frame, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=60,seed=3", policy="tlora",
                                                               cluster="4x8xH100"))
    jobs, _ = build_jobs(frame, spec_cluster, CM)
    return jobs


def test_retime_at_with_a_fixed_model_changes_nothing_but_float_noise():
    jobs = _jobs_60()
    plain = Engine(jobs, cluster("4x8xH100"), CM, policy("tlora"), regroup_pause_s=30.0).run()
    end = max(r.finish_s for r in plain.records)
    times = list(np.linspace(0.0, end * 1.2, 97))
    timed = Engine(jobs, cluster("4x8xH100"), CM, policy("tlora"), regroup_pause_s=30.0, retime_at=times).run()
    assert [r.finish_s for r in timed.records] == pytest.approx([r.finish_s for r in plain.records], rel=1e-9)
    assert [r.start_s for r in timed.records] == pytest.approx([r.start_s for r in plain.records], rel=1e-9)
    assert timed.decisions == plain.decisions  # a re-timing is not a decision
    assert [r.group_changes for r in timed.records] == [r.group_changes for r in plain.records]
    # an empty retime_at is the plain engine
    empty = Engine(jobs, cluster("4x8xH100"), CM, policy("tlora"), regroup_pause_s=30.0, retime_at=()).run()
    assert empty.records == plain.records and empty.timeline == plain.timeline and empty.events == plain.events
    for bad in ([3.0, 1.0], [-1.0], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match="retime_at"):
            Engine(jobs, cluster("4x8xH100"), CM, policy("tlora"), retime_at=bad)


class _Switch:
    """A cost model whose step times are ``CM``'s, times 2 from ``at_s`` on the clock (``clock``)."""

    name = "switch"

    def __init__(self, at_s: float):
        self.at_s, self.clock = at_s, lambda: 0.0

    def step_time_s(self, *a, **k):
        return (2.0 if self.clock() >= self.at_s else 1.0) * CM.step_time_s(*a, **k)

    def memory_bytes(self, *a, **k):
        return CM.memory_bytes(*a, **k)

    def step_flops(self, *a, **k):
        return CM.step_flops(*a, **k)

    def batch(self, *a, **k):
        return None

    def describe(self):
        return {"name": self.name}


@pytest.mark.parametrize("retimed", [True, False])
def test_a_retime_instant_applies_the_new_step_time_to_running_groups(retimed):
    from conftest import make_job

    job = make_job(0, steps=100)
    step = CM.step_time_s(job.model, "H100", [job.member], 1, "alone")
    cm = _Switch(40 * step)
    eng = Engine([job], cluster("1x8xH100"), cm, policy("independent"), regroup_pause_s=0.0,
                 retime_at=[cm.at_s] if retimed else [])
    cm.clock = lambda: eng.env.now
    res = eng.run()
    # re-timed: 40 steps at 1x, then 60 at 2x; without the instant the group keeps its step time
    assert res.records[0].finish_s == pytest.approx((40 + 60 * 2) * step if retimed else 100 * step, rel=1e-12)
    assert res.decisions == 1


# ---- the time-varying step model in validate-run -----------------------------------------------------
@pytest.mark.parametrize("pol", ["independent", "tlora"])
def test_a_constant_factor_equals_the_model_at_that_host_speed(tmp_path, art_file, pol):
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    f = 1.37
    d = _run_with_probes(tmp_path, pol, f)
    row, both, _ = simulate(d, artifact=art_file, host_speed="probes")
    assert row["host_speed"] == "probes" and row["host_factor_median"] == hs.quantise(f) == 1.37
    art = json.loads(art_file.read_text())
    fixed = ProfiledCostModel(hs.speed_artifact(art, f), checkpointing=False)
    row2, both2, _ = simulate(d, artifact=art_file, host_speed="off", step_model=fixed)
    assert row2["host_speed"] == "off" and math.isnan(row2["host_factor_median"])
    assert both.jct_s_sim.tolist() == pytest.approx(both2.jct_s_sim.tolist(), rel=1e-9)
    assert row["regroup_pause_s"] == pytest.approx(row2["regroup_pause_s"], rel=1e-12)
    # and a slower host than the calibration's makes every job longer than at the artifact's speed
    row1, both1, _ = simulate(d, artifact=art_file, host_speed="off")
    assert (both.jct_s_sim > both1.jct_s_sim).all()


def test_a_factor_rising_mid_run_lengthens_only_the_jobs_running_after_it(tmp_path, art_file):
    t_up = 60.0
    flat = _run_with_probes(tmp_path, "independent", 1.0, "flat")
    rise = _run_with_probes(tmp_path, "independent", lambda t: 1.0 if t < t_up else 1.5, "rise")
    _, a, _ = simulate(flat, artifact=art_file, host_speed="probes", probe_window_s=0)
    row, b, _ = simulate(rise, artifact=art_file, host_speed="probes", probe_window_s=0)
    assert row["host_factor_p10"] == 1.0 and row["host_factor_p90"] == 1.5
    before = a.finish_time_s_sim <= t_up
    assert before.sum() >= 2 and (~before).sum() >= 2  # the rise splits the run
    assert b.jct_s_sim[before].tolist() == pytest.approx(a.jct_s_sim[before].tolist(), rel=1e-9)
    assert (b.jct_s_sim[~before] > a.jct_s_sim[~before]).all()
    late = a.finish_time_s_sim > t_up + 10
    assert late.sum() >= 2 and (b.jct_s_sim[late] > a.jct_s_sim[late] * 1.01).all()


def test_a_cpu_run_with_profiled_steps_follows_the_factor_at_its_pace(tmp_path, art_file):
    """A CPU run's profiled step times are the profile at the run's pace (``cpu_scale``); with host
    speed, the profile at each factor at that pace. (The B run relabelled as a CPU run.)"""
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
    from tlora_sim.sim.executor.steptable import ScaledCostModel

    d = _run_with_probes(tmp_path, "independent", 1.2)
    cfg = json.loads((d / "config.json").read_text())
    cfg["executor"]["device"] = "cpu"
    (d / "config.json").write_text(json.dumps(cfg))
    assert host_speed_mode([d], "auto", artifact=art_file) == "off"  # auto: measured steps on a CPU run
    row, both, _ = simulate(d, artifact=art_file, step_times="profiled", host_speed="probes")
    assert row["host_speed"] == "probes" and row["cpu_scale"] != 1.0
    fixed = ScaledCostModel(ProfiledCostModel(hs.speed_artifact(json.loads(art_file.read_text()), 1.2),
                                              checkpointing=False), row["cpu_scale"])
    _, both2, _ = simulate(d, artifact=art_file, step_times="profiled", host_speed="off", step_model=fixed)
    assert both.jct_s_sim.tolist() == pytest.approx(both2.jct_s_sim.tolist(), rel=1e-9)


# ---- when auto turns it on ------------------------------------------------------------------------
def test_auto_is_off_without_a_reference_or_without_probes_and_probes_says_what_is_missing(tmp_path, art_file):
    with_probes = _run_with_probes(tmp_path, "independent", 1.2)
    other = _run_with_probes(tmp_path, "mlora", 1.2)
    bare = RUNS / "mlora"  # no probes.csv
    assert host_speed_mode([with_probes, other], "auto", artifact=art_file) == "probes"
    assert host_speed_mode([with_probes], "auto") == "off"  # the shipped artifact has no reference
    assert host_speed_mode([with_probes, bare], "auto", artifact=art_file) == "off"  # not every run has probes
    assert host_speed_mode([with_probes], "auto", step_times="measured", artifact=art_file) == "off"
    assert host_speed_mode([with_probes], "probes", step_times="measured", artifact=art_file) == "off"
    assert host_speed_mode([with_probes], "off", artifact=art_file) == "off"
    with pytest.raises(InputError) as e:
        host_speed_mode([with_probes], "probes")
    assert e.value.field == hs.REF_FIELD and e.value.file.endswith("costmodel_h200.json")
    with pytest.raises(InputError) as e:
        host_speed_mode([with_probes, bare], "probes", artifact=art_file)
    assert e.value.file == str(bare / hs.PROBES)
    empty = tmp_path / "empty"
    shutil.copytree(RUNS / "tlora", empty)
    (empty / hs.PROBES).write_text("t_s,probe_ms,python_ms\n")
    assert host_speed_mode([with_probes, empty], "auto", artifact=art_file) == "off"
    with pytest.raises(InputError, match="no probe row"):
        host_speed_mode([empty], "probes", artifact=art_file)
    with pytest.raises(InputError) as e:
        host_speed_mode([with_probes], "sometimes", artifact=art_file)
    assert e.value.field == "--host-speed"


def test_a_run_of_another_probe_than_the_calibration_is_refused(tmp_path, art_file):
    """A calibration and a run that timed different probes (another REPS) have ms that cannot be
    compared: refused in both modes, naming the run's config.json; the same probe passes."""
    from tlora_sim.sim.executor.probe import PARAMS, describe

    art = json.loads(art_file.read_text())
    art["calibration"]["probe"]["what"] = describe(PARAMS)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(art))
    runs = []
    for name, reps in (("same", PARAMS["reps"]), ("other", 3 if PARAMS["reps"] != 3 else 5)):
        d = _run_with_probes(tmp_path, "independent", 1.1, name=name)
        cfg = json.loads((d / "config.json").read_text())
        cfg["executor"]["probe"] = {"every_s": 2.0, "device": "cuda", **PARAMS, "reps": reps}
        (d / "config.json").write_text(json.dumps(cfg))
        runs.append(d)
    assert host_speed_mode(runs[:1], "auto", artifact=cal) == "probes"
    for mode in ("auto", "probes"):
        with pytest.raises(InputError) as e:
            host_speed_mode(runs, mode, artifact=cal)
        assert e.value.file == str(runs[1] / "config.json") and e.value.field == "executor.probe"
        assert "median of" in str(e.value)
    assert host_speed_mode(runs, "off", artifact=cal) == "off"
    assert host_speed_mode(runs, "auto", artifact=art_file) == "probes"  # no description: not compared


def test_cli_records_and_prints_the_host_speed(tmp_path, art_file, capsys):
    a = _run_with_probes(tmp_path, "independent", lambda t: 1.0 + (t > 50) * 0.2)
    b = _run_with_probes(tmp_path, "mlora", 1.1)
    assert main(["validate-run", str(a), str(b), "--out", str(tmp_path / "v"), "--no-progress",
                 "--artifact", str(art_file)]) == 0
    t = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert set(HOST_COLUMNS) <= set(t.columns) and (t.host_speed == "probes").all()
    assert t.host_factor_median.tolist() == [1.2, 1.1]
    out = capsys.readouterr().out
    assert "host speed: probes" in out and "mlora 1.100 / 1.100 / 1.100" in out
    assert main(["validate-run", str(a), str(RUNS / "mlora"), "--out", str(tmp_path / "w"), "--no-progress",
                 "--artifact", str(art_file)]) == 0  # auto: one run has no probes -> off
    t = pd.read_csv(tmp_path / "w" / "validation.csv")
    assert (t.host_speed == "off").all() and t.host_factor_p10.isna().all()
    assert "host speed: off" in capsys.readouterr().out
    assert main(["validate-run", str(a), str(RUNS / "mlora"), "--out", str(tmp_path / "x"), "--no-progress",
                 "--artifact", str(art_file), "--host-speed", "probes"]) == 2
    assert "probes.csv" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["validate-run", str(a), "--out", str(tmp_path / "y"), "--no-progress", "--artifact",
                 str(art_file), "--probe-window", "-3"]) == 2


def test_probe_columns_are_the_probes():
    torch = pytest.importorskip("torch")  # noqa: F841
    from tlora_sim.sim.executor.probe import COLUMNS

    assert set(hs.NEED) <= set(COLUMNS)


# ---- what the probes cost the run's steps ----------------------------------------------------------
def test_probe_pause_counts_only_the_probes_taken_while_a_group_ran():
    # two groups busy over [0, 10] and [8, 12] (one busy stretch of 12 s), one over [20, 30]
    steps = pd.DataFrame({"group_id": [0, 0, 1, 1, 2], "start_s": [0.0, 5.0, 8.0, 9.0, 20.0],
                          "end_s": [5.0, 10.0, 9.0, 12.0, 30.0]})
    stretch, n = hs.probe_pause(steps, [1.0, 11.0, 15.0, 25.0, 40.0], 0.1)  # 15 and 40: devices idle
    assert n == 3 and stretch == pytest.approx(22.0 / (22.0 - 0.3), rel=1e-12)
    assert hs.probe_pause(steps, [], 0.1) == (1.0, 0) and hs.probe_pause(steps, [1.0], 0.0) == (1.0, 0)
    assert hs.probe_pause(steps.iloc[:0], [1.0], 0.1) == (1.0, 0)


def test_validate_run_adds_back_what_the_runs_probes_paused(tmp_path, art_file):
    """A run whose perf.json says each probe took 50 ms: the replay's step times are stretched by
    the busy probes' share (every job later than with ``probe_cost=False``, by at most the
    stretch); a run without probes in perf.json is not stretched."""
    d = _run_with_probes(tmp_path, "independent", 1.0)
    n = len(pd.read_csv(d / hs.PROBES))
    perf = json.loads((d / "perf.json").read_text())
    (d / "perf.json").write_text(json.dumps({**perf, "probes": n, "probe_s": 0.05 * n}))
    row, both, _ = simulate(d, artifact=art_file, host_speed="off")
    row0, both0, _ = simulate(d, artifact=art_file, host_speed="off", probe_cost=False)
    assert row["busy_probes"] > 0 and row["probe_stretch"] > 1.001
    assert row0["probe_stretch"] == 1.0 and row0["busy_probes"] == 0
    assert (both.jct_s_sim > both0.jct_s_sim).all()
    assert (both.jct_s_sim <= both0.jct_s_sim * row["probe_stretch"] * (1 + 1e-9)).all()
    (d / "perf.json").write_text(json.dumps({**perf, "probes": 0, "probe_s": 0.0}))
    row1, both1, _ = simulate(d, artifact=art_file, host_speed="off")
    assert row1["probe_stretch"] == 1.0 and both1.jct_s_sim.tolist() == both0.jct_s_sim.tolist()


# ---- the replay's policy plans with the run's own model ------------------------------------------
def test_the_replay_plans_with_the_runs_model_whatever_artifact_gives_the_step_times(tmp_path, monkeypatch):
    """A tLoRA run planned with the shipped H200 artifact, validated with ``--artifact`` of a machine
    whose fused host terms are 3x: the engine's step times are that artifact's, but the policy is
    handed the run's own model (the shipped one; before, it planned with ``--artifact`` and grouped
    otherwise than the run did); a run whose artifact is nowhere to be found plans with
    ``--artifact``'s, flagged (``planning_as_run`` False)."""
    from tlora_sim.profiler.calibrate import derive, write_artifact
    from tlora_sim.sim.executor import planning as planning_mod

    run = Path(__file__).resolve().parents[2] / "profiler" / "data" / "validation" / "h200_2026-12-02b" / "B" / "tlora"
    cfg = json.loads((run / "config.json").read_text())
    slow = derive(json.loads(artifact_path("H200").read_text()), {"host_fused": 3.0})
    slow["id"] = "h200-test-slow-fused"
    path = tmp_path / "slow.json"
    write_artifact(slow, path)
    told = []
    real_init = planning_mod.PlanningPolicy.__init__

    def spy(self, inner, model, *a, **k):
        told.append(model.artifact["id"])
        real_init(self, inner, model, *a, **k)

    monkeypatch.setattr(planning_mod.PlanningPolicy, "__init__", spy)
    row, both, _ = simulate(run, artifact=path, host_speed="off", probe_cost=False)
    assert row["cost_model"] == "h200-test-slow-fused"
    assert told == [cfg["cost_model"]["artifact"]] == [row["planning_cost_model"]] and row["planning_as_run"]
    fast, _, _ = simulate(run, host_speed="off", probe_cost=False)
    assert row["sim_avg_jct_s"] > 1.2 * fast["sim_avg_jct_s"]  # the slow step times did reach the engine
    cfg["cost_model"]["artifact"] = "h200-not-here"
    other = tmp_path / "other"
    shutil.copytree(run, other)
    (other / "config.json").write_text(json.dumps(cfg))
    told.clear()
    lost, _, _ = simulate(other, artifact=path, host_speed="off", probe_cost=False)
    # said, not silent; the policy then plans with the engine's own model (no planning wrapper)
    assert not lost["planning_as_run"] and lost["planning_cost_model"] == "h200-test-slow-fused" and told == []
