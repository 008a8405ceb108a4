"""Smoke test of ``bench/replay.py --quick`` (no timing assertions: the numbers are machine-dependent)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tlora_sim.sim.core.decision_stats import CPU_ALL, CPU_SAMPLE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "replay.py"
CONTENDED = ["itp-all-sized", "philly", "load-0.5", "load-0.7", "load-0.9", "load-1.0", "load-1.1", "load-1.2",
             "load-1.5", "load-2.0"]


@pytest.fixture(scope="module")
def bench():
    """``bench/replay.py`` imported as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_replay_under_test", SCRIPT)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look the module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _plan(bench, tmp_path, cases, **extra):
    ap = argparse.ArgumentParser(prog="replay.py")
    args = argparse.Namespace(cases=cases, quick=False, policies="independent", tag="t", out_dir=tmp_path,
                              itp_dir=tmp_path, philly=None, **extra)
    return bench.plan_runs(ap, args, "replay", bench.DEFAULT_CASES)


def test_help_lists_the_cases():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for case in ("itp02", "itp04", "itp-all", "synthetic-10k", "synthetic-100k", "synthetic-1M", *CONTENDED):
        assert case in r.stdout
    assert "--philly" in r.stdout and "contended = " + ",".join(CONTENDED) in r.stdout


def test_quick_run_writes_one_row_per_policy_and_replaces_on_rerun(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--quick", "--policies", "independent,tlora", "--out-dir", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "replay_quick.csv"
    df = pd.read_csv(path)
    assert df[["case", "policy"]].values.tolist() == [["quick", "independent"], ["quick", "tlora"]]
    assert (df["status"] == "ok").all() and (df["jobs"] == 300).all()
    for col in ("wall_s", "jobs_per_s", "events_per_s", "decision_ms", "peak_rss_mb", "cpu_s"):
        assert (df[col] > 0).all(), col
    assert df["commit"].notna().all() and df["date"].str.endswith("Z").all()
    # queue columns, appended after the older ones (older files keep loading)
    assert list(df.columns[-7:]) == ["queue_mean", "queue_max", "decision_ms_q_flat", "decision_ms_by_queue",
                                     "decision_cpu_ms_q_flat", "decision_idle_ms_q_flat", "placed_ms_q_flat"]
    assert (df["queue_mean"] >= 0).all() and (df["queue_max"] >= df["queue_mean"]).all()
    assert (df["queue_max"] > 0).all()  # 300 jobs at load 0.7 on 32 GPUs: some wait
    for _, row in df.iterrows():
        by_queue = json.loads(row["decision_ms_by_queue"])
        assert sum(v["decisions"] for v in by_queue.values()) == row["decisions"]
        assert all(set(v) == {"decisions", "mean_queue", "ms_per_call", "cpu_ms_per_call", "cpu_timed",
                              "idle_decisions", "placed_jobs", "idle_ms_per_call", "ms_per_placed_job",
                              "idle_cpu_ms_per_call", "cpu_ms_per_placed_job"}
                   for v in by_queue.values())
        assert all(v["idle_decisions"] <= v["decisions"] for v in by_queue.values())
        # a decision with an empty queue places nothing; every job is placed at least once
        assert by_queue.get("0", {}).get("placed_jobs", 0) == 0
        placed = sum(v["placed_jobs"] for v in by_queue.values())
        assert placed == 300 if row["policy"] == "independent" else placed >= 300
        # decisions that placed jobs cost more than those that only looked at the queue
        assert any(v["ms_per_placed_job"] > 0 for v in by_queue.values())
        # the engine CPU-times the first CPU_ALL decisions of each decade, then every CPU_SAMPLE-th
        assert all(v["cpu_timed"] == min(v["decisions"], CPU_ALL) + len(range(CPU_ALL, v["decisions"], CPU_SAMPLE))
                   for v in by_queue.values())
        assert any(v["decisions"] > CPU_ALL for v in by_queue.values())  # the sampled branch ran
        assert all(v["ms_per_call"] > 0 for v in by_queue.values())
    # same case + policy again: the row is replaced, not appended
    r = subprocess.run(cmd[:4] + ["independent"] + cmd[5:], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(pd.read_csv(path)) == 2


def test_unknown_case_is_rejected(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "nope", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown case" in r.stderr


def test_contended_group_expands_to_the_ten_cases(bench, tmp_path):
    table, names, *_ = _plan(bench, tmp_path, "contended")
    assert names == CONTENDED
    # with other cases: groups expanded in place, each case once, `--cases a,b` unchanged
    assert _plan(bench, tmp_path, "itp02,load-0.9,contended")[1] == ["itp02", "load-0.9", *[
        c for c in CONTENDED if c != "load-0.9"]]
    assert _plan(bench, tmp_path, "itp02,synthetic-10k")[1] == ["itp02", "synthetic-10k"]
    assert table["itp-all-sized"].trace == "itp:{itp}" and table["itp-all-sized"].cluster == "142x8xH100"
    assert table["philly"].trace == "philly:{philly}" and table["philly"].cluster == "48x8xH100"
    for load in ("0.5", "0.7", "0.9", "1.0", "1.1", "1.2", "1.5", "2.0"):
        c = table[f"load-{load}"]
        assert (c.trace, c.cluster) == (f"synthetic:jobs=20000,seed=1,gpus=128,load={load}", "16x8xH100")
    # the default list is unchanged
    assert _plan(bench, tmp_path, None)[1] == ["itp02", "itp04", "itp-all", "synthetic-10k", "synthetic-100k"]


def test_philly_without_a_trace_is_skipped_not_failed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TLORA_PHILLY"}
    status = "skipped: no Philly trace (--philly PATH or TLORA_PHILLY)"
    for extra, why in (([], "neither --philly nor $TLORA_PHILLY is set"),
                       (["--philly", str(tmp_path / "missing.csv")], "missing.csv is not a file")):
        r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "philly", "--policies", "independent",
                            "--out-dir", str(tmp_path), *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert "case philly: skipped" in r.stdout and why in r.stdout
        df = pd.read_csv(tmp_path / next(p.name for p in tmp_path.glob("replay_*.csv")))
        assert df[["case", "policy", "status"]].values.tolist() == [["philly", "independent", status]]
        assert df["wall_s"].isna().all() and df["cluster"].eq("48x8xH100").all()
    # the environment variable is read too (a path that is not a file: still skipped)
    env["TLORA_PHILLY"] = str(tmp_path)
    r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "philly", "--policies", "independent",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"{tmp_path} is not a file" in r.stdout


def test_philly_path_from_option_or_environment(bench, tmp_path, monkeypatch):
    f = tmp_path / "philly.csv"
    f.write_text("timestamp,duration,num_gpus\n2017-10-03 10:00:00,60,1\n")
    monkeypatch.delenv("TLORA_PHILLY", raising=False)
    assert bench.philly_path(None) is None and bench.philly_path(tmp_path) is None
    assert bench.philly_path(f) == f.resolve()
    monkeypatch.setenv("TLORA_PHILLY", str(f))
    assert bench.philly_path(None) == f.resolve()
    assert bench.philly_path(tmp_path / "other.csv") is None  # the option wins over the environment


def test_queue_stats_are_time_weighted(bench, tmp_path):
    path = tmp_path / "timeline.csv"
    # 2 queued for 10 s, 5 for 20 s, then 0 at the end: mean (2*10 + 5*20) / 30 = 4
    pd.DataFrame({"time_s": [0.0, 10.0, 30.0], "queued_jobs": [2, 5, 0], "running_jobs": [1, 1, 0]}).to_csv(path)
    assert bench.queue_stats(path) == {"queue_mean": 4.0, "queue_max": 5}
    pd.DataFrame({"time_s": [3.0], "queued_jobs": [7]}).to_csv(path)  # no time spanned: the plain mean
    assert bench.queue_stats(path) == {"queue_mean": 7.0, "queue_max": 7}


def test_decision_flatness(bench):
    def dec(n, ms):
        return {"decisions": n, "ms_per_call": ms, "mean_queue": 1.0}

    by_queue = {"0": dec(500, 0.1), "1-9": dec(50, 0.2), "10-99": dec(40, 0.5), "100-999": dec(30, 0.75),
                "1000-9999": dec(19, 9.0)}
    assert bench.decision_flatness(by_queue) == pytest.approx(1.5)  # 1000-9999 has too few decisions
    by_queue["1000-9999"] = dec(20, 1.0)
    assert bench.decision_flatness(by_queue) == pytest.approx(2.0)
    assert bench.decision_flatness({"1-9": dec(50, 0.2), "10-99": dec(40, 0.5)}) is None  # nothing above 99
    assert bench.decision_flatness({"100-999": dec(40, 0.5)}) is None  # no reference decade
    assert bench.decision_flatness({"10-99": dec(5, 0.5), "100-999": dec(40, 0.5)}) is None  # reference too small
    # the CPU-time ratio (decision_cpu_ms_q_flat) reads cpu_ms_per_call; rows without it give None
    cpu = {"10-99": {**dec(40, 0.9), "cpu_ms_per_call": 0.4}, "100-999": {**dec(30, 3.0), "cpu_ms_per_call": 0.6}}
    assert bench.decision_flatness(cpu, "cpu_ms_per_call") == pytest.approx(1.5)
    assert bench.decision_flatness(cpu) == pytest.approx(3.0 / 0.9)
    # the idle / placed split counts its own decisions or jobs (older rows have neither: None)
    split = {"10-99": {**dec(40, 0.9), "idle_decisions": 30, "idle_ms_per_call": 0.01,
                       "placed_jobs": 25, "ms_per_placed_job": 0.03},
             "100-999": {**dec(49, 3.0), "idle_decisions": 48, "idle_ms_per_call": 0.012,
                         "placed_jobs": 95, "ms_per_placed_job": 0.05}}
    assert bench.decision_flatness(split, "idle_ms_per_call", "idle_decisions") == pytest.approx(1.2)
    assert bench.decision_flatness(split, "ms_per_placed_job", "placed_jobs") == pytest.approx(0.05 / 0.03)
    split["10-99"]["placed_jobs"] = 19  # too few jobs placed in the reference decade
    assert bench.decision_flatness(split, "ms_per_placed_job", "placed_jobs") is None
    assert bench.decision_flatness(cpu, "idle_ms_per_call", "idle_decisions") is None
    assert bench.decision_flatness(by_queue, "cpu_ms_per_call") is None
    text = bench.compact_by_queue({"10-99": {"decisions": 3, "ms_per_call": 0.123456789, "mean_queue": 12.3456}})
    assert " " not in text and json.loads(text) == {"10-99": {"decisions": 3, "mean_queue": 12.35, "ms_per_call": 0.1235}}


def test_skipped_rows_never_replace_measured_ones(bench, tmp_path):
    path = tmp_path / "r.csv"
    skipped = {"case": "philly", "policy": "independent", "cost_model": "default", "status": bench.PHILLY_SKIPPED}
    ok = {"case": "philly", "policy": "independent", "cost_model": "profiled", "status": "ok", "wall_s": 1.0}
    bench.save(path, [skipped], list(bench.CASES))
    assert pd.read_csv(path)["status"].tolist() == [bench.PHILLY_SKIPPED]
    bench.save(path, [ok], list(bench.CASES))  # a measurement replaces the skipped row
    assert pd.read_csv(path)[["status", "wall_s"]].values.tolist() == [["ok", 1.0]]
    bench.save(path, [skipped], list(bench.CASES))  # and a later skip keeps it
    assert pd.read_csv(path)[["status", "wall_s"]].values.tolist() == [["ok", 1.0]]
    # an old file without the queue columns still loads and gains them at the end
    old = pd.read_csv(path).drop(columns=["queue_mean", "queue_max", "decision_ms_q_flat", "decision_ms_by_queue"])
    old.to_csv(path, index=False)
    bench.save(path, [{**ok, "policy": "mlora", "queue_mean": 2.5}], list(bench.CASES))
    df = pd.read_csv(path)
    assert df["policy"].tolist() == ["independent", "mlora"] and df["queue_mean"].tolist()[1] == 2.5


def test_philly_case_runs_with_a_trace_file(tmp_path):
    """A (tiny) Philly CSV given by a relative path reaches the child, which runs in the repository root."""
    f = tmp_path / "tiny_philly.csv"
    f.write_text("timestamp,duration,num_gpus,cluster\n2017-10-03 10:00:00,600,8,vc1\n"
                 "2017-10-03 10:05:00,1200,1,vc2\n2017-10-03 10:06:00,300,2,vc1\n")
    env = {k: v for k, v in os.environ.items() if k != "TLORA_PHILLY"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "philly", "--policies", "independent",
                        "--philly", f.name, "--out-dir", str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    df = pd.read_csv(next(tmp_path.glob("replay_*.csv")))
    row = df.iloc[0]
    assert (row["case"], row["status"], row["jobs"], row["trace"]) == ("philly", "ok", 3, "philly:tiny_philly.csv")
    assert row["queue_max"] == 0 and row["queue_mean"] == 0  # 11 GPUs on 384: nothing waits
