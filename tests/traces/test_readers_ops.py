"""Operators' logs as traces: the csv format with timestamps and end/start columns, pod tables with CPU pods,
and the slurm format for ``sacct --parsable2`` exports (traces/README.md, issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tlora_sim.traces import read_trace, validate_frame
from tlora_sim.traces.errors import InputError
from tlora_sim.traces.generic_csv import parse_column_mapping
from tlora_sim.traces.slurm import DEFAULT_STATES, gres_gpus, parse_states, tres_gpus

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def raises_at(spec: str, *, row, field, file, match: str, **kw) -> InputError:
    with pytest.raises(InputError, match=match) as info:
        read_trace(spec, **kw)
    e = info.value
    assert (e.row, e.field, e.file) == (row, field, None if file is None else str(file)), str(e)
    assert "\n" not in str(e)
    return e


def by_id(df):
    return df.set_index("job_id")


# ------------------------------------------------------------------------------------------- csv: times
ISO = """id,sub,begin,fin,dur,g
a,2024-03-31T01:30:00,2024-03-31T01:40:00,2024-03-31T03:30:00,600,1
b,2024-03-31 00:00:00,2024-03-31 00:30:00,2024-03-31 01:00:00,60,2
c,2024-03-30,2024-03-30T00:00:00,2024-03-30T00:00:10,5,4
"""


def test_csv_iso_times_with_end_give_end_minus_submit_in_utc(tmp_path):
    p = write(tmp_path, "iso.csv", ISO)
    df = read_trace(f"csv:{p}", csv_columns={"submit": "sub", "end": "fin", "gpus": "g", "job_id": "id"})
    validate_frame(df)
    d = by_id(df)
    assert df["job_id"].tolist() == ["c", "b", "a"]  # sorted by submit
    assert d.loc["c", "submit_time_s"] == 0.0 and d.loc["b", "submit_time_s"] == 86400.0
    assert d.loc["a", "submit_time_s"] == 86400.0 + 5400.0
    assert d.loc["a", "duration_s"] == 7200.0 and d.loc["b", "duration_s"] == 3600.0 and d.loc["c", "duration_s"] == 10.0


def test_csv_time_zone_applies_to_naive_times_across_a_dst_change(tmp_path):
    p = write(tmp_path, "iso.csv", ISO)
    cols = {"submit": "sub", "end": "fin", "gpus": "g", "job_id": "id"}
    berlin = by_id(read_trace(f"csv:{p}", csv_columns=cols, time_zone="Europe/Berlin"))
    # 2024-03-31 02:00 CET -> 03:00 CEST: 01:30 to 03:30 local is one hour on the absolute time line
    assert berlin.loc["a", "duration_s"] == 3600.0 and berlin.loc["b", "duration_s"] == 3600.0
    assert berlin.loc["a", "submit_time_s"] == 86400.0 + 5400.0
    tokyo = by_id(read_trace(f"csv:{p}", csv_columns=cols, time_zone="Asia/Tokyo"))  # no DST: same as UTC
    assert tokyo.loc["a", "duration_s"] == 7200.0


def test_csv_times_with_offsets_are_absolute_whatever_the_time_zone(tmp_path):
    p = write(tmp_path, "aware.csv", "id,sub,fin,g\n"
                                     "a,2024-06-01T10:00:00Z,2024-06-01T14:00:00+02:00,1\n"
                                     "b,2024-06-01T12:00:00+02:00,2024-06-01T10:30:00Z,1\n")
    cols = {"submit": "sub", "end": "fin", "gpus": "g", "job_id": "id"}
    for tz in (None, "America/Chicago"):
        d = by_id(read_trace(f"csv:{p}", csv_columns=cols, time_zone=tz))
        assert d.loc["a", "duration_s"] == 7200.0 and d.loc["b", "duration_s"] == 1800.0
        assert d.loc["b", "submit_time_s"] == 0.0


def test_csv_epoch_seconds_and_milliseconds(tmp_path):
    s = write(tmp_path, "epoch_s.csv", "sub,fin,g\n1714550400,1714554000,1\n1714550460,1714550520,8\n")
    df = read_trace(f"csv:{s}", csv_columns={"submit": "sub", "end": "fin", "gpus": "g"})
    assert df["submit_time_s"].tolist() == [0.0, 60.0] and df["duration_s"].tolist() == [3600.0, 60.0]
    ms = write(tmp_path, "epoch_ms.csv", "sub,fin,g\n1714550400000,1714554000000,1\n1714550460000,1714550520500,8\n")
    df = read_trace(f"csv:{ms}", csv_columns={"submit": "sub", "end": "fin", "gpus": "g"}, time_unit="ms")
    assert df["submit_time_s"].tolist() == [0.0, 60.0] and df["duration_s"].tolist() == [3600.0, 60.5]


def test_csv_runtime_end_minus_start_end_minus_submit_or_duration(tmp_path):
    p = write(tmp_path, "iso.csv", ISO)
    base = {"submit": "sub", "gpus": "g", "job_id": "id"}
    with_start = by_id(read_trace(f"csv:{p}", csv_columns={**base, "start": "begin", "end": "fin"}))
    no_start = by_id(read_trace(f"csv:{p}", csv_columns={**base, "end": "fin"}))
    duration = by_id(read_trace(f"csv:{p}", csv_columns={**base, "duration": "dur"}, time_unit="min"))
    assert with_start.loc["a", "duration_s"] == 7200.0 - 600.0  # the 10 min the log queued are left out
    assert with_start.loc["b", "duration_s"] == 1800.0
    assert no_start.loc["a", "duration_s"] == 7200.0
    assert duration.loc["a", "duration_s"] == 600 * 60.0 and duration.loc["c", "duration_s"] == 300.0
    # submit times come from submit in every case, never from start
    assert with_start["submit_time_s"].equals(no_start["submit_time_s"])


@pytest.mark.parametrize("mapping, match", [
    ("submit=s,duration=d,end=e,gpus=g", "either duration or end, not both"),
    ("submit=s,start=b,duration=d,gpus=g", "start is used only with end"),
    ("submit=s,start=b,gpus=g", r"lacks duration \(or end\)"),
    ("submit=s,end=e", "lacks gpus"),
])
def test_csv_mapping_rules_for_end_and_start(mapping, match):
    with pytest.raises(InputError, match=match) as info:
        parse_column_mapping(mapping)
    assert info.value.field == "--columns"
    assert parse_column_mapping("submit=s,start=b,end=e,gpus=g") == {"submit": "s", "start": "b", "end": "e", "gpus": "g"}


def test_csv_end_before_start_or_submit_names_file_row_field(tmp_path):
    p = write(tmp_path, "bad.csv", "id,sub,begin,fin,g\n"
                                   "a,2024-05-01T10:00:00,2024-05-01T10:05:00,2024-05-01T11:00:00,1\n"
                                   "b,2024-05-01T10:00:00,2024-05-01T10:30:00,2024-05-01T10:20:00,1\n")
    raises_at(f"csv:{p}", row=2, field="fin", file=p, match="end precedes start",
              csv_columns={"submit": "sub", "start": "begin", "end": "fin", "gpus": "g"})
    q = write(tmp_path, "bad2.csv", "sub,fin,g\n100,200,1\n300,250,1\n")
    raises_at(f"csv:{q}", row=2, field="fin", file=q, match="end precedes submit.*'250'",
              csv_columns={"submit": "sub", "end": "fin", "gpus": "g"})


def test_csv_bad_times_name_file_row_field(tmp_path):
    cols = {"submit": "sub", "end": "fin", "gpus": "g"}
    p = write(tmp_path, "t.csv", "sub,fin,g\n2024-05-01T10:00:00,2024-05-01T11:00:00,1\n"
                                 "2024-05-01T10:00:00,2024-13-01T11:00:00,1\n2024-05-01T10:00:00,,1\n")
    raises_at(f"csv:{p}", row=2, field="fin", file=p, match="not a number or an ISO 8601 time.*2024-13-01", csv_columns=cols)
    m = write(tmp_path, "mixed.csv", "sub,fin,g\n100,2024-05-01T11:00:00,1\n")
    raises_at(f"csv:{m}", row=None, field="fin", file=m, match="must all be numbers or all ISO 8601 times", csv_columns=cols)
    n = write(tmp_path, "neg.csv", "sub,fin,g\n100,200,1\n-5,200,1\n")
    raises_at(f"csv:{n}", row=2, field="sub", file=n, match=">= 0", csv_columns=cols)
    with pytest.raises(InputError, match="unknown time zone 'Mars/Olympus'") as info:
        read_trace(f"csv:{n}", csv_columns=cols, time_zone="Mars/Olympus")
    assert info.value.field == "time_zone"


# ------------------------------------------------------------------------------------------- csv: GPUs
def test_csv_zero_gpu_rows_are_skipped_and_counted_before_their_fields_are_checked(tmp_path):
    p = write(tmp_path, "z.csv", "id,t,d,g\na,0,10,1\ncpu1,5,10,0\nb,7,20,2\ncpu2,oops,,0\n")
    df = read_trace(f"csv:{p}", csv_columns={"submit": "t", "duration": "d", "gpus": "g", "job_id": "id"})
    assert df["job_id"].tolist() == ["a", "b"] and df.attrs["skipped"] == {"zero_gpus": 2, "zero_duration": 0}
    assert df.attrs["adjusted"] == {"gpus_rounded_up": 0}
    only = write(tmp_path, "only.csv", "t,d,g\n0,10,0\n")
    raises_at(f"csv:{only}", row=None, field="g", file=only, match="all 1 rows request zero GPUs",
              csv_columns={"submit": "t", "duration": "d", "gpus": "g"})
    neg = write(tmp_path, "neg.csv", "t,d,g\n0,10,1\n1,10,-1\n")
    raises_at(f"csv:{neg}", row=2, field="g", file=neg, match=">= 0",
              csv_columns={"submit": "t", "duration": "d", "gpus": "g"})


def test_csv_fractional_gpus_are_rounded_up_and_counted(tmp_path):
    p = write(tmp_path, "f.csv", "id,t,d,g\na,0,10,0.5\nb,1,10,2\nc,2,10,1.25\nd,3,0,0.5\n")
    df = read_trace(f"csv:{p}", csv_columns={"submit": "t", "duration": "d", "gpus": "g", "job_id": "id"})
    assert by_id(df)["num_gpus"].to_dict() == {"a": 1, "b": 2, "c": 2}
    # d is dropped for its zero duration, so only the kept rows a and c count as rounded
    assert df.attrs["adjusted"] == {"gpus_rounded_up": 2} and df.attrs["skipped"]["zero_duration"] == 1


POD_TABLE = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,9000,0
openb-pod-0001,6000,12288,0,0,,LS,Running,427,9900,427
openb-pod-0002,8000,30720,1,460,,LS,Running,1060,8898,1060
openb-pod-0003,88000,327680,8,1000,V100M32,LS,Succeeded,1200,4800,1500
openb-pod-0004,4000,4096,0,0,,BE,Succeeded,1300,1500,1301
openb-pod-0005,2000,8192,0,0,,BE,Failed,1320,1400,1320
"""


def test_alibaba_pod_table_with_cpu_pods(tmp_path):
    """cluster-trace-gpu-v2023 openb_pod_list shape: CPU pods (num_gpu 0) no longer stop the read at row 2."""
    p = write(tmp_path, "openb_pod_list_default.csv", POD_TABLE)
    cols = parse_column_mapping("submit=creation_time,start=scheduled_time,end=deletion_time,gpus=num_gpu,job_id=name")
    df = read_trace(f"csv:{p}", csv_columns=cols)
    validate_frame(df)
    assert df["job_id"].tolist() == ["openb-pod-0000", "openb-pod-0002", "openb-pod-0003"]
    assert df.attrs["skipped"] == {"zero_gpus": 3, "zero_duration": 0}
    d = by_id(df)
    assert d.loc["openb-pod-0003", "duration_s"] == 3300.0 and d.loc["openb-pod-0003", "num_gpus"] == 8
    assert d.loc["openb-pod-0002", "submit_time_s"] == 1060.0


# ------------------------------------------------------------------------------------------- slurm
HEADER = "JobID|JobName|Account|Submit|Start|End|Elapsed|AllocTRES|State"
SACCT = HEADER + """
100|train|teamA|2024-05-01T10:00:00|2024-05-01T10:05:00|2024-05-01T12:05:00|02:00:00|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
100.batch|batch|teamA|2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-01T12:05:00|02:00:00|cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
100.extern|extern|teamA|2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-01T12:05:00|02:00:00|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
100.0|python|teamA|2024-05-01T10:05:01|2024-05-01T10:05:01|2024-05-01T12:04:59|01:59:58|cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
101|wait|teamB|2024-05-01T10:30:00|Unknown|Unknown|00:00:00||PENDING
102_1|arr|teamB|2024-05-01T11:00:00|2024-05-01T11:00:10|2024-05-01T11:10:10|00:10:00|cpu=4,gres/gpu:a100=2,mem=8G|CANCELLED by 1234
102_2|arr|teamB|2024-05-01T11:00:00|2024-05-01T11:00:10|2024-05-01T11:20:10|00:20:00|cpu=4,gres/gpu:a100=2,mem=8G|TIMEOUT
102_[3-4]|arr|teamB|2024-05-01T11:00:00|None|Unknown|00:00:00||PENDING
103|cpu|teamB|2024-05-01T11:30:00|2024-05-01T11:30:05|2024-05-01T11:40:05|00:10:00|billing=2,cpu=2,mem=4G,node=1|COMPLETED
104|run|teamA|2024-05-01T12:00:00|2024-05-01T12:00:30|Unknown|00:40:00|cpu=8,gres/gpu=1|RUNNING
105|pre|teamA|2024-05-01T12:10:00|2024-05-01T12:10:01|2024-05-01T12:11:01|00:01:00|cpu=8,gres/gpu=1|PREEMPTED
106|gone|teamA|2024-05-01T12:20:00|None|2024-05-01T12:25:00|00:00:00||CANCELLED by 77
"""


def test_slurm_skips_steps_pending_and_unkept_states_and_keeps_array_tasks(tmp_path):
    p = write(tmp_path, "sacct.txt", SACCT)
    df = read_trace(f"slurm:{p}")
    validate_frame(df)
    assert df.attrs["format"] == "slurm"
    assert df["job_id"].tolist() == ["100", "102_1", "102_2"]
    assert df.attrs["skipped"] == {"job_steps": 3, "never_started": 3, "state_preempted": 1, "state_running": 1,
                                   "zero_gpus": 1, "zero_duration": 0}
    d = by_id(df)
    assert d.loc["100", "duration_s"] == 7200.0 and d.loc["100", "num_gpus"] == 4 and d.loc["100", "tenant"] == "teamA"
    assert d.loc["102_1", "submit_time_s"] == 3600.0 and d.loc["102_1", "duration_s"] == 600.0
    assert d.loc["102_2", "num_gpus"] == 2 and d.loc["102_2", "duration_s"] == 1200.0


def test_slurm_states_are_selectable(tmp_path):
    p = write(tmp_path, "sacct.txt", SACCT)
    done = read_trace(f"slurm:{p}", slurm_states="completed")
    assert done["job_id"].tolist() == ["100"]
    assert done.attrs["skipped"]["state_cancelled"] == 1 and done.attrs["skipped"]["state_timeout"] == 1
    running = read_trace(f"slurm:{p}", slurm_states=["COMPLETED", "RUNNING", "PREEMPTED"])
    assert running["job_id"].tolist() == ["100", "105"] and running.attrs["skipped"]["no_end"] == 1
    assert parse_states(None) == DEFAULT_STATES and "CANCELLED" in DEFAULT_STATES
    for bad in ("COMPLETED,FINISHED", "PENDING", " , "):
        with pytest.raises(InputError, match="Slurm state") as info:
            parse_states(bad)
        assert info.value.field == "slurm_states"


def test_slurm_elapsed_when_there_is_no_end_column_and_parsable_trailing_bar(tmp_path):
    text = ("JobID|Submit|Start|Elapsed|AllocGRES|State|\n"
            "7|2024-05-01T10:00:00|2024-05-01T10:00:00|1-02:03:04|gpu:a100:4(IDX:0-3)|COMPLETED|\n"
            "8|2024-05-01T10:01:00|2024-05-01T10:01:00|00:30|gpu:2|FAILED|\n"
            "9|2024-05-01T10:02:00|2024-05-01T10:02:00|00:00:30|gpu:a100:1,gpu:v100:2|NODE_FAIL|\n"
            "10|2024-05-01T10:03:00|2024-05-01T10:03:00|00:10:00|mps:100|OUT_OF_MEMORY|\n")
    p = write(tmp_path, "gres.txt", text)
    d = by_id(read_trace(f"slurm:{p}"))
    assert d["duration_s"].to_dict() == {"7": 93784.0, "8": 30.0, "9": 30.0}
    assert d["num_gpus"].to_dict() == {"7": 4, "8": 2, "9": 3}
    assert (d["tenant"] == "").all()


def test_slurm_gpu_lists():
    assert tres_gpus("billing=8,cpu=8,gres/gpu=4,mem=64G,node=1") == 4
    assert tres_gpus("cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=64G") == 4  # untyped total wins
    assert tres_gpus("cpu=8,gres/gpu:a100=2,gres/gpu:v100=1") == 3
    assert tres_gpus("cpu=8,gres/gpumem=40G,mem=64G") == 0 and np.isnan(tres_gpus("gres/gpu=4G"))
    assert gres_gpus("gpu:4") == 4 and gres_gpus("gpu:a100:4") == 4 and gres_gpus("gpu") == 1
    assert gres_gpus("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)") == 3 and gres_gpus("mps:100") == 0
    assert np.isnan(gres_gpus("gpu:a100:x"))


def test_slurm_req_tres_is_used_where_alloc_tres_is_empty(tmp_path):
    text = ("JobID|Submit|Start|End|AllocTRES|ReqTRES|State\n"
            "1|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T11:00:00||cpu=4,gres/gpu=2|COMPLETED\n"
            "2|2024-05-01T10:00:00|2024-05-01T10:00:00|2024-05-01T11:00:00|cpu=4,gres/gpu=1|cpu=4,gres/gpu=8|COMPLETED\n")
    d = by_id(read_trace(f"slurm:{write(tmp_path, 's.txt', text)}"))
    assert d["num_gpus"].to_dict() == {"1": 2, "2": 1}


def test_slurm_time_zone_is_the_clusters_clock(tmp_path):
    text = (HEADER + "\n1|a|x|2024-10-27T01:00:00|2024-10-27T01:30:00|2024-10-27T03:30:00|02:00:00|gres/gpu=1|COMPLETED\n"
            "2|a|x|2024-10-27T04:00:00|2024-10-27T04:00:00|2024-10-27T05:00:00|01:00:00|gres/gpu=1|COMPLETED\n")
    p = write(tmp_path, "dst.txt", text)
    utc = by_id(read_trace(f"slurm:{p}"))
    berlin = by_id(read_trace(f"slurm:{p}", time_zone="Europe/Berlin"))  # 03:00 CEST -> 02:00 CET: one hour more
    assert utc.loc["1", "duration_s"] == 7200.0 and berlin.loc["1", "duration_s"] == 10800.0
    assert utc.loc["2", "submit_time_s"] == 3 * 3600.0 and berlin.loc["2", "submit_time_s"] == 4 * 3600.0


def slurm_row(jid="1", submit="2024-05-01T10:00:00", start="2024-05-01T10:00:00", end="2024-05-01T11:00:00",
              tres="gres/gpu=1", state="COMPLETED"):
    return f"{jid}|n|acct|{submit}|{start}|{end}|01:00:00|{tres}|{state}"


@pytest.mark.parametrize("bad, field, match", [
    (slurm_row("3", submit="05/01/2024 10:00"), "Submit", "not a Slurm time YYYY-MM-DDTHH:MM:SS"),
    (slurm_row("3", start="2024-05-01T10:00:00", end="2024-05-01T09:59:59"), "End", "End precedes Start"),
    (slurm_row("3", tres="cpu=4,gres/gpu=two"), "AllocTRES", "not a whole number"),
    (slurm_row("3", submit=""), "Submit", "missing value"),
    (slurm_row("2"), "JobID", "duplicate job id '2'"),
])
def test_slurm_bad_rows_name_file_row_field(tmp_path, bad, field, match):
    ok = [slurm_row("1"), slurm_row("2", tres="gres/gpu=2")]
    p = write(tmp_path, "bad.txt", "\n".join([HEADER, *ok, bad]) + "\n")
    raises_at(f"slurm:{p}", row=3, field=field.replace("JobID", "job_id"), file=p, match=match)


def test_slurm_bad_values_in_skipped_rows_are_not_errors(tmp_path):
    rows = [slurm_row("1"), slurm_row("1.batch", submit="garbage", tres="gres/gpu=x"),
            slurm_row("2", start="Unknown", end="Unknown", state="PENDING")]
    df = read_trace(f"slurm:{write(tmp_path, 's.txt', chr(10).join([HEADER, *rows]) + chr(10))}")
    assert df["job_id"].tolist() == ["1"]


def test_slurm_missing_columns_and_empty_result(tmp_path):
    no_gpu = write(tmp_path, "nogpu.txt", "JobID|Submit|Start|End|State\n1|2024-05-01T10:00:00|2024-05-01T10:00:00|"
                                          "2024-05-01T11:00:00|COMPLETED\n")
    raises_at(f"slurm:{no_gpu}", row=None, field="AllocTRES", file=no_gpu, match="one of AllocTRES, AllocGRES")
    no_end = write(tmp_path, "noend.txt", "JobID|Submit|Start|AllocTRES|State\n1|2024-05-01T10:00:00|"
                                          "2024-05-01T10:00:00|gres/gpu=1|COMPLETED\n")
    raises_at(f"slurm:{no_end}", row=None, field="End", file=no_end, match="End or Elapsed")
    comma = write(tmp_path, "comma.txt", "JobID,Submit,Start,End,AllocTRES,State\n1,x,y,z,w,COMPLETED\n")
    raises_at(f"slurm:{comma}", row=None, field="JobID", file=comma, match="missing required column 'JobID'")
    pending = write(tmp_path, "pending.txt", "\n".join([HEADER, slurm_row("1", start="Unknown", state="PENDING"),
                                                        slurm_row("1.0")]) + "\n")
    raises_at(f"slurm:{pending}", row=None, field=None, file=pending, match="no jobs left in 2 rows.*job_steps 1, "
              "never_started 1")


def test_reader_options_are_refused_by_formats_that_do_not_use_them(tmp_path):
    p = write(tmp_path, "sacct.txt", SACCT)
    with pytest.raises(InputError, match="a column mapping applies only to the csv format") as info:
        read_trace(f"slurm:{p}", csv_columns={"submit": "Submit", "duration": "Elapsed", "gpus": "AllocTRES"})
    assert info.value.field == "csv_columns"
    c = write(tmp_path, "c.csv", "t,d,g\n0,1,1\n")
    with pytest.raises(InputError, match="slurm_states applies only to the slurm format") as info:
        read_trace(f"csv:{c}", csv_columns={"submit": "t", "duration": "d", "gpus": "g"}, slurm_states="COMPLETED")
    with pytest.raises(InputError, match="time_zone applies only to the csv and slurm format"):
        read_trace("synthetic:default", time_zone="UTC")


# ------------------------------------------------------------------------------------------- example files
def test_example_sacct_export_reads():
    df = read_trace(f"slurm:{EXAMPLES / 'slurm_sacct.txt'}")
    validate_frame(df)
    assert df["job_id"].tolist() == ["4001", "4002", "4004_1", "4004_2", "4004_3", "4005", "4007"]
    assert df.attrs["skipped"] == {"job_steps": 4, "never_started": 2, "state_running": 1, "zero_gpus": 1,
                                   "zero_duration": 0}
    d = by_id(df)
    assert d.loc["4005", "num_gpus"] == 16 and d.loc["4004_1", "num_gpus"] == 1 and d.loc["4002", "tenant"] == "vision"
    assert d.loc["4001", "duration_s"] == 2 * 3600 + 14 * 60 + 37


def test_example_pod_table_reads():
    cols = parse_column_mapping("submit=creation_time,start=scheduled_time,end=deletion_time,gpus=num_gpu,job_id=name")
    df = read_trace(f"csv:{EXAMPLES / 'pods.csv'}", csv_columns=cols)
    assert df["job_id"].tolist() == ["pod-0000", "pod-0002", "pod-0003", "pod-0005"]
    assert df.attrs["skipped"]["zero_gpus"] == 2 and by_id(df).loc["pod-0005", "duration_s"] == 29100.0


def test_replay_of_a_sacct_export_reports_its_skips(tmp_path, capsys):
    """End to end: the reader's skip counts reach summary.json and the per-policy line on stdout."""
    from tlora_sim.sim.cli.main import main

    out = tmp_path / "run"
    rc = main(["replay", "--policy", "independent", "--trace", f"slurm:{EXAMPLES / 'slurm_sacct.txt'}",
               "--cluster", "4x8xH100", "--out", str(out), "--no-plots", "--no-progress"])
    assert rc in (0, None)
    summary = json.loads((out / "summary.json").read_text())
    for reason, n in {"job_steps": 4, "never_started": 2, "state_running": 1, "zero_gpus": 1}.items():
        assert summary["skipped"][reason] == n
    assert "job_steps 4" in capsys.readouterr().out


def test_cli_takes_time_zone_and_slurm_states(tmp_path):
    """--time-zone and --slurm-states reach the slurm reader from the command line."""
    import json as _json
    import subprocess as _sp
    import sys as _sys
    from pathlib import Path as _P

    example = _P(__file__).resolve().parents[2] / "docs" / "examples" / "slurm_sacct.txt"
    outs = {}
    for states in ("COMPLETED", "COMPLETED,FAILED,TIMEOUT,CANCELLED,OUT_OF_MEMORY,NODE_FAIL"):
        out = tmp_path / states.count(",").__str__()
        r = _sp.run([_sys.executable, "-m", "tlora_sim.sim.cli.main", "replay", "--trace", f"slurm:{example}",
                     "--cluster", "2x8xH100", "--policy", "independent", "--out", str(out), "--no-progress",
                     "--no-plots", "--slurm-states", states, "--time-zone", "Europe/Berlin"],
                    capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[states] = _json.loads((out / "summary.json").read_text())
        assert _json.loads((out / "config.json").read_text())["inputs"]["time_zone"] == "Europe/Berlin"
    assert outs["COMPLETED"]["kept_jobs"] < outs[max(outs, key=len)]["kept_jobs"]
