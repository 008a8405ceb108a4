"""``tlora-sim costmodel calibrate`` (profiler/calibrate.py): the designed set, the derived
artifact, the fit (recovers known machine terms from points that a derived artifact predicts),
the CLI from a points file (no GPU), and ``costmodel show``'s host floor."""

from __future__ import annotations

import json
from pathlib import Path

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


# ----------------------------------------------------------------------------------- the host-speed probe
VALIDATION = Path(__file__).resolve().parents[2] / "profiler" / "data" / "validation"


def _probed(art, true: dict, models=("llama3-8b",)) -> pd.DataFrame:
    """Points measured on a host whose speed varies point to point (known factors around the
    median probe), with the machine terms ``true`` at the reference speed."""
    pts = _points(models)
    s = np.exp(np.random.default_rng(0).uniform(np.log(0.75), np.log(1.35), len(pts)))
    pts["probe_ms"] = 12.0 * s
    ref, factors = cb.probe_factors(pts)
    assert ref == pytest.approx(12.0 * np.median(s)) and np.allclose(factors, s / np.median(s))
    pts["measured_ms"] = cb.predict_at_speed(cb.derive(art, true), pts, factors)
    return pts


def test_with_host_speed_scales_host_bound_steps_only(art):
    pts = _points()
    base = cb.predict_ms(art, pts)
    assert np.allclose(cb.predict_ms(cb.with_host_speed(art, 1.0), pts), base, rtol=1e-12)
    r = cb.predict_ms(cb.with_host_speed(art, 1.2), pts) / base
    tiny = ((pts.plan == "alone") & (pts.tokens == 512)).to_numpy()
    big = (pts.tokens >= 8192).to_numpy()
    assert np.all(np.abs(r[tiny] - 1.2) < 0.02) and np.all(r[big] < 1.02)
    # on a derived artifact: every host term times the factor, i.e. the host scales times it
    p = {**cb.IDENTITY, "host_loop:llama3-8b": 1.3, "host_fused:llama3-8b": 0.7, "gpu_scale": 1.05, "step_ms": 4.0}
    scaled = {k: (1.2 * v if k.startswith("host_") else v) for k, v in p.items()}
    assert np.allclose(cb.predict_ms(cb.with_host_speed(cb.derive(art, p), 1.2), pts),
                       cb.predict_ms(cb.derive(art, scaled), pts), rtol=1e-12)
    d = cb.derive(art, p)
    fast = cb.with_host_speed(d, 0.9)
    for name, e in d["models"].items():
        for fam, pe in e["plans"].items():
            for f in cb.HOST_FIELDS:
                if f in pe:
                    assert fast["models"][name]["plans"][fam][f] == pytest.approx(0.9 * pe[f], rel=1e-12)
            assert fast["models"][name]["plans"][fam]["coef"] == pe["coef"]
    with pytest.raises(ValueError):
        cb.with_host_speed(art, float("nan"))


def test_fit_reads_host_terms_at_the_probe_speed(art):
    true = {**cb.IDENTITY, "host_loop:llama3-8b": 1.3, "host_fused:llama3-8b": 0.7, "gpu_scale": 1.05,
            "step_ms": 4.0, "nano_host": 1.2}
    pts = _probed(art, true)
    params, _ = cb.fit(art, pts)
    for k in ("host_loop:llama3-8b", "host_fused:llama3-8b", "gpu_scale", "nano_host"):
        assert params[k] == pytest.approx(true[k], rel=0.02), k
    blind, _ = cb.fit(art, pts.drop(columns="probe_ms"))  # the same points without their probes: biased
    assert max(abs(blind[k] / true[k] - 1) for k in ("host_loop:llama3-8b", "host_fused:llama3-8b",
                                                      "nano_host")) > 0.05
    cal, out = cb.build(art, pts, {"gpu_name": "test"}, probes=pd.DataFrame(
        {"t_s": [1.0, 2.5], "probe_ms": [12.0, 13.0], "python_ms": [20.0, 21.0], "point": [0, 0]}), probe_what="test probe")
    pr = cal["calibration"]["probe"]
    assert pr["ref_ms"] == pytest.approx(np.median(pts.probe_ms)) and pr["points"] == len(pts)
    assert pr["what"] == "test probe" and pr["probes"][1] == {"t_s": 2.5, "probe_ms": 13.0, "python_ms": 21.0,
                                                              "point": 0}
    e = cal["calibration"]["error"]
    assert e["calibrated"]["all"]["max_ape"] < 0.01 < e["calibrated_no_probe"]["all"]["max_ape"]
    assert np.allclose(out.probe_factor, pts.probe_ms / pr["ref_ms"])
    assert np.allclose(out.calibrated_no_probe_ms, cb.predict_ms(cal, pts))
    assert {"probe_ms", "probe_factor", "calibrated_no_probe_ms", "calibrated_no_probe_error"} <= set(
        cal["calibration"]["points"][0])
    table = cb.error_table(out)
    assert "calibrated_no_probe held-out median" in table and "calibrated_no_probe_ms" in table


def test_points_without_probes_fit_as_before(art):
    pts = _points()
    pts["measured_ms"] = cb.predict_ms(cb.derive(art, {**cb.IDENTITY, "host_loop": 1.2, "gpu_scale": 1.03}), pts)
    ref, _ = cb.fit(art, pts.drop(columns="probe_ms"))
    part = pts.assign(probe_ms=12.0)
    part.loc[3, "probe_ms"] = np.nan  # one point without a probe: the whole fit goes without
    assert cb.fit(art, part)[0] == ref and cb.fit(art, pts)[0] == ref
    cal, out = cb.build(art, pts, {})
    assert cal["calibration"]["probe"] is None and (out.probe_factor == 1.0).all()
    assert (out.calibrated_ms == out.calibrated_no_probe_ms).all()
    # the committed calibration (points measured before the probe) refits to its stored numbers
    path = VALIDATION / "h200_2026-12-01" / "calibrated_h200.json"
    if not path.exists():
        pytest.skip(f"{path} absent")
    old = load_artifact(path)["calibration"]
    params, _ = cb.fit(art, pd.DataFrame(old["points"]).reindex(columns=cb.POINT_COLUMNS))
    assert params.keys() == old["params"].keys()
    assert all(params[k] == pytest.approx(v, rel=1e-9, abs=1e-9) for k, v in old["params"].items())


def test_cli_refits_points_with_their_probes(art, tmp_path, capsys):
    true = {**cb.IDENTITY, "host_loop:llama3-8b": 1.3, "host_fused:llama3-8b": 0.8}
    pts = _probed(art, true)
    pts.to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame({"t_s": np.arange(2 * len(pts), dtype=float), "probe_ms": np.repeat(pts.probe_ms.to_numpy(), 2),
                  "python_ms": 20.0, "point": np.repeat(np.arange(len(pts)), 2)}).to_csv(tmp_path / "p_probes.csv",
                                                                                         index=False)
    out = tmp_path / "cal.json"
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(tmp_path / "p.csv"),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "probe: reference" in text and "heldout_median_ape_calibrated_no_probe=" in text
    pr = load_artifact(out)["calibration"]["probe"]
    assert len(pr["probes"]) == 2 * len(pts) and pr["ref_ms"] == pytest.approx(np.median(pts.probe_ms))
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(out), "--out",
                 str(tmp_path / "again.json")]) == 0  # a refit of the artifact keeps its probes
    again = load_artifact(tmp_path / "again.json")["calibration"]["probe"]
    assert again["probes"] == pr["probes"] and again["what"] == pr["what"]
    assert again["ref_ms"] == pytest.approx(pr["ref_ms"], rel=1e-6)  # of the points' stored (6-digit) probe_ms
    assert main(["costmodel", "show", "--artifact", str(out)]) == 0
    assert f"probe reference {pr['ref_ms']:.2f} ms" in capsys.readouterr().out


def test_cli_rejects_a_bad_probe_ms(tmp_path, capsys):
    pts = _points().assign(probe_ms=12.0)
    pts.loc[4, "probe_ms"] = -1.0
    pts.to_csv(tmp_path / "p.csv", index=False)
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(tmp_path / "p.csv"), "--out",
                 str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "row 5" in err and "probe_ms" in err and not (tmp_path / "x.json").exists()
