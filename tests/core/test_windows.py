"""Issue 44 item 4: --window, --first-jobs, --arrival-scale on every reader, recorded in config.json;
``traces describe`` shows the GPU demand and the cluster sizes for loads 0.7/0.9/1.1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.traces import read_trace
from tlora_sim.traces.describe import describe_trace
from tlora_sim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
ITP = Path("/work/shared/traces/msr-itp-elasticflow")
PHILLY = ("timestamp,duration,num_gpus,cluster\n"
          "2017-10-01 00:00:00,100,1,vc1\n2017-10-01 06:00:00,200,2,vc2\n2017-10-02 00:00:00,300,1,vc1\n"
          "2017-10-03 00:00:00,400,4,vc2\n")


@pytest.fixture
def philly(tmp_path):
    p = tmp_path / "philly.csv"
    p.write_text(PHILLY)
    return f"philly:{p}"


def test_window_in_seconds_and_dates(philly):
    whole = read_trace(philly)
    by_s = read_trace(philly, window="3600,172800")  # [1 h, 2 days)
    by_date = read_trace(philly, window="2017-10-01T01:00,2017-10-03")  # US/Pacific like the trace
    for t in (by_s, by_date):
        assert t["duration_s"].tolist() == [200.0, 300.0] and t["submit_time_s"].tolist() == [0.0, 18 * 3600.0]
        assert t.attrs["skipped"]["outside_window"] == 2
    assert by_date.attrs["epoch_s"] == whole.attrs["epoch_s"] + 6 * 3600
    assert read_trace(philly, window=",86400")["duration_s"].tolist() == [100.0, 200.0]


def test_first_jobs_and_arrival_scale(philly):
    t = read_trace(philly, first_jobs=3, arrival_scale=2.0)
    assert t["submit_time_s"].tolist() == [0.0, 3 * 3600.0, 12 * 3600.0]
    assert t["duration_s"].tolist() == [100.0, 200.0, 300.0] and t.attrs["skipped"]["after_first_jobs"] == 1


@pytest.mark.parametrize("kw, field", [({"window": "5,1"}, "window"), ({"window": "1"}, "window"),
                                       ({"window": "1e9,2e9"}, "window"), ({"first_jobs": 0}, "first_jobs"),
                                       ({"arrival_scale": 0.0}, "arrival_scale"),
                                       ({"arrival_scale": float("nan")}, "arrival_scale"),
                                       ({"window": "2017-10-01,"}, "window")])
def test_bad_cuts_are_one_error(kw, field):
    with pytest.raises(InputError) as e:
        read_trace("synthetic:jobs=30,seed=1", **kw)
    assert e.value.field == field


def test_csv_with_iso_times_takes_dates(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("t,d,g\n2024-01-01T00:00:00+01:00,10,1\n2024-01-02T00:00:00+01:00,10,1\n")
    t = read_trace(f"csv:{p}", csv_columns={"submit": "t", "duration": "d", "gpus": "g"},
                   window="2024-01-01T12:00Z,")
    assert len(t) == 1 and t.attrs["skipped"]["outside_window"] == 1


@pytest.mark.skipif(not ITP.is_dir(), reason="the ITP trace is not in /work/shared/traces (not shipped)")
def test_itp_cluster_window_and_cli_records_the_cuts(tmp_path, capsys):
    spec = f"itp:{ITP / 'cluster10.csv.gz'}"
    out = tmp_path / "r"
    rc = main(["-q", "replay", "--policy", "tlora", "--trace", spec, "--window", "0,2e6", "--first-jobs", "40",
               "--arrival-scale", "1.5", "--cluster", "2x8xH100", "--out", str(out), "--no-plots"])
    assert rc == 0
    inputs = json.loads((out / "config.json").read_text())["inputs"]
    assert (inputs["window"], inputs["first_jobs"], inputs["arrival_scale"]) == ("0,2e6", 40, 1.5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input_jobs"] == len(read_trace(spec)) and summary["skipped"]["after_first_jobs"] > 0


def test_describe_gives_demand_and_cluster_sizes(philly, capsys):
    d = describe_trace(read_trace(philly))
    horizon = 2 * 86400 + 400.0  # last submit + its duration
    demand = (100 + 400 + 300 + 1600) / horizon
    assert d["gpu_demand_mean"] == pytest.approx(demand)
    assert d["cluster_gpus_for_load"] == {load: int(np.ceil(demand / load)) for load in (0.7, 0.9, 1.1)}
    assert main(["traces", "describe", philly.replace("philly:", "csv:"), "--columns",
                 "submit=timestamp,duration=duration,gpus=num_gpus", "--time-zone", "America/Chicago"]) == 0
    text = capsys.readouterr().out
    assert "starts     2017-10-01T00:00:00-05:00" in text and "load 0.7 on" in text
    assert main(["traces", "describe", philly, "--time-zone", "America"]) == 2


def test_strict_does_not_refuse_the_cuts_it_was_asked_for(tmp_path):
    out = tmp_path / "r"
    assert main(["-q", "replay", "--policy", "tlora", "--trace", "synthetic:jobs=30,seed=1", "--first-jobs", "10",
                 "--window", "0,1e9", "--strict", "--cluster", "2x8xH100", "--out", str(out), "--no-plots"]) == 0
    assert json.loads((out / "summary.json").read_text())["kept_jobs"] == 10


def test_window_as_a_pair_from_python(philly):
    assert read_trace(philly, window=(3600, None)).equals(read_trace(philly, window="3600,"))
