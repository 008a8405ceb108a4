"""Issue 41: fidelity flags that tell the truth. Every prediction not from a measured profile counts
as extrapolated (the roofline model and unprofiled GPU types: 100%), the share of GPU-time is given
by reason, the warning is printed once on stderr in words, and the validation error is carried."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.experiments import fidelity

TRACE = "synthetic:jobs=30,seed=2"


def _replay(tmp_path, capsys, *extra, cluster="1x8xH100", policy="mlora"):
    out = tmp_path / "run"
    rc = main(["replay", "--trace", TRACE, "--cluster", cluster, "--policy", policy, "--out", str(out),
               "--no-progress", "--no-plots", "--force", *extra])
    assert rc == 0
    return json.loads((out / "summary.json").read_text()), pd.read_csv(out / "jobs.csv"), capsys.readouterr()


@pytest.mark.parametrize("extra,cluster,reason", [
    (["--cost-model", "roofline"], "1x8xH100", "roofline"),   # a profile exists but is not used
    ([], "1x4xA100", "roofline:gpu"),                          # no profile for the GPU type (auto: roofline)
])
def test_roofline_and_unprofiled_gpus_are_100_percent_extrapolated(tmp_path, capsys, extra, cluster, reason):
    s, _, printed = _replay(tmp_path, capsys, *extra, "-q", cluster=cluster)
    assert s["extrapolated_share"] == 1.0
    assert s["extrapolated_gpu_time_share"] == {reason: 1.0} and s["extrapolated_gpu_time_share_total"] == 1.0
    assert "validation" not in s  # the validation is the profiled model's
    assert printed.err.count("fidelity:") == 1 and "fidelity" not in printed.out  # once, on stderr, even under -q
    assert "100% of simulated GPU-time" in printed.err and "kept" in printed.out


def test_profiled_shares_by_reason_match_the_jobs(tmp_path, capsys):
    s, jobs, printed = _replay(tmp_path, capsys, cluster="2x8xH100")
    held = jobs["num_gpus"] * (jobs["finish_time_s"] - jobs["start_time_s"])
    big = held[jobs["num_gpus"] > 2].sum() / held.sum()
    assert big > 0.05  # the synthetic trace has multi-GPU jobs
    assert s["extrapolated_gpu_time_share"]["multigpu:gpus>2"] == pytest.approx(big)
    inter = held[jobs["num_gpus"] > 8].sum() / held.sum()
    assert s["extrapolated_gpu_time_share"].get("multigpu:inter-node", 0.0) == pytest.approx(inter)
    assert s["extrapolated_gpu_time_share_total"] >= max(s["extrapolated_gpu_time_share"].values())
    assert "jobs on more than 2 GPUs" in printed.err and "profiled up to 2 GPUs" in printed.err
    assert "--gpus 8" in printed.err and printed.err.count("fidelity:") == 1
    v = s["validation"]
    assert v["gpu"] == "H100" and {"independent", "tlora"} <= set(v["avg_jct_error"]) and "tlora" in v["ratio_error"]


def test_compare_warns_once_for_all_policies(tmp_path, capsys):
    rc = main(["compare", "--trace", TRACE, "--cluster", "1x4xA100", "--policies", "mlora", "--out",
               str(tmp_path / "c"), "--no-progress", "--no-plots"])
    assert rc == 0
    err = capsys.readouterr().err
    assert err.count("fidelity:") == 1 and "GPU type A100 has no measured profile" in err


def test_gpu_time_shares_by_hand():
    df = pd.DataFrame({"num_gpus": [1, 4, 2], "start_time_s": [0.0, 0.0, 10.0],
                       "finish_time_s": [10.0, 10.0, np.nan]})  # the last one runs to the end (10 s): 0 s
    shares, total = fidelity.gpu_time_shares(df, [(), ("multigpu:gpus>2",), ("layer",)])
    assert shares == {"multigpu:gpus>2": pytest.approx(40 / 50)} and total == pytest.approx(0.8)
    assert fidelity.gpu_time_shares(df.iloc[:0], []) == ({}, 0.0)


def test_every_reason_is_explained_with_how_to_measure_it():
    for r in ("multigpu:gpus>2", "multigpu:inter-node", "multigpu:gpu", "multigpu:pp", "layer", "head",
              "analytic_plan:grouped", "roofline", "roofline:gpu", "multigpu:host_scale_of_fused:grouped"):
        what, measured, how = fidelity.explain(r, "H100", 8)
        assert what and measured and how and what != r and "measure" in how + measured
    assert fidelity.warning_text({"a": {"layer": 0.01}}, {"a": 0.01}, "H100", 8, "x") is None  # under 5%: quiet


def test_an_h200_run_carries_the_h200_validation(tmp_path, capsys):
    s, _, _ = _replay(tmp_path, capsys, cluster="2x8xH200")
    v = s["validation"]
    assert v["gpu"] == "H200" and "H200" in v["workload"] and {"independent", "mlora", "tlora"} <= set(v["avg_jct_error"])
    assert v["source"].startswith("profiler/data/validation/h200_")
