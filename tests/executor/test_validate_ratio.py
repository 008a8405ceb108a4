"""validate-run reports what users take away (each policy's avg JCT over the reference's, real
and simulated, ``ratio_error``, the ranking) and checks its inputs: execute runs of one workload
each, no policy twice, no mixed workloads, no measured-steps validation without steps, files
that are cut or wrong named in one line. Inputs: the committed H200 runs
(profiler/data/validation/h200_2026-12-01/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from tlora_sim.sim.cli.main import main
from tlora_sim.sim.executor.validate import add_ratios, check_inputs
from tlora_sim.traces.errors import InputError

RUNS = Path(__file__).resolve().parents[2] / "profiler" / "data" / "validation" / "h200_2026-12-01"


def test_ratios_and_ranking():
    t = pd.DataFrame({"policy": ["a", "independent", "c"], "real_avg_jct_s": [50.0, 100.0, 80.0],
                      "sim_avg_jct_s": [60.0, 100.0, 70.0]})
    r = add_ratios(t)
    assert r.reference.tolist() == ["independent"] * 3
    assert r.real_ratio.tolist() == [0.5, 1.0, 0.8] and r.sim_ratio.tolist() == [0.6, 1.0, 0.7]
    assert r.ratio_error.round(6).tolist() == [0.2, 0.0, round(0.7 / 0.8 - 1, 6)]
    assert r.ranking_kept.all() and r.real_rank_order.iloc[0] == "a<c<independent"
    r = add_ratios(t.assign(sim_avg_jct_s=[90.0, 100.0, 70.0]), reference="a")
    assert not r.ranking_kept.any() and r.sim_rank_order.iloc[0] == "c<a<independent"
    assert r.real_ratio.tolist() == [1.0, 2.0, 1.6]
    with pytest.raises(InputError):
        add_ratios(t, reference="nosuch")


def test_validate_run_writes_ratio_columns(tmp_path, capsys):
    assert main(["validate-run", str(RUNS / "B" / "independent"), str(RUNS / "B" / "tlora"), "--out",
                 str(tmp_path / "v"), "--no-progress"]) == 0
    t = pd.read_csv(tmp_path / "v" / "validation.csv")
    for c in ("avg_jct_error", "real_ratio", "sim_ratio", "ratio_error", "ranking_kept", "cost_model"):
        assert c in t.columns
    tl = t[t.policy == "tlora"].iloc[0]
    assert tl.real_ratio == pytest.approx(tl.real_avg_jct_s / t.real_avg_jct_s[t.policy == "independent"].iloc[0])
    assert tl.ratio_error == pytest.approx(tl.sim_ratio / tl.real_ratio - 1)
    out = capsys.readouterr().out
    assert "ranking kept:" in out
    # how many jobs the replay placed in the run's groups, per policy, as divergence.csv counts them
    div = pd.read_csv(tmp_path / "v" / "divergence.csv")
    same = div.groupby("policy").same_groups.sum()
    line = next(x for x in out.splitlines() if x.startswith("groups as run (divergence.csv): "))
    for pol in ("independent", "tlora"):
        assert f"{pol} {int(same[pol])} of {int((div.policy == pol).sum())} jobs" in line
    assert t.same_groups_share.tolist() == pytest.approx([same[p] / (div.policy == p).sum() for p in t.policy])
    # another artifact for the replay: recorded per row
    assert main(["validate-run", str(RUNS / "B" / "tlora"), "--out", str(tmp_path / "w"), "--no-progress",
                 "--artifact", str(RUNS / "calibrated_h200.json")]) == 0
    assert pd.read_csv(tmp_path / "w" / "validation.csv").cost_model.iloc[0].startswith("h200-cal-")


def test_mixed_inputs_are_refused():
    with pytest.raises(InputError, match="not the workload"):
        check_inputs([RUNS / "A" / "independent", RUNS / "B" / "mlora"])
    with pytest.raises(InputError, match="given twice"):
        check_inputs([RUNS / "B" / "mlora", RUNS / "B" / "mlora"])
    check_inputs([RUNS / "B" / "mlora", RUNS / "B" / "tlora"])


def _copy(tmp_path, name="run") -> Path:
    d = tmp_path / name
    shutil.copytree(RUNS / "B" / "independent", d)
    return d


def test_broken_inputs_are_one_line(tmp_path, capsys):
    cases = []
    d = _copy(tmp_path, "other_jobs")
    shutil.copy(RUNS / "A" / "independent" / "jobs.csv", d / "jobs.csv")  # another run's jobs.csv
    cases.append(d)
    d = _copy(tmp_path, "cut_config")
    d.joinpath("config.json").write_text(d.joinpath("config.json").read_text()[:200])
    cases.append(d)
    d = _copy(tmp_path, "bad_steps")
    wl = pd.read_csv(d / "workload.csv")
    wl["total_steps"] = wl.total_steps.astype(object)
    wl.loc[3, "total_steps"] = "abc"
    wl.to_csv(d / "workload.csv", index=False)
    cases.append(d)
    d = _copy(tmp_path, "empty_jobs")
    d.joinpath("jobs.csv").write_text("")
    cases.append(d)
    for k, d in enumerate(cases):
        assert main(["validate-run", str(d), "--out", str(tmp_path / f"o{k}"), "--no-progress"]) == 2, d
        assert not (tmp_path / f"o{k}").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(cases) and all(line.startswith("tlora-sim: error:") for line in err)
    assert "row 5" in err[2] and "total_steps" in err[2]


def test_measured_steps_need_steps(tmp_path, capsys):
    d = _copy(tmp_path)
    steps = pd.read_csv(d / "steps.csv")
    steps.iloc[:0].to_csv(d / "steps.csv", index=False)  # header only
    assert main(["validate-run", str(d), "--out", str(tmp_path / "o"), "--step-times", "measured",
                 "--no-progress"]) == 2
    assert "no measured step" in capsys.readouterr().err
