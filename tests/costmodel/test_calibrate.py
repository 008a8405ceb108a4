"""``tlora-sim costmodel calibrate`` (profiler/calibrate.py): the designed set, the derived
artifact, the fit (recovers known machine terms from points that a derived artifact predicts),
the CLI from a points file (no GPU), and ``costmodel show``'s host floor."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from tlora_sim.profiler import calibrate as cb
from tlora_sim.sim.cli.main import main
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact


@pytest.fixture(scope="module")
def art():
    return load_artifact(artifact_path("H200"))


def _points(models=("llama3-8b",)) -> pd.DataFrame:
    rows = [{"model": p["model"], "plan": p["plan"], "nano": p["nano"], "members": cb.members_str(p["members"]),
             "adapters": len(p["members"]), "tokens": sum(b * s for _, b, s in p["members"]), "role": p["role"],
             "reps": 3, "measured_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0} for p in cb.design(models)]
    return pd.DataFrame(rows, columns=cb.POINT_COLUMNS)


def test_design_covers_every_plan_with_fit_and_heldout_points():
    pts = cb.design()
    assert {p["model"] for p in pts} == set(cb.MODELS)
    for key in ("alone", "loop", "fused", "nano"):
        roles = {p["role"] for p in pts if (p["plan"] if p["nano"] == 1 else "nano") == key}
        assert roles == {"fit", "heldout"}, key
    assert max(sum(b * s for _, b, s in p["members"]) for p in pts) <= 8192  # fits one H200 without checkpointing
    # round-robin: the first eight points already hold every plan group
    assert {(p["plan"], p["nano"] > 1) for p in pts[:8]} == {("alone", False), ("loop", False), ("fused", False),
                                                              ("fused", True)}


def test_derive_scales_host_and_gpu_terms(art):
    pts = _points()
    base = cb.predict_ms(art, pts)
    assert np.allclose(cb.predict_ms(cb.derive(art, cb.IDENTITY), pts), base)
    slow_host = cb.predict_ms(cb.derive(art, {**cb.IDENTITY, "host_loop": 2.0}), pts)
    alone512 = ((pts.plan == "alone") & (pts.tokens == 512)).to_numpy()
    assert (slow_host[alone512] > 1.5 * base[alone512]).all()  # host-bound: about twice
    fused = (pts.plan == "fused").to_numpy()
    assert np.allclose(slow_host[fused], base[fused])  # another family's host terms
    big = ((pts.plan == "alone") & (pts.tokens == 8192)).to_numpy()
    fast_gpu = cb.predict_ms(cb.derive(art, {**cb.IDENTITY, "gpu_scale": 0.8}), pts)
    assert np.all(np.abs(fast_gpu[big] / base[big] - 0.8) < 0.05)  # GPU-bound: the scale
    assert "nano_host" in cb.derive(art, cb.IDENTITY)["models"]["llama3-8b"]["plans"]["fused"]
    assert art["models"]["llama3-8b"]["plans"]["loop"]["cpu0"] == load_artifact(artifact_path("H200"))[
        "models"]["llama3-8b"]["plans"]["loop"]["cpu0"]  # the input is not changed


def test_fit_recovers_known_machine_terms(art):
    true = {**cb.IDENTITY, "host_loop:llama3-8b": 1.3, "host_fused:llama3-8b": 0.7, "gpu_scale": 1.05,
            "step_ms": 4.0}
    pts = _points()
    pts["measured_ms"] = cb.predict_ms(cb.derive(art, true), pts)
    params, info = cb.fit(art, pts)
    assert abs(params["host_loop:llama3-8b"] - 1.3) < 0.03 and abs(params["host_fused:llama3-8b"] - 0.7) < 0.03
    assert abs(params["gpu_scale"] - 1.05) < 0.02
    cal, out = cb.build(art, pts, {"gpu_name": "test"})
    assert out.calibrated_error.abs().max() < 0.02 < out.shipped_error.abs().max()
    assert cal["calibration"]["base_artifact"] == art["id"] and cal["id"].startswith("h200-cal-")
    assert len(cal["calibration"]["points"]) == len(pts)


def test_cli_from_points_writes_a_loadable_artifact(art, tmp_path, capsys):
    pts = _points()
    pts["measured_ms"] = cb.predict_ms(cb.derive(art, {**cb.IDENTITY, "host_loop": 1.4}), pts)
    pts.to_csv(tmp_path / "p.csv", index=False)
    out = tmp_path / "cal.json"
    argv = ["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(tmp_path / "p.csv"), "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "held-out points" in text and "heldout_median_ape_calibrated=" in text
    cal = load_artifact(out)
    assert cal["calibration"]["error"]["calibrated"]["heldout"]["median_ape"] < 0.01
    assert main(argv) == 2  # exists: --force needed
    assert main(argv + ["--force", "--budget-s", "inf"]) == 2
    pts.drop(columns=["measured_ms"]).to_csv(tmp_path / "bad.csv", index=False)
    assert main(argv[:5] + [str(tmp_path / "bad.csv"), "--out", str(tmp_path / "x.json")]) == 2
    assert main(["costmodel", "show", "--artifact", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "calibrated over " + art["id"] in shown and "host floor llama3-8b" in shown
    assert json.loads(out.read_text())["id"] == cal["id"]


def test_refit_from_a_calibrated_artifact_keeps_points_and_machine(art, tmp_path):
    pts = _points()
    pts["measured_ms"] = cb.predict_ms(cb.derive(art, {**cb.IDENTITY, "host_fused": 0.8}), pts)
    cal, _ = cb.build(art, pts, {"gpu_name": "NVIDIA H200", "cpu": "test cpu"})
    cb.write_artifact(cal, tmp_path / "a.json")
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(tmp_path / "a.json"), "--out",
                 str(tmp_path / "b.json")]) == 0
    again = load_artifact(tmp_path / "b.json")["calibration"]
    assert again["machine"]["cpu"] == "test cpu" and again["machine"]["refit_of"] == str(tmp_path / "a.json")
    assert again["params"]["host_fused:llama3-8b"] == pytest.approx(cal["calibration"]["params"]["host_fused:llama3-8b"],
                                                                    rel=1e-3)
    # the shipped artifact has no points to refit
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(artifact_path("H200")), "--out",
                 str(tmp_path / "c.json")]) == 2
