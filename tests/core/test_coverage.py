"""Loud skips: every replay and comparison prints, per policy, how many jobs it kept of how many
and the share of extrapolated cost-model predictions, and writes both to summary.json/summary.csv."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd

from tlora_sim.sim.core.provenance import coverage
from tlora_sim.sim.experiments.replay import coverage_line


def test_coverage_counts_and_warns():
    c = coverage(90, {"memory": 7, "oversized": 3}, {"predictions": 40, "extrapolated": 4})
    assert c == {"input_jobs": 100, "kept_jobs": 90, "extrapolated_share": 0.1}
    line = coverage_line("p", {**c, "skipped": {"memory": 7, "oversized": 3}, "extrapolated_gpu_time_share_total": 0.25})
    assert "kept 90 of 100 jobs (skipped: memory 7, oversized 3)" in line
    assert "25% of GPU-time on extrapolated step times (10% of distinct cost-model predictions)" in line
    quiet = coverage_line("p", {**coverage(5, {}, {"predictions": 0}), "skipped": {}})
    assert "skipped: none" in quiet and "0% of GPU-time" in quiet
    # a model that measured nothing (the roofline: kind analytic, no counters): every prediction extrapolated
    assert coverage(5, {}, {"kind": "analytic"})["extrapolated_share"] == 1.0


def test_a_what_if_prints_what_it_kept(tmp_path):
    out = tmp_path / "w"
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--trace",
                        "synthetic:jobs=60,seed=2,max_gpus=8", "--cluster", "1x8xH100", "--lora-dist", "llm-cluster",
                        "--policies", "independent,independent-backfill", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "independent" / "summary.json").read_text())
    assert s["input_jobs"] == 60 and s["kept_jobs"] + sum(s["skipped"].values()) == 60
    assert s["skipped"].get("memory", 0) > 0  # 70B on one H100 does not fit
    assert f"kept {s['kept_jobs']} of 60 jobs" in r.stdout
    table = pd.read_csv(out / "summary.csv")
    assert {"kept_jobs", "input_jobs", "extrapolated_share"} <= set(table.columns)
