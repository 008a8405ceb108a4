"""Smoke test of ``bench/replay.py --quick`` (no timing assertions: the numbers are machine-dependent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "replay.py"


def test_help_lists_the_cases():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for case in ("itp02", "itp04", "itp-all", "synthetic-10k", "synthetic-100k", "synthetic-1M"):
        assert case in r.stdout


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
    # same case + policy again: the row is replaced, not appended
    r = subprocess.run(cmd[:4] + ["independent"] + cmd[5:], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(pd.read_csv(path)) == 2


def test_unknown_case_is_rejected(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--cases", "nope", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown case" in r.stderr
