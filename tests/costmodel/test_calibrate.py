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
from tlora_sim.sim.costmodel.profiled.calibrated import HOST_FIELDS


@pytest.fixture(scope="module")
def art():
    return load_artifact(artifact_path("H200"))


def _points(models=("llama3-8b",)) -> pd.DataFrame:
    rows = [{"model": p["model"], "plan": p["plan"], "nano": p["nano"], "members": cb.members_str(p["members"]),
             "adapters": len(p["members"]), "tokens": sum(b * s for _, b, s in p["members"]), "role": p["role"],
             "reps": 3, "measured_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0} for p in cb.design(models)]
    return pd.DataFrame(rows, columns=cb.POINT_COLUMNS)


def _group(p) -> str:
    return p["plan"] if p["nano"] == 1 else "nano"


def _tokens(p) -> int:
    return sum(b * s for _, b, s in p["members"])


def test_design_covers_every_plan_with_fit_and_heldout_points():
    pts = cb.design()
    assert {p["model"] for p in pts} == set(cb.MODELS)
    for m in cb.MODELS:  # both models measure the same configurations
        assert [{**p, "model": None} for p in pts if p["model"] == m] == [{**p, "model": None} for p in pts
                                                                          if p["model"] == cb.MODELS[0]]
    for key in ("alone", "loop", "fused", "nano"):
        g = [p for p in pts if _group(p) == key and p["model"] == cb.MODELS[0]]
        assert [p["role"] for p in g] == ["heldout" if i % 3 == 2 else "fit" for i in range(len(g))], key
        assert {p["role"] for p in g} == {"fit", "heldout"}, key
    assert max(_tokens(p) for p in pts) <= 8192  # fits one H200 without checkpointing
    assert {r for p in pts for r, _, _ in p["members"]} <= {2, 4, 8, 16}
    # held-out points from host-bound (<= 2,048 tokens) to GPU-bound (>= 4,096) steps
    held = [_tokens(p) for p in pts if p["role"] == "heldout"]
    assert min(held) <= 1024 and max(held) >= 4096
    # GPU-bound coverage of every family: alone to 8,192 tokens, a large loop and fused, nano 2 and 4
    big = {(p["plan"], p["nano"]) for p in pts if _tokens(p) >= 5120}
    assert {("alone", 1), ("loop", 1), ("fused", 1), ("fused", 2), ("fused", 4)} <= big
    assert max(_tokens(p) for p in pts if p["plan"] == "alone") == 8192
    # host-bound loops: a 1-member loop, 2-member loops of <= 2,048-token members, a 3-4 member one
    loops = [p for p in pts if p["plan"] == "loop"]
    assert any(len(p["members"]) == 1 for p in loops)
    assert any(len(p["members"]) == 2 and _tokens(p) <= 2048 for p in loops)
    assert any(3 <= len(p["members"]) <= 4 and _tokens(p) <= 3072 for p in loops)
    # host-bound fused points of 1 to 4 small members
    small = {len(p["members"]) for p in pts if p["plan"] == "fused" and p["nano"] == 1 and _tokens(p) <= 2560}
    assert small == {1, 2, 4}
    # round-robin: the first eight points already hold every plan group
    assert {(p["plan"], p["nano"] > 1) for p in pts[:8]} == {("alone", False), ("loop", False), ("fused", False),
                                                              ("fused", True)}


def test_design_fits_the_host_scales_from_several_host_bound_points(art):
    """Per model, the fit points whose prediction a host scale moves (elasticity >= 0.4 under the
    shipped artifact): at least 3 of the loop plan (the first design had 1) and 4 of fused (it had 2)."""
    pts = _points(cb.MODELS)
    base = cb.predict_ms(art, pts)
    fit = (pts.role == "fit").to_numpy()
    for group, plan in (("loop", "loop"), ("fused", "fused")):
        el = np.log(cb.predict_ms(cb.derive(art, {**cb.IDENTITY, f"host_{group}": 1.1}), pts) / base) / np.log(1.1)
        for m in cb.MODELS:
            rows = fit & (pts.plan == plan).to_numpy() & (pts.nano == 1).to_numpy() & (pts.model == m).to_numpy()
            assert (el[rows] >= 0.4).sum() >= (3 if group == "loop" else 4), (group, m, el[rows])


def test_point_wall_s_follows_the_protocol():
    fast, slow = cb.point_wall_s(100.0), cb.point_wall_s(900.0)
    assert fast["reps"] == 15 and slow["reps"] == cb.MIN_REPS  # 1.5 s of steps; at least 3
    assert cb.point_wall_s(50.0)["reps"] == cb.MAX_REPS
    for ms in (50.0, 100.0, 160.0, 250.0, 400.0, 900.0):
        w = cb.point_wall_s(ms)
        assert 3 <= w["readings"] <= 2 + w["reps"] // 2
        assert w["wall_s"] > w["reps"] * ms / 1e3 + cb.WARMUP_X * ms / 1e3
    assert cb.point_wall_s(160.0, max_reps=8, mid_readings=False)["readings"] == 2
    assert not cb.more_reps(cb.MAX_REPS, 0.0) and cb.more_reps(2, 9.0) and not cb.more_reps(3, cb.TIMED_S)
    assert cb.probe_due(2, 0.0) and not cb.probe_due(3, 9.0) and not cb.probe_due(4, 0.1) and cb.probe_due(4, 0.5)


H200_1202 = Path(__file__).resolve().parents[2] / "profiler" / "data" / "validation" / "h200_2026-12-02"


def test_the_design_costs_no_more_wall_time_than_the_first(art):
    """``point_wall_s`` reproduces the first design's two H200 calibrations (every ``reps``; the
    warm one's wall time within 3%), and the second design, at the step times the first
    calibration predicts, costs no more than the first design did."""
    if not (H200_1202 / "calibrated_h200_end_points.csv").exists():
        pytest.skip(f"{H200_1202} absent")
    for name in ("calibrated_h200", "calibrated_h200_end"):
        old = pd.read_csv(H200_1202 / f"{name}_points.csv", dtype={"members": str})
        w = [cb.point_wall_s(ms, max_reps=8, mid_readings=False) for ms in old.measured_ms]
        assert [x["reps"] for x in w] == old.reps.tolist(), name
    probes = pd.read_csv(H200_1202 / "calibrated_h200_end_points_probes.csv")
    est = sum(x["wall_s"] for x in w)  # the end calibration: a warm kernel cache
    assert est == pytest.approx(probes.t_s.max() - probes.t_s.min(), rel=0.03)
    cal = load_artifact(H200_1202 / "calibrated_h200.json")
    new = _points(cb.MODELS)
    new_w = [cb.point_wall_s(ms) for ms in cb.predict_ms(cal, new)]
    old_w = [cb.point_wall_s(ms, max_reps=8, mid_readings=False) for ms in cb.predict_ms(cal, old)]
    assert sum(x["wall_s"] for x in new_w) <= sum(x["wall_s"] for x in old_w)
    assert min(x["readings"] for x in new_w) >= 3


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


def test_the_split_host_fit_tells_the_per_adapter_launch_cost_from_the_fixed_one(art):
    """A machine whose per-adapter host term (``cpu_n``) is 1.6x the artifact's and its fixed ones
    1.1x: the split fit recovers both scales per family and predicts every point; the default fit
    (one host scale per family) cannot, and ``derive`` without ``*_n`` keys is what it was."""
    true = {**cb.IDENTITY, "host_loop:llama3-8b": 1.1, "host_loop_n:llama3-8b": 1.6, "host_fused:llama3-8b": 0.9,
            "host_fused_n:llama3-8b": 1.4}
    pts = _points()
    pts["measured_ms"] = cb.predict_ms(cb.derive(art, true), pts)
    params, _ = cb.fit(art, pts, split_host=True)
    for k in ("host_loop_n:llama3-8b", "host_fused_n:llama3-8b", "host_loop:llama3-8b", "host_fused:llama3-8b"):
        assert abs(params[k] / true[k] - 1) < 0.05, (k, params[k])
    split = np.abs(cb.predict_ms(cb.derive(art, params), pts) / pts.measured_ms - 1)
    one, _ = cb.fit(art, pts)
    assert not any(k.endswith("_n:llama3-8b") for k in one)
    single = np.abs(cb.predict_ms(cb.derive(art, one), pts) / pts.measured_ms - 1)
    assert split.max() < 0.02 and single.max() > 2 * split.max() and single.max() > 0.03
    plain = {"host_loop:llama3-8b": 1.1}
    assert cb.predict_ms(cb.derive(art, plain), pts).tolist() == \
        cb.predict_ms(cb.derive(art, {**plain, "host_loop_n:llama3-8b": 1.0}), pts).tolist()


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
    e = cal["calibration"]["error"]["calibrated"]
    assert (f"calibration held-out median |error| {e['heldout']['median_ape']:.2%} ({e['heldout']['points']}): "
            f"host-bound {e['heldout_host_bound']['median_ape']:.2%} ({e['heldout_host_bound']['points']})") in shown
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
            for f in HOST_FIELDS:
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


def test_host_share_splits_the_heldout_error_into_host_and_gpu_bound(art, tmp_path, capsys):
    """``host_share`` is the step's elasticity to the host speed: near 1 for the 512-token job alone
    (the eager step's host floor), near 0 for the 8,192-token one; ``summarize`` splits the
    held-out points at ``HOST_BOUND_SHARE`` and the CLI prints both medians."""
    pts = _points()
    share = cb.host_share(art, pts)
    alone = (pts.plan == "alone").to_numpy()
    small, big = alone & (pts.tokens == 512).to_numpy(), alone & (pts.tokens == 8192).to_numpy()
    assert (share[small] > 0.8).all() and (share[big] < 0.2).all() and ((share >= 0) & (share <= 1.01)).all()
    # a host 30% slower than the artifact: host-bound points are off, GPU-bound ones are not
    pts["measured_ms"] = cb.predict_ms(cb.with_host_speed(art, 1.3), pts)
    pts["host_share"] = share
    pts["shipped_ms"] = cb.predict_ms(art, pts)
    s = cb.summarize(pts, "shipped_ms")
    hb, gb = s["heldout_host_bound"], s["heldout_gpu_bound"]
    assert hb["points"] + gb["points"] == s["heldout"]["points"] and hb["points"] > 0 and gb["points"] > 0
    assert hb["median_ape"] > 0.1 > 0.05 > gb["median_ape"]
    assert "heldout_host_bound" not in cb.summarize(pts.drop(columns="host_share"), "shipped_ms")
    pts.drop(columns=["host_share", "shipped_ms"]).to_csv(tmp_path / "p.csv", index=False)
    assert main(["costmodel", "calibrate", "--gpu-name", "H200", "--points", str(tmp_path / "p.csv"),
                 "--out", str(tmp_path / "cal.json")]) == 0
    text = capsys.readouterr().out
    assert "heldout_median_ape_calibrated_host_bound=" in text and "host-bound" in text and "GPU-bound" in text
    cal = load_artifact(tmp_path / "cal.json")
    e = cal["calibration"]["error"]["calibrated"]
    # the split is the calibrated artifact's (a slower host: more points host-bound than under the shipped one)
    held = (pts.role == "heldout").to_numpy()
    n = int((cb.host_share(cal, pts)[held] >= cb.HOST_BOUND_SHARE).sum())
    assert e["heldout_host_bound"]["points"] == n >= hb["points"] and e["heldout_host_bound"]["median_ape"] < 0.01
