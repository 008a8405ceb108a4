"""Issue 44 item 2: a live export (running and pending rows) replays; the rows are skipped and counted
like Slurm's (``state_running``, ``never_started``); a ``state`` column filters with ``keep_states``."""

from __future__ import annotations

import json

import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.traces import read_trace
from tlora_sim.traces.errors import InputError

LIVE = ("id,submitted,started,ended,n,phase\n"
        "a,0,5,100,1,Succeeded\n"
        "b,10,20,,2,Running\n"        # running: no end
        "c,20,,,1,Pending\n"          # pending: no start
        "d,30,40,90,0,Succeeded\n"    # CPU job
        "e,40,41,99,1,Failed\n"
        "f,50,Unknown,None,1,Pending\n")
COLS = {"submit": "submitted", "start": "started", "end": "ended", "gpus": "n", "job_id": "id"}


def test_running_and_pending_rows_are_skipped_and_counted(tmp_path):
    p = tmp_path / "live.csv"
    p.write_text(LIVE)
    t = read_trace(f"csv:{p}", csv_columns=COLS)
    assert t["job_id"].tolist() == ["a", "e"]
    assert t.attrs["skipped"] == {"never_started": 2, "state_running": 1, "zero_gpus": 1, "zero_duration": 0}


def test_keep_states_filters_by_the_state_column(tmp_path):
    p = tmp_path / "live.csv"
    p.write_text(LIVE)
    t = read_trace(f"csv:{p}", csv_columns={**COLS, "state": "phase"}, keep_states="succeeded")
    assert t["job_id"].tolist() == ["a"]
    assert t.attrs["skipped"]["state_failed"] == 1 and t.attrs["skipped"]["state_running"] == 1
    assert t.attrs["skipped"]["state_pending"] == 2  # the state rule comes first
    with pytest.raises(InputError, match="map it") as e:
        read_trace(f"csv:{p}", csv_columns=COLS, keep_states="Succeeded")
    assert e.value.field == "keep_states"


def test_a_bad_value_in_a_running_row_still_names_its_row(tmp_path):
    p = tmp_path / "live.csv"
    p.write_text(LIVE.replace("e,40,41,99,1", "e,40,41,99,x"))
    with pytest.raises(InputError, match="not a number") as e:
        read_trace(f"csv:{p}", csv_columns=COLS)
    assert (e.value.row, e.value.field) == (5, "n")


def test_live_export_replays_and_the_kept_line_names_the_skips(tmp_path, capsys):
    p = tmp_path / "live.csv"
    p.write_text(LIVE)
    out = tmp_path / "r"
    rc = main(["replay", "--policy", "tlora", "--trace", f"csv:{p}", "--columns",
               "submit=submitted,start=started,end=ended,gpus=n,job_id=id,state=phase", "--keep-states",
               "Succeeded,Failed,Running", "--cluster", "1x8xH100", "--out", str(out), "--no-plots", "--no-progress"])
    assert rc == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "kept 2 of 6 jobs (skipped: state_pending 2, state_running 1, zero_gpus 1)" in line
    assert json.loads((out / "summary.json").read_text())["skipped"]["state_running"] == 1
    assert json.loads((out / "config.json").read_text())["inputs"]["keep_states"] == "Succeeded,Failed,Running"
