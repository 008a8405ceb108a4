"""Issue 44 item 3: tenants.csv, Jain's index of slowdowns and finish-time fairness (Themis' rho)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.core.fairness import (TENANT_COLUMNS, contention, fairness_summary, finish_time_fairness,
                                         jain_index, tenant_table)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "lora_jobs.csv"


def test_jain_index_bounds():
    assert jain_index(np.array([2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)  # one takes all: 1/n
    assert jain_index(np.array([1.0, 3.0])) == pytest.approx(16 / (2 * 10))


def test_contention_is_the_time_average_of_running_plus_queued():
    tl = pd.DataFrame({"time_s": [0.0, 10.0, 20.0], "running_jobs": [1, 2, 0], "queued_jobs": [0, 2, 0]})
    got = contention(tl, np.array([0.0, 5.0, 10.0, 12.0, 25.0]), np.array([20.0, 15.0, 10.0, 30.0, 30.0]))
    # [0,20]: (1*10 + 4*10)/20; [5,15]: (1*5 + 4*5)/10; empty at 10: 4; [12,30]: (4*8 + 0)/18; [25,30]: 0
    assert got == pytest.approx([2.5, 2.5, 4.0, 32 / 18, 0.0])


def _jobs(**cols):
    base = {"submit_time_s": [0.0, 0.0], "finish_time_s": [100.0, 300.0], "num_gpus": [1, 8],
            "isolated_runtime_s": [100.0, 100.0]}
    return pd.DataFrame({**base, **cols})


def test_rho_follows_the_fair_share_definition():
    tl = pd.DataFrame({"time_s": [0.0, 300.0], "running_jobs": [2, 0], "queued_jobs": [0, 0]})
    rho = finish_time_fairness(_jobs(), tl, total_gpus=8)
    # two jobs contend (N = 2) on 8 GPUs: the 1-GPU job's share (4 GPUs) covers it, T_id = 100 s;
    # the 8-GPU job gets 4 of 8 it asks: T_id = 100 * 8 * 2 / 8 = 200 s
    assert rho == pytest.approx([1.0, 1.5])


def test_tenant_table_and_summary_on_a_hand_built_run():
    jobs = _jobs(tenant=["a", "b"], jct_s=[100.0, 300.0], queue_s=[0.0, 200.0], slowdown=[1.0, 3.0],
                 trace_duration_s=[3600.0, 1800.0], early_exit=[False, False])
    tl = pd.DataFrame({"time_s": [0.0, 300.0], "running_jobs": [2, 0], "queued_jobs": [0, 0]})
    t = tenant_table(jobs, tl, 8)
    assert list(t.columns) == TENANT_COLUMNS and t["tenant"].tolist() == ["a", "b"]
    assert t["gpu_hours"].tolist() == [1.0, 4.0] and t["gpu_hours_share"].tolist() == [0.2, 0.8]
    s = fairness_summary(jobs, tl, 8, t)
    assert s["jain_slowdown"] == pytest.approx(16 / 20) and s["ftf_rho_max"] == pytest.approx(1.5)
    assert s["ftf_share_rho_le_1"] == 0.5 and s["tenants"] == 2


def test_replay_writes_tenants_csv_matching_jobs_csv(tmp_path):
    out = tmp_path / "r"
    assert main(["-q", "replay", "--policy", "mlora", "--trace", f"csv:{EXAMPLE}", "--columns",
                 "submit=created,start=started,end=finished,gpus=gpus,job_id=job,tenant=team",
                 "--cluster", "1x8xH100", "--out", str(out)]) == 0
    jobs = pd.read_csv(out / "jobs.csv", keep_default_na=False)
    tenants = pd.read_csv(out / "tenants.csv", keep_default_na=False).set_index("tenant")
    for name, g in jobs.groupby("tenant"):
        assert tenants.loc[name, "jobs"] == len(g)
        assert tenants.loc[name, "avg_jct_s"] == pytest.approx(g["jct_s"].mean())
        assert tenants.loc[name, "p90_jct_s"] == pytest.approx(np.percentile(g["jct_s"], 90))
        assert tenants.loc[name, "avg_queue_s"] == pytest.approx(g["queue_s"].mean())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jain_slowdown"] == pytest.approx(jain_index(jobs["slowdown"].to_numpy()))
    assert summary["tenants"] == 2 and 0 < summary["jain_tenant_slowdown"] <= 1
    assert (out / "figures" / "tenants.png").is_file()


def test_no_tenants_no_tenants_csv(tmp_path):
    out = tmp_path / "r"
    assert main(["-q", "replay", "--policy", "tlora", "--trace", "synthetic:jobs=20,seed=2", "--cluster", "1x8xH100",
                 "--out", str(out), "--no-plots"]) == 0
    assert not (out / "tenants.csv").exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["tenants"] == 1 and s["jain_tenant_slowdown"] is None and s["ftf_rho_max"] >= s["ftf_rho_mean"] > 0
