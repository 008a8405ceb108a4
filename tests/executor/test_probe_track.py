"""``sim/executor/probe_track.py``: does the host-speed probe follow the executed steps?

A committed executed run (H200, workload B, independent) is copied and its steps re-timed so that
measured = the calibrated prediction x a known factor, with ``probes.csv`` written to give that
factor: r must then follow the probe exactly (correlation 1, slope 1, ~100% removed); with the
inverse factor it must not (slope -1, removal -100%).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.executor import probe_track

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "profiler" / "data" / "validation" / "h200_2026-12-02"
RUN, CAL = DATA / "B" / "independent", DATA / "calibrated_h200.json"
#: the factor of each 30-s piece (multiples of the 0.5% quantum, so the probes' factor is exact)
PIECE_S, FACTORS = 30.0, [1.0, 1.3, 0.8, 1.15, 0.9, 1.25, 0.85, 1.1, 0.95, 1.2, 1.05, 1.35]

pytestmark = pytest.mark.skipif(not (RUN / "steps.csv").is_file() or not CAL.is_file(),
                                reason="the committed 2026-12-02 H200 run is absent")


def synthetic_run(tmp_path: Path, invert: bool) -> Path:
    """A copy of ``RUN`` whose steps are laid end to end with measured = predicted x g(t), g = the
    piece's factor (or its inverse with ``invert``), no step crossing a piece boundary, and whose
    probes (one at each piece's start, 30 s apart, so the +-10 s median is the probe itself) give
    the piece's factor."""
    d = tmp_path / ("inverse" if invert else "follows")
    shutil.copytree(RUN, d)
    steps = pd.read_csv(d / "steps.csv")
    ref = probe_track.references(json.loads(CAL.read_text()), CAL)[0]
    from tlora_sim.sim.executor.steptable import predicted_s, step_rows
    from tlora_sim.sim.executor.validate import load_run
    from tlora_sim.sim.executor.workload import executor_cost_model

    _, jobs, _, _ = load_run(RUN)
    cm = executor_cost_model("H200", str(CAL))
    rows = step_rows(steps)  # step rows in (group, start) order, as probe_track reads them
    p = dict(zip(zip(rows.group_id, rows.start_s), predicted_s(cm, "H200", jobs, rows)))
    t, out = 0.0, []
    for _, s in steps.sort_values("start_s", kind="stable").iterrows():
        k = int(t // PIECE_S)
        g = FACTORS[k] if not invert else 1 / FACTORS[k]
        dur = p[(s.group_id, s.start_s)] * g if s.event == "step" else 0.01
        if int((t + dur) // PIECE_S) != k:  # start at the next piece instead
            t = (k + 1) * PIECE_S
            k += 1
            g = FACTORS[k] if not invert else 1 / FACTORS[k]
            dur = p[(s.group_id, s.start_s)] * g if s.event == "step" else 0.01
        out.append({**s.to_dict(), "start_s": t, "end_s": t + dur, "ms": dur * 1e3})
        t += dur
    assert t < PIECE_S * len(FACTORS) and sum(o["event"] == "step" for o in out) > 100
    pd.DataFrame(out).to_csv(d / "steps.csv", index=False)
    pd.DataFrame({"t_s": np.arange(len(FACTORS)) * PIECE_S, "probe_ms": np.array(FACTORS) * ref,
                  "python_ms": 3.0 + np.arange(len(FACTORS)) % 3}).to_csv(d / "probes.csv", index=False)
    return d


def row(table: pd.DataFrame, signal: str = "probe", at: str = "mid") -> pd.Series:
    return table[(table.signal == signal) & (table["at"] == at)].iloc[0]


def test_r_that_follows_the_factor_is_found_to_follow_it(tmp_path):
    table, win, st = probe_track.track(synthetic_run(tmp_path, invert=False), CAL)
    assert st.r.to_numpy() == pytest.approx(st.probe_factor.to_numpy(), rel=1e-9)
    assert (win.r_median.to_numpy() == pytest.approx(win.probe_mid.to_numpy(), rel=1e-9))
    for at in ("start", "mid"):
        r = row(table, at=at)
        assert r.windows >= 8 and r.pearson == pytest.approx(1.0) and r.spearman == pytest.approx(1.0)
        assert r.slope_log == pytest.approx(1.0)
        assert r.median_abs_log_r > 0.05 and r.removed_share == pytest.approx(1.0, abs=1e-9)
    # the host-terms-only model removes part of it, not more than the whole
    assert 0 < row(table).removed_share_model <= 1 + 1e-9


def test_r_that_does_not_follow_the_factor_is_found_not_to(tmp_path):
    table, _, st = probe_track.track(synthetic_run(tmp_path, invert=True), CAL)
    r = row(table)
    assert r.spearman == pytest.approx(-1.0) and r.pearson < -0.9 and r.slope_log == pytest.approx(-1.0)
    assert r.removed_share == pytest.approx(-1.0, abs=1e-9)  # |log(1/f / f)| = 2 |log f|


def test_calibration_points_that_follow_their_probe(tmp_path):
    art = json.loads(CAL.read_text())
    for p in art["calibration"]["points"]:
        p["measured_ms"] = p["calibrated_no_probe_ms"] * p["probe_factor"]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(art))
    cal = probe_track.calibration_rows(path)
    pr = cal[cal.signal == "probe"].iloc[0]
    host = sum(p["tokens"] <= probe_track.HOST_BOUND_TOKENS for p in art["calibration"]["points"])
    assert pr.points == host >= 3 and pr.pearson == pytest.approx(1.0) and pr.slope_log == pytest.approx(1.0)
    assert pr.removed_share == pytest.approx(1.0)


def test_cli_writes_both_tables_and_refuses_a_run_without_probes(tmp_path, capsys):
    d = synthetic_run(tmp_path, invert=False)
    out = tmp_path / "pt.csv"
    assert probe_track.main([str(d), "--artifact", str(CAL), "--calibrations", str(CAL), "--out", str(out)]) == 0
    t = pd.read_csv(out)
    assert set(t.run) == {f"{tmp_path.name}/follows", "all"}
    assert len(t) == 8 and (tmp_path / "pt_calibrations.csv").is_file()
    assert "removed_share" in capsys.readouterr().out
    (d / "probes.csv").unlink()
    assert probe_track.main([str(d), "--artifact", str(CAL)]) == 2
    assert "probes.csv" in capsys.readouterr().out
