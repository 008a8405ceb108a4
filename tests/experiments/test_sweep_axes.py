"""Issue 41, sweeps: the reference is always a cell, policy options and the discipline may be axes,
and reader options reach only the traces whose format takes them (refused up front when none does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tlora_sim.sim.experiments import sweep as sw
from tlora_sim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "docs" / "examples" / "slurm_sacct.txt"


def _sweep(tmp_path, text):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return sw.load_sweep(p)


def test_policy_option_lists_and_disciplines_are_axes(tmp_path):
    s = _sweep(tmp_path, 'traces = ["synthetic:jobs=10"]\npolicies = ["tlora", "mlora"]\n'
                         'disciplines = ["default", "shared"]\n[policy_options.tlora]\n'
                         'ordering = ["urgency", "backfill"]\nmax_group_size = 4\n')
    tl = [c for c in s.cells if c.policy == "tlora"]
    assert sorted(dict(c.policy_options)["ordering"] for c in tl) == ["backfill", "backfill", "urgency", "urgency"]
    assert all(dict(c.policy_options)["max_group_size"] == 4 for c in tl)
    assert {c.policy for c in s.cells} == {"independent-backfill", "tlora", "mlora"}  # the reference added
    assert len(s.cells) == (1 + 2 + 1) * 2 and {c.discipline for c in s.cells} == {"default", "shared"}
    assert len({c.cell_id for c in s.cells}) == len(s.cells)
    assert s.lists["reference"] == "independent-backfill"
    cfg = sw.replay_config(next(c for c in s.cells if c.policy == "tlora" and c.discipline == "shared"))
    assert cfg.discipline == "shared" and cfg.reference == "independent-backfill"
    assert cfg.policy_options["ordering"] in ("urgency", "backfill")


@pytest.mark.parametrize("text, field", [
    ('[policy_options.tlora]\nordering = ["urgency", "nope"]\n', "policy_options.tlora.ordering"),
    ('[policy_options.tlora]\nordering = []\n', "policy_options.tlora.ordering"),
    ('[policy_options.tlora]\nordering = ["fifo", "fifo"]\n', "policy_options.tlora.ordering[1]"),
    ('disciplines = ["fair"]\n', "disciplines[0]"),
    ('reference = 3\n', "reference"),
])
def test_bad_axes_are_refused_with_the_field(tmp_path, text, field):
    with pytest.raises(InputError) as e:
        _sweep(tmp_path, 'traces = ["synthetic:jobs=10"]\npolicies = ["tlora"]\n' + text)
    assert e.value.field == field


def test_reader_options_reach_only_the_formats_that_take_them(tmp_path):
    s = _sweep(tmp_path, f'traces = ["slurm:{SLURM}", "synthetic:jobs=10"]\npolicies = ["independent-backfill"]\n'
                         f'clusters = ["4x8xH100"]\ntime_zone = "America/Los_Angeles"\n')
    by = {c.trace.split(":")[0]: c for c in s.cells}
    assert by["slurm"].time_zone == "America/Los_Angeles" and by["synthetic"].time_zone is None
    res = sw.run_sweep(s, tmp_path / "out", workers=1, progress=False)
    assert res.ran == 2 and not res.failed  # no cell fails at run time on an option its reader refuses
    with pytest.raises(InputError, match="no trace of this sweep") as e:
        _sweep(tmp_path, 'traces = ["synthetic:jobs=10"]\npolicies = ["tlora"]\nslurm_states = "COMPLETED"\n')
    assert e.value.field == "slurm_states"


def test_trace_cuts_are_axes_and_reach_the_replay(tmp_path):
    s = _sweep(tmp_path, 'traces = ["synthetic:jobs=40,seed=1"]\npolicies = ["independent-backfill"]\n'
                         'clusters = ["1x8xH100"]\nfirst_jobs = [10, 20]\narrival_scales = [1.0, 2.0]\n')
    assert len(s.cells) == 4 and len({c.cell_id for c in s.cells}) == 4
    cfg = sw.replay_config(next(c for c in s.cells if c.first_jobs == 20 and c.arrival_scale == 2.0))
    assert cfg.first_jobs == 20 and cfg.arrival_scale == 2.0
    uncut = _sweep(tmp_path, 'traces = ["synthetic:jobs=40,seed=1"]\npolicies = ["independent-backfill"]\n'
                             'clusters = ["1x8xH100"]\n')
    assert "first_jobs" not in uncut.cells[0].identity()  # uncut cells keep their earlier ids
    res = sw.run_sweep(s, tmp_path / "out", workers=1, progress=False)
    assert res.ran == 4 and not res.failed
    import pandas as pd

    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert sorted(zip(table["first_jobs"], table["kept_jobs"])) == [(10, 10), (10, 10), (20, 20), (20, 20)]


@pytest.mark.parametrize("text, field", [
    ("first_jobs = [0]\n", "first_jobs[0]"),
    ("arrival_scales = [-1.0]\n", "arrival_scales[0]"),
    ('windows = ["1,2,3"]\n', "windows[0]"),
])
def test_bad_trace_cuts_are_refused_with_the_field(tmp_path, text, field):
    with pytest.raises(InputError) as e:
        _sweep(tmp_path, 'traces = ["synthetic:jobs=10"]\npolicies = ["tlora"]\n' + text)
    assert e.value.field == field
