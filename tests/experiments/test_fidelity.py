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


def test_host_bound_share_is_the_gpu_time_of_jobs_whose_step_alone_follows_the_host(tmp_path, capsys):
    """``host_bound_gpu_time_share``: the job GPU-time of jobs whose isolated step is host-bound
    (``job_host_shares`` >= HOST_BOUND_SHARE), recomputed here by hand from the run's jobs; the
    note prints once on stderr above HOST_BOUND_NOTE; the roofline has no host term (None)."""
    from tlora_sim.sim.costmodel.profiled.calibrated import HOST_BOUND_SHARE, HOST_STEP, with_host_speed
    from tlora_sim.sim.costmodel.interface import Member
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    s, jobs, printed = _replay(tmp_path, capsys, "-q", cluster="2x8xH100")
    art = load_artifact(artifact_path("H100"))
    cm, slow = ProfiledCostModel(art), ProfiledCostModel(with_host_speed(art, 1 + HOST_STEP))
    held = jobs["num_gpus"] * (jobs["finish_time_s"] - jobs["start_time_s"])
    share = []
    for r in jobs.itertuples():
        m = (Member(r.rank, r.batch_size, r.seq_len),)
        t0, t1 = (c.step_time_s(r.model, "H100", m, r.num_gpus, "alone") for c in (cm, slow))
        share.append((t1 / t0 - 1) / HOST_STEP)
    bound = np.asarray(share) >= HOST_BOUND_SHARE
    assert 0 < bound.sum() < len(jobs)  # the synthetic trace has both kinds
    assert s["host_bound_gpu_time_share"] == pytest.approx(held[bound].sum() / held.sum())
    assert (printed.err.count("host-bound:") == 1) == (s["host_bound_gpu_time_share"] > fidelity.HOST_BOUND_NOTE)
    r, _, printed = _replay(tmp_path, capsys, "--cost-model", "roofline", "-q", cluster="2x8xH100")
    assert r["host_bound_gpu_time_share"] is None and "host-bound:" not in printed.err


def test_host_bound_note_words_and_threshold():
    assert fidelity.host_bound_text({"a": fidelity.HOST_BOUND_NOTE, "b": None}, "h100-x", "H100") is None
    assert fidelity.host_bound_text({"a": None}, "h100-x", "H100") is None
    text = fidelity.host_bound_text({"a": 0.3, "b": 0.6}, "h100-2026-x", "H100")
    assert text.startswith("host-bound: 30-60% of simulated GPU-time") and "costmodel calibrate" in text
    cal = fidelity.host_bound_text({"a": 0.6}, "h200-cal-2026-12-02-1d4c9da6", "H200")
    assert "this artifact is calibrated" in cal and "costmodel show" in cal and "60%" in cal
