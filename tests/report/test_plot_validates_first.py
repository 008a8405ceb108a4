"""``plot`` checks every file and column it needs before it draws anything (issue 22): a run whose
timeline holds a value that is not a number is refused with one line naming the file, row and
column, and the figures already in the directory are left exactly as they were (the JCT figures
used to be rewritten before the timeline was read)."""

from __future__ import annotations

import pandas as pd
import pytest

from tlora_sim.sim.experiments.replay import ReplayConfig, replay
from tlora_sim.sim.report.plots import plot_run
from tlora_sim.traces.errors import InputError


def test_a_bad_timeline_stops_plot_before_any_figure(tmp_path):
    out = tmp_path / "run"
    replay(ReplayConfig(trace="synthetic:jobs=20,seed=1", policy="independent", cluster="1x8xH100"), out,
           progress=False)
    figs = sorted((out / "figures").iterdir())
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in figs}
    tl = pd.read_csv(out / "timeline.csv", dtype=str)
    tl.loc[3, "tokens_per_s"] = "lots"
    tl.to_csv(out / "timeline.csv", index=False)
    with pytest.raises(InputError) as e:
        plot_run(out)
    assert "timeline.csv" in str(e.value) and "tokens_per_s" in str(e.value) and "row 4" in str(e.value)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((out / "figures").iterdir())} == before
