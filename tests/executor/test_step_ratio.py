"""``sim/executor/step_ratio.py``: measured over predicted steps of committed executed runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tlora_sim.sim.executor import step_ratio

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "profiler" / "data" / "validation" / "h100_third" / "tlora"


def _script():
    return step_ratio


def test_every_steady_step_is_set_against_its_prediction(tmp_path, capsys):
    mod = _script()
    assert mod.main([str(RUN), "--csv", str(tmp_path / "r.csv")]) == 0
    rows = pd.read_csv(tmp_path / "r.csv")
    steps = pd.read_csv(RUN / "steps.csv")
    assert len(rows) == int((steps.event == "step").sum()) > 100
    assert (rows.predicted_s > 0).all() and rows.ratio.to_numpy() == pytest.approx(
        (rows.measured_s / rows.predicted_s).to_numpy())
    assert set(rows.plan) == {"fused"} and rows.members.between(1, 16).all()
    assert "fused" in capsys.readouterr().out


def test_a_directory_without_steps_is_refused(tmp_path):
    with pytest.raises(SystemExit) as e:
        _script().main([str(tmp_path)])
    assert e.value.code == 2
