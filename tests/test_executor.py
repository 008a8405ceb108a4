"""The real-time executor and validate-run on the CPU (tiny shape; the Triton interpreter).

Real training steps run, so the tests check the machinery end to end: every job trains exactly
its total steps, steps.csv agrees with jobs.csv, regroups save and restore state, and the
simulator replays the identical workload into validation.csv."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "msr-itp-elasticflow" / "cluster02.csv.gz"
pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"the ITP trace is not at {TRACE}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tlora_sim.sim.executor.execute import ExecuteConfig, execute

    root = tmp_path_factory.mktemp("exec")
    out = {}
    for pol in ("independent", "mlora"):
        cfg = ExecuteConfig(trace=f"itp:{TRACE}", policy=pol, device="cpu", tiny=True, jobs=10, max_steps=12, time_scale=1e6,
                            lora_dist=str(Path(__file__).resolve().parents[1] / "profiler" / "validation" / "lora_validation.json"),
                            min_steps=3)
        execute(cfg, root / pol, progress=False)
        out[pol] = root / pol
    return out


def test_every_job_trains_its_steps_and_the_logs_agree(runs):
    for pol, d in runs.items():
        jobs = pd.read_csv(d / "jobs.csv")
        work = pd.read_csv(d / "workload.csv")
        steps = pd.read_csv(d / "steps.csv")
        assert len(jobs) == len(work) == 10
        assert (jobs.steps_trained == work.total_steps).all()
        s = steps[steps.event == "step"]
        per_job = pd.Series([int(i) for j in s.jobs.astype(str) for i in j.split(";")]).value_counts().sort_index()
        assert per_job.tolist() == work.total_steps.tolist()  # every real step counted once per member
        assert (s.ms > 0).all() and (s.end_s >= s.start_s).all()
        assert (jobs.finish_time_s >= jobs.start_time_s).all() and (jobs.start_time_s >= jobs.submit_time_s - 1e-6).all()
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["executor"]["device"] == "cpu" and cfg["policy"] == pol
        summary = json.loads((d / "summary.json").read_text())
        assert summary["executed"] and summary["steps_measured"] == len(s)
    # alone, never grouped; mLoRA groups and regroups for real
    assert pd.read_csv(runs["independent"] / "jobs.csv").max_group_size.max() == 1
    m = pd.read_csv(runs["mlora"] / "steps.csv")
    assert pd.read_csv(runs["mlora"] / "jobs.csv").max_group_size.max() > 1 and (m.event == "regroup").any()


def test_adapter_state_survives_a_regroup():
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
    from tlora_sim.sim.executor.validate import COLUMNS, validate_runs

    table = validate_runs([runs["independent"], runs["mlora"]], tmp_path / "v")
    assert list(table.columns[:len(COLUMNS)]) == COLUMNS and list(table.policy) == ["independent", "mlora"]
    assert (table.jobs == 10).all() and table[["jct_abs_error_p50", "jct_abs_error_p90"]].notna().all().all()
    assert (table.cpu_scale > 0).all()
    assert (tmp_path / "v" / "validation.png").is_file() and (tmp_path / "v" / "validation_jobs.csv").is_file()
    with pytest.raises(Exception, match="executed run"):
        validate_runs([tmp_path], tmp_path / "w")
