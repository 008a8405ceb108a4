"""Issue 44 item 5: the Python API (``import tlora_sim as ts``): same results as the CLI, DataFrame traces,
nothing written unless asked, cheap import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import tlora_sim as ts
from tlora_sim.sim.cli.main import main

SPEC = "synthetic:jobs=60,seed=1"


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ})


def test_done_when_one_liner_works_and_writes_nothing(tmp_path):
    p = _run("import tlora_sim as ts; r = ts.replay('synthetic:jobs=200,seed=1', 'tlora', '2x8xH100', seed=0); "
             "print(r.jobs.shape, r.summary['avg_jct_s'])", tmp_path)
    assert p.returncode == 0, p.stderr
    shape, avg = p.stdout.split(") ")
    cols = ts.replay('synthetic:jobs=5,seed=1', 'tlora', '2x8xH100', seed=0).jobs.shape[1]
    assert shape == f"(200, {cols}" and float(avg) > 0
    assert list(tmp_path.iterdir()) == []


def test_import_is_cheap_and_torch_free(tmp_path):
    p = _run("import sys, tlora_sim; print(sorted(m for m in ('torch', 'pandas', 'simpy', 'matplotlib') "
             "if m in sys.modules))", tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_replay_matches_the_cli_byte_for_byte(tmp_path):
    cli = tmp_path / "cli"
    assert main(["-q", "replay", "--policy", "mlora", "--trace", SPEC, "--cluster", "1x8xH100", "--seed", "3",
                 "--out", str(cli), "--no-plots"]) == 0
    run = ts.replay(SPEC, "mlora", "1x8xH100", seed=3)
    assert isinstance(run, ts.Run) and run.policy == "mlora"
    api = run.save(tmp_path / "api", plots=False)
    for name in ("config.json", "jobs.csv", "timeline.csv", "summary.json"):
        assert (api / name).read_bytes() == (cli / name).read_bytes(), name
    assert run.summary == json.loads((cli / "summary.json").read_text())
    pd.testing.assert_frame_equal(run.jobs.reset_index(drop=True), pd.read_csv(cli / "jobs.csv",
                                                                                keep_default_na=False),
                                  check_dtype=False)
    with pytest.raises(ts.InputError, match="already holds"):
        run.save(api)


def test_dataframe_trace_with_attributes_and_tenants():
    df = pd.DataFrame({"submit_time_s": [500.0, 100.0, 300.0, 900.0], "duration_s": [3600.0, 1800.0, 7200.0, 600.0],
                       "num_gpus": [1, 2, 1, 4], "tenant": ["a", "b", "a", "b"], "rank": [64, np.nan, 8, 16],
                       "model": ["qwen3-8b", None, "llama3-8b", ""], "note": ["x", "y", "z", "w"]})
    t = ts.read_trace(df)
    assert t["submit_time_s"].tolist() == [0.0, 200.0, 400.0, 800.0] and t["job_id"].tolist() == ["2", "3", "1", "4"]
    run = ts.replay(df, "tlora", "1x8xH100", seed=0, first_jobs=3)
    jobs = run.jobs.set_index("job_id")
    assert sorted(jobs.index) == ["1", "2", "3"] and jobs.loc["1", "rank"] == 64 and jobs.loc["3", "rank"] == 8
    assert jobs.loc["1", "model"] == "qwen3-8b" and jobs.loc["1", "attrs_from_trace"] == "model;rank"
    assert run.tenants["tenant"].tolist() == ["a", "b"] and run.summary["skipped"]["after_first_jobs"] == 1
    assert run.config["inputs"]["trace"] == "dataframe:3 jobs"


@pytest.mark.parametrize("change, row, field", [({"num_gpus": [1, 0]}, 2, "num_gpus"),
                                               ({"duration_s": [1.0, -5.0]}, 2, "duration_s"),
                                               ({"submit_time_s": ["0", "soon"]}, 2, "submit_time_s"),
                                               ({"rank": [2.5, 1]}, 1, "rank")])
def test_bad_dataframe_names_row_and_column(change, row, field):
    df = pd.DataFrame({"submit_time_s": [0.0, 1.0], "duration_s": [1.0, 2.0], "num_gpus": [1, 1], **change})
    with pytest.raises(ts.InputError) as e:
        ts.read_trace(df)
    assert (e.value.file, e.value.row, e.value.field) == ("<DataFrame>", row, field)
    with pytest.raises(ts.InputError, match="lacks column"):
        ts.read_trace(df.drop(columns="num_gpus"))
    with pytest.raises(ts.InputError, match="unknown option"):
        ts.replay(df, "tlora", "1x8xH100", sed=1)


def test_compare_has_speedup_columns_and_writes_only_when_saved(tmp_path):
    os.chdir(tmp_path)
    c = ts.compare(SPEC, "independent-backfill,tlora", "1x8xH100", seed=1)
    assert list(tmp_path.iterdir()) == []
    s = c.summary.set_index("policy")
    assert s.loc["independent-backfill", "avg_jct_speedup"] == 1.0
    assert s.loc["tlora", "avg_jct_speedup"] == pytest.approx(s.loc["independent-backfill", "avg_jct_s"] /
                                                              s.loc["tlora", "avg_jct_s"])
    assert s.loc["tlora", "avg_jct_s"] == ts.replay(SPEC, "tlora", "1x8xH100", seed=1).summary["avg_jct_s"]
    out = c.save(tmp_path / "cmp", plots=False)
    assert (out / "summary.csv").is_file() and (out / "tlora" / "jobs.csv").is_file()
    assert c.plot().axes


def test_costmodel_predict_matches_the_cli(capsys):
    p = ts.costmodel("H200").predict("llama3-8b", [(16, 4, 1024), (8, 4, 512)], gpus=2)
    assert main(["costmodel", "predict", "--gpu", "H200", "--model", "llama3-8b", "--members", "16:4:1024,8:4:512",
                 "--gpus", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"step_time_s={p['step_time_s']:.6g} memory_bytes={p['memory_bytes']:.6g} "
                    f"parallelism={p['parallelism']} measured={'yes' if p['measured'] else 'no'}")
    with pytest.raises(ts.InputError):
        ts.costmodel("H300")
