"""Trace readers, LoRA assignment, synthetic generator and describe: behaviour on real and crafted inputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.traces.errors import InputError
from tlora_sim.traces import (COLUMNS, DISTRIBUTIONS, LoraDistribution, assign_lora, describe_trace, format_description,
                    generate_synthetic, known_formats, load_distribution, parse_column_mapping, read_trace,
                    validate_frame)
from tlora_sim.traces.synthetic import expected_gpu_seconds, itp_params, parse_options

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"
ITP = SHARED / "msr-itp-elasticflow"
ACME = SHARED / "acme-kalos-subset"
needs_itp = pytest.mark.skipif(not (ITP / "cluster02.csv.gz").is_file(),
                               reason=f"ITP traces not found at {ITP} (../shared/traces is not checked out)")
needs_acme = pytest.mark.skipif(not (ACME / "kalos_subset_decoded.csv").is_file(),
                                reason=f"Acme/Kalos extract not found at {ACME} (../shared/traces is not checked out)")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def raises_at(spec: str, *, row: int | None, field: str | None, file: Path | None = None, match: str | None = None,
              **kw) -> InputError:
    """Read spec, expect an InputError with these attributes; return it."""
    with pytest.raises(InputError, match=match) as info:
        read_trace(spec, **kw)
    err = info.value
    assert err.row == row and err.field == field, str(err)
    if file is not None:
        assert err.file == str(file), str(err)
        assert str(file) in str(err)
    return err


ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"
MAPPING = {"submit": "t", "duration": "d", "gpus": "g"}


# ---------------------------------------------------------------- real traces

@needs_itp
def test_itp_cluster02_matches_source_md():
    df = read_trace(f"itp:{ITP / 'cluster02.csv.gz'}")
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 5778
    assert (df["num_gpus"] * df["duration_s"]).sum() / 3600 == pytest.approx(123_748, abs=1)
    assert df["duration_s"].median() == pytest.approx(6182, abs=1)  # SOURCE.md rounds 6,181.5
    assert df["submit_time_s"].iloc[0] == 0.0 and df["submit_time_s"].is_monotonic_increasing
    assert (df["tenant"] == "").all() and df["job_id"].is_unique
    assert df.attrs["format"] == "itp" and df.attrs["skipped"] == {"zero_duration": 0}
    validate_frame(df)


@needs_itp
def test_itp_cluster04_loads_and_directory_merges_all_clusters():
    df = read_trace(f"itp:{ITP / 'cluster04.csv.gz'}")
    assert len(df) == 15_802
    merged = read_trace(f"itp:{ITP}")
    assert len(merged) == 69_351
    assert (merged["num_gpus"] * merged["duration_s"]).sum() / 3600 == pytest.approx(1_632_720, abs=1)
    assert merged["tenant"].value_counts()["cluster04"] == 15_802
    assert merged["tenant"].nunique() == 10


@needs_itp
def test_relative_path_spec(monkeypatch):
    monkeypatch.chdir(ITP)
    df = read_trace("itp:cluster10.csv.gz")
    assert len(df) == 260 and df.attrs["source"] == "itp:cluster10.csv.gz"


@needs_acme
def test_acme_both_file_forms_give_identical_frames():
    by_dir = read_trace(f"acme:{ACME}")
    decoded = read_trace(f"acme:{ACME / 'kalos_subset_decoded.csv'}")
    converted = read_trace(f"acme:{ACME / 'converted_kalos_trace.csv'}")
    assert len(decoded) == 319
    pd.testing.assert_frame_equal(decoded, converted)
    pd.testing.assert_frame_equal(by_dir, decoded)
    assert decoded["tenant"].value_counts().to_dict() == {"Pretrain": 183, "Other_or_SFT": 136}
    assert decoded["duration_s"].max() == 625_740
    assert (decoded["num_gpus"] * decoded["duration_s"]).sum() / 3600 == pytest.approx(456_843, abs=1)


# ---------------------------------------------------------------- philly

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-11-05 02:30:00,100.0,2,200.0,vcB
2017-11-05 00:30:00,50.5,1,50.5,vcA
2017-03-12 03:30:00,10.0,8,80.0,vcA
2017-11-05 01:30:00,60.0,4,240.0,vcB
2017-03-12 01:30:00,20.0,1,20.0,vcC
2017-11-05 00:30:00,50.5,1,50.5,vcA
2017-03-12 02:30:00,30.0,1,30.0,vcC
2017-11-05 01:30:00,0.0,1,0.0,vcB
2017-11-05 00:30:00,50.5,1,50.5,vcA
"""


def test_philly_dst_duplicates_unsorted(tmp_path):
    p = write(tmp_path, "philly.csv", PHILLY)
    df = read_trace(f"philly:{p}")
    validate_frame(df)
    assert df.attrs["skipped"] == {"duplicate": 2, "zero_duration": 1}
    # ids are the original data rows; sorted by absolute time
    assert df["job_id"].tolist() == ["5", "7", "3", "2", "4", "1"]
    t = dict(zip(df["job_id"], df["submit_time_s"]))
    # spring forward: 01:30 PST -> 03:30 PDT is one real hour; 02:30 does not exist -> 03:00 PDT
    assert t["5"] == 0.0 and t["7"] == 1800.0 and t["3"] == 3600.0
    # fall back: 00:30 PDT -> 01:30 (first occurrence, PDT) = 1 h -> 02:30 PST = 2 h more
    assert t["4"] - t["2"] == 3600.0 and t["1"] - t["4"] == 7200.0
    assert df.set_index("job_id").loc["1", "tenant"] == "vcB"
    assert df["num_gpus"].dtype == np.int64 and df.set_index("job_id").loc["2", "duration_s"] == 50.5


def test_philly_bad_timestamp_names_original_row(tmp_path):
    p = write(tmp_path, "philly.csv", PHILLY.replace("2017-03-12 02:30:00", "12/03/2017 02:30"))
    err = raises_at(f"philly:{p}", row=7, field="timestamp", file=p)
    assert "12/03/2017 02:30" in str(err)


def test_philly_missing_column_suggests(tmp_path):
    p = write(tmp_path, "philly.csv", PHILLY.replace("num_gpus", "num_gpu"))
    err = raises_at(f"philly:{p}", row=None, field="num_gpus", file=p, match="did you mean 'num_gpu'")
    assert "timestamp, duration, num_gpu, gpu_time, cluster" in str(err)


# ---------------------------------------------------------------- generic csv

def test_csv_mapping_and_units(tmp_path):
    p = write(tmp_path, "my.csv", "id,t,d,g,vc\na,2,1.5,1,x\nb,1,0.5,4,y\nc,3,2,2,\n")
    cols = {"submit": "t", "duration": "d", "gpus": "g", "job_id": "id", "tenant": "vc"}
    h = read_trace(f"csv:{p}", csv_columns=cols, time_unit="h")
    assert h["job_id"].tolist() == ["b", "a", "c"]
    assert h["submit_time_s"].tolist() == [0.0, 3600.0, 7200.0]
    assert h["duration_s"].tolist() == [1800.0, 5400.0, 7200.0]
    assert h["tenant"].tolist() == ["y", "x", ""] and h["num_gpus"].tolist() == [4, 1, 2]
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("min", 60.0)):
        df = read_trace(f"csv:{p}", csv_columns=cols, time_unit=unit)
        assert df["duration_s"].tolist() == pytest.approx([0.5 * scale, 1.5 * scale, 2 * scale])
    bare = read_trace(f"csv:{p}", csv_columns={"submit": "t", "duration": "d", "gpus": "g"})
    assert bare["job_id"].tolist() == ["2", "1", "3"] and (bare["tenant"] == "").all()
    with pytest.raises(InputError, match="time unit"):
        read_trace(f"csv:{p}", csv_columns=cols, time_unit="days")


def test_csv_requires_mapping(tmp_path):
    p = write(tmp_path, "my.csv", "t,d,g\n1,1,1\n")
    with pytest.raises(InputError, match="submit, duration, gpus"):
        read_trace(f"csv:{p}")
    with pytest.raises(InputError, match="lacks gpus"):
        read_trace(f"csv:{p}", csv_columns={"submit": "t", "duration": "d"})


def test_parse_column_mapping():
    assert parse_column_mapping("submit=ts, duration=dur,gpus=n,tenant=vc") == {
        "submit": "ts", "duration": "dur", "gpus": "n", "tenant": "vc"}
    for bad in ("submit=ts,duration=dur", "submit=ts,duration=dur,gpus", "submit=ts,duration=dur,gpus=n,foo=x",
                "submit=ts,submit=x,duration=d,gpus=n", "submit=,duration=d,gpus=n", "", "=x"):
        with pytest.raises(InputError) as info:
            parse_column_mapping(bad)
        assert info.value.field == "--columns"


# ---------------------------------------------------------------- bad input rules

@pytest.mark.parametrize("body, row, field, match", [
    ("x,1,10,1\ny,abc,10,1\n", 2, "submission_time", "not a number: 'abc'"),
    ("x,1,10,1\ny,2,10,one\n", 2, "num_gpu", "not a number: 'one'"),
    ("x,1,10,1\ny,-5,10,1\n", 2, "submission_time", ">= 0"),
    ("x,1,10,1\ny,5,-10,1\n", 2, "duration", ">= 0"),
    ("x,1,10,1\ny,5,10,-2\n", 2, "num_gpu", ">= 0"),
    ("x,1,10,1\ny,5,10,0\nz,6,10,1\n", 2, "num_gpu", "> 0"),
    ("x,1,10,1\ny,5,10,1.5\n", 2, "num_gpu", "whole number"),
    ("x,1,10,1\ny,5,,1\n", 2, "duration", "missing value"),
    ("x,1,10,1\ny,5,NaN,1\n", 2, "duration", "missing value"),
    ("x,1,10,1\ny,5,inf,1\n", 2, "duration", "finite"),
    ("x,1,10,1\ny,5,10,1\nx,7,10,1\n", 3, "job_id", "first seen at row 1"),
    ("x,1,10,1\n\ny,5,10,1\n\n", 2, "job_id", "empty row"),
    ("x,1,10,1\ny,oops,10,1\nz,-1,-1,0\n", 2, "submission_time", "oops"),
    ("x,1,10,1\nz,-1,bad,1\ny,oops,10,1\n", 2, "submission_time", ">= 0"),
])
def test_itp_bad_values_name_file_row_field(tmp_path, body, row, field, match):
    p = write(tmp_path, "cluster99.csv", ITP_HEADER + body)
    raises_at(f"itp:{p}", row=row, field=field, file=p, match=match)


def test_bad_values_in_gzip_and_csv_formats(tmp_path):
    p = tmp_path / "cluster98.csv.gz"
    p.write_bytes(gzip.compress((ITP_HEADER + "x,1,10,1\ny,2,ten,1\n").encode()))
    raises_at(f"itp:{p}", row=2, field="duration", file=p, match="'ten'")
    c = write(tmp_path, "c.csv", "id,t,d,gpus\na,1,1,1\nb,2,1,1\na,3,1,1\n")
    raises_at(f"csv:{c}", row=3, field="job_id", file=c, match="duplicate job id 'a'",
              csv_columns={"submit": "t", "duration": "d", "gpus": "gpus", "job_id": "id"})
    raises_at(f"csv:{c}", row=None, field="gpu", file=c, match="did you mean 'gpus'",
              csv_columns={"submit": "t", "duration": "d", "gpus": "gpu"})


def test_zero_duration_is_skipped_and_counted(tmp_path):
    p = write(tmp_path, "cluster97.csv", ITP_HEADER + "x,1,0,1\ny,5,10,2\nz,9,0,1\nw,8,3,1\n")
    df = read_trace(f"itp:{p}")
    assert df["job_id"].tolist() == ["y", "w"] and df["submit_time_s"].tolist() == [0.0, 3.0]
    assert df.attrs["skipped"] == {"zero_duration": 2}
    only_zero = write(tmp_path, "cluster96.csv", ITP_HEADER + "x,1,0,1\n")
    raises_at(f"itp:{only_zero}", row=None, field=None, file=only_zero, match="zero duration")


@pytest.mark.parametrize("content, match", [
    (b"", "empty"),
    (ITP_HEADER.encode(), "no data rows"),
    (ITP_HEADER.encode() + b"\n\n", "no data rows"),
    (ITP_HEADER.encode() + "x,1,10,1\ny\xe9,2,3,1\n".encode("latin-1"), "not UTF-8"),
    (ITP_HEADER.encode() + b"x,1,10,1\ny,2,3,1,7,8\n", "malformed CSV"),
])
def test_unreadable_files(tmp_path, content, match):
    p = tmp_path / "cluster95.csv"
    p.write_bytes(content)
    raises_at(f"itp:{p}", row=None, field=None, file=p, match=match)


def test_truncated_and_fake_gzip(tmp_path):
    data = gzip.compress((ITP_HEADER + "".join(f"j{i},{i},{i + 1},1\n" for i in range(5000))).encode())
    cut = tmp_path / "cluster94.csv.gz"
    cut.write_bytes(data[: len(data) // 2])
    raises_at(f"itp:{cut}", row=None, field=None, file=cut, match="truncated or corrupt")
    fake = tmp_path / "cluster93.csv.gz"
    fake.write_bytes(b"this is not gzip at all\n" * 10)
    raises_at(f"itp:{fake}", row=None, field=None, file=fake, match="truncated or corrupt")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    bad = tmp_path / "cluster92.csv.gz"
    bad.write_bytes(bytes(flipped))
    raises_at(f"itp:{bad}", row=None, field=None, file=bad)


def test_missing_column_names_it_and_suggests(tmp_path):
    p = write(tmp_path, "cluster91.csv", "job_id,submit_time,duration,num_gpu\nx,1,1,1\n")
    err = raises_at(f"itp:{p}", row=None, field="submission_time", file=p, match="did you mean 'submit_time'")
    assert "columns found: job_id, submit_time, duration, num_gpu" in str(err)


def test_spec_errors(tmp_path):
    with pytest.raises(InputError, match="unknown trace format 'alibaba'") as info:
        read_trace("alibaba:x.csv")
    for fmt in known_formats():
        assert fmt in str(info.value)
    assert set(known_formats()) >= {"itp", "philly", "acme", "csv", "synthetic"}
    with pytest.raises(InputError, match="FORMAT:PATH"):
        read_trace("cluster02.csv.gz")
    missing = tmp_path / "nope.csv"
    raises_at(f"itp:{missing}", row=None, field=None, file=missing, match="not found")
    raises_at(f"philly:{missing}", row=None, field=None, file=missing, match="not found")
    raises_at(f"acme:{missing}", row=None, field=None, file=missing, match="not found")
    with pytest.raises(InputError, match="only to the csv format"):
        read_trace(f"itp:{missing}", csv_columns=MAPPING)
    with pytest.raises(InputError, match="no path"):
        read_trace("itp:")


def test_acme_converted_form_checks(tmp_path):
    head = ("job_id,arrival_time,num_iteration,iteration_computing_time,iteration_networking_time,gpu_workers,"
            "ps,gpu_per_worker,cpu_per_gpu_worker,cpu_per_ps_worker,tensorsizes,profiled_network\n")
    ok = "0,0.0,208,0.5,0.25,8,0,8.0,15.0,15.0,10.0,500\n"
    p = write(tmp_path, "conv.csv", head + ok + "1,3.0,10,0.5,0.5,1,0,1.0,1,1,1,500\n")
    raises_at(f"acme:{p}", row=2, field="iteration_networking_time", file=p, match="0.75")
    p = write(tmp_path, "conv2.csv", head + ok + "1,3.0,0,0.5,0.75,2,0,4.0,1,1,1,1000\n")
    df = read_trace(f"acme:{p}")
    assert len(df) == 1 and df.attrs["skipped"] == {"zero_duration": 1} and df["duration_s"].iloc[0] == 104.0
    assert df["num_gpus"].iloc[0] == 64 and df["tenant"].iloc[0] == "Other_or_SFT"


def test_validate_frame_catches_broken_tables():
    df = generate_synthetic(20, np.random.default_rng(0))
    validate_frame(df)
    shuffled = df.iloc[::-1].reset_index(drop=True)
    shuffled.attrs = df.attrs
    with pytest.raises(InputError, match="sorted") as info:
        validate_frame(shuffled, "t.csv")
    assert info.value.file == "t.csv" and info.value.field == "submit_time_s"
    broken = df.copy()
    broken.loc[3, "num_gpus"] = 0
    with pytest.raises(InputError) as info:
        validate_frame(broken)
    assert (info.value.row, info.value.field) == (4, "num_gpus")
    with pytest.raises(InputError, match="columns"):
        validate_frame(df.drop(columns="tenant"))


# ---------------------------------------------------------------- LoRA assignment

def test_assign_lora_deterministic_and_keeps_trace():
    trace = generate_synthetic(2000, np.random.default_rng(1))
    dist = load_distribution("tlora")
    a = assign_lora(trace, dist, np.random.default_rng(42))
    b = assign_lora(trace, dist, np.random.default_rng(42))
    c = assign_lora(trace, dist, np.random.default_rng(43))
    pd.testing.assert_frame_equal(a, b)
    cols = ["model", "rank", "micro_batch_per_gpu", "seq_len"]
    assert not a[cols].equals(c[cols])
    for df in (a, c):
        pd.testing.assert_frame_equal(df[list(COLUMNS)], trace)
    assert "model" not in trace.columns
    assert a["rank"].dtype == np.int64 and a["seq_len"].dtype == np.int64 and a["micro_batch_per_gpu"].dtype == np.int64
    assert (a["grad_accum"] == 1).all()  # no public trace records accumulation: the default keeps 1
    assert a["max_slowdown"].dtype == np.float64 and pd.api.types.is_string_dtype(a["model"])
    assert set(a["model"]) == {"llama3-8b", "qwen3-8b"} and set(a["rank"]) == {2, 4, 8, 16}
    assert set(a["micro_batch_per_gpu"]) == {1, 2, 4, 8} and set(a["seq_len"]) == {512, 1024, 2048}
    assert a["max_slowdown"].value_counts(normalize=True)[1.5] == pytest.approx(0.5, abs=0.05)
    assert a.attrs["lora_distribution"]["name"] == "tlora" and a.attrs["source"] == trace.attrs["source"]


def test_distributions_registry_json_and_validation(tmp_path):
    mixed = load_distribution("mixed-ranks")
    assert set(mixed.ranks) == {4, 8, 16, 32, 64, 128}
    assert set(DISTRIBUTIONS) >= {"tlora", "mixed-ranks"}
    d = LoraDistribution()
    assert LoraDistribution.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    custom = {"name": "big", "ranks": {"64": 0.5, "128": 0.5}, "models": {"llama3-70b": 1.0}}
    p = write(tmp_path, "big.json", json.dumps(custom))
    big = load_distribution(str(p))
    assert big.ranks == {64: 0.5, 128: 0.5} and big.micro_batch_per_gpu == d.micro_batch_per_gpu
    # earlier versions' name for the per-GPU micro-batch table is still read
    old = load_distribution(str(write(tmp_path, "old.json", json.dumps({"batch_sizes": {"2": 1.0}}))))
    assert old.micro_batch_per_gpu == {2: 1.0}
    with pytest.raises(InputError, match="known: llm-cluster, mixed-ranks, tlora"):
        load_distribution("nope")
    for bad in ({"ranks": {"8": 0.5, "16": 0.4}}, {"ranks": {"8": 1.0, "16": 0.0}}, {"ranks": {"0": 1.0}},
                {"max_slowdown": {"0.5": 1.0}}, {"rank": {"8": 1.0}}, {"ranks": {"x": 1.0}}):
        q = write(tmp_path, "bad.json", json.dumps(bad))
        with pytest.raises(InputError) as info:
            load_distribution(str(q))
        assert info.value.file == str(q) and info.value.field is not None
    assert LoraDistribution(ranks={8: 0.3333333, 16: 0.6666667}).ranks[8] == 0.3333333  # 1e-6 tolerance


# ---------------------------------------------------------------- synthetic generator

def test_synthetic_matches_fitted_statistics():
    params = itp_params()
    df = generate_synthetic(20_000, np.random.default_rng(3))
    validate_frame(df)
    freq = df["num_gpus"].value_counts(normalize=True)
    for g, p in params["gpus"]["probabilities"].items():
        assert freq.get(int(g), 0.0) == pytest.approx(p, abs=0.01)
    assert df["duration_s"].median() == pytest.approx(params["duration"]["overall"]["p50"], rel=0.10)
    assert df["duration_s"].min() >= params["duration"]["min_s"]
    assert df["duration_s"].max() <= params["duration"]["max_s"]
    rate = len(df) / df["submit_time_s"].max() * 3600
    assert rate == pytest.approx(params["arrival"]["rate_per_h"], rel=0.10)
    gaps = np.diff(df["submit_time_s"].to_numpy())
    assert gaps.std() / gaps.mean() > 2.0  # bursty, like ITP (CV ~3.7), not Poisson (CV 1)
    gpu_s = (df["num_gpus"] * df["duration_s"]).mean()
    assert gpu_s == pytest.approx(expected_gpu_seconds(params), rel=0.15)
    double = generate_synthetic(20_000, np.random.default_rng(3), load_scale=2.0)
    assert double["submit_time_s"].max() == pytest.approx(df["submit_time_s"].max() / 2, rel=0.05)


def test_synthetic_spec_default_and_options():
    a = read_trace("synthetic:default")
    b = read_trace("synthetic:")
    pd.testing.assert_frame_equal(a, b)
    validate_frame(a)
    assert len(a) == 600 and a["num_gpus"].max() <= 16
    assert a["duration_s"].max() <= 4 * 3600
    end_days = (a["submit_time_s"] + a["duration_s"]).max() / 86400
    assert 1.0 <= end_days <= 3.0
    demand = (a["num_gpus"] * a["duration_s"]).sum() / (32 * a["submit_time_s"].max())
    assert 0.5 <= demand <= 0.9
    o = a.attrs["synthetic"]
    assert o["rate_per_h"] == pytest.approx(0.7 * 32 * 3600 / o["expected_gpu_seconds_per_job"])
    c = read_trace("synthetic:jobs=50,seed=1,load=0.5,max_gpus=8,diurnal=0")
    assert len(c) == 50 and c["num_gpus"].max() <= 8 and c.attrs["synthetic"]["options"]["seed"] == 1
    assert not c["duration_s"].equals(read_trace("synthetic:jobs=50,seed=2,load=0.5,max_gpus=8")["duration_s"])
    assert parse_options("jobs=7")["load"] == 0.7
    for bad, field in (("jobs=0", "jobs"), ("jobs=x", "jobs"), ("speed=3", "speed"), ("load", "load"),
                       ("max_gpus=0", "max_gpus"), ("diurnal=2", "diurnal")):
        with pytest.raises(InputError) as info:
            read_trace(f"synthetic:{bad}")
        assert info.value.field == field


def test_fit_json_records_sources():
    params = itp_params()
    files = params["sources"]["files"]
    assert len(files) == 10 and sum(f["jobs"] for f in files) == params["jobs"] == 69_351
    assert all(len(f["sha256"]) == 64 for f in files)
    # the uncompressed hashes match the prefixes listed in SOURCE.md
    assert files[1]["file"] == "cluster02.csv.gz" and files[1]["sha256_uncompressed"].startswith("7a5849e73aff9f9b")
    assert params["created"] and abs(sum(params["gpus"]["probabilities"].values()) - 1) < 1e-9


@needs_itp
def test_fit_script_reproduces_shipped_numbers(tmp_path):
    out = tmp_path / "fit.json"
    subprocess.run([sys.executable, "-m", "tlora_sim.traces.fit_synthetic", "--itp-dir", str(ITP), "--out", str(out)],
                   check=True, capture_output=True, cwd=Path(__file__).resolve().parents[2])
    new, shipped = json.loads(out.read_text()), itp_params()
    assert new["arrival"]["interarrival_cv"] == pytest.approx(shipped["arrival"]["interarrival_cv"])
    assert new["duration"]["by_gpus"] == shipped["duration"]["by_gpus"]
    assert [f["sha256"] for f in new["sources"]["files"]] == [f["sha256"] for f in shipped["sources"]["files"]]


# ---------------------------------------------------------------- describe

def test_describe_trace_and_format(tmp_path):
    p = write(tmp_path, "philly.csv", PHILLY)
    df = read_trace(f"philly:{p}")
    d = describe_trace(df)
    assert d["jobs"] == 6 and d["skipped"] == {"duplicate": 2, "zero_duration": 1}
    assert d["gpus"]["counts"] == {1: 3, 2: 1, 4: 1, 8: 1} and d["gpus"]["max"] == 8
    assert d["gpu_hours"] == pytest.approx((20 + 30 + 80 + 50.5 + 240 + 200) / 3600)
    assert d["span_s"] == df["submit_time_s"].max() and d["span_days"] == pytest.approx(d["span_s"] / 86400)
    assert d["arrival_rate_per_h"] == pytest.approx(6 / d["span_s"] * 3600)
    assert d["duration_s"]["p50"] == pytest.approx(np.percentile(df["duration_s"], 50))
    assert d["tenants"] == {"vcA": 2, "vcB": 2, "vcC": 2}
    json.dumps(d)
    text = format_description(d)
    for needle in ("jobs       6", "GPU-hours", "p99", "duplicate 2", "zero_duration 1", "vcA"):
        assert needle in text
    lora = describe_trace(assign_lora(df, load_distribution("mixed-ranks"), np.random.default_rng(0)))
    assert lora["lora_distribution"] == "mixed-ranks" and sum(lora["lora"]["rank"].values()) == 6
    assert "LoRA attributes (distribution mixed-ranks)" in format_description(lora)


def test_traces_import_without_torch():
    code = "import sys, traces, traces.fit_synthetic; assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_min_gpus_keeps_a_model_off_jobs_too_small_for_it():
    """llm-cluster: Llama-3-70B only on jobs of >= 4 GPUs; smaller jobs draw the other models,
    renormalised; same seed, same draws; the other attributes are the unconditioned draws."""
    trace = generate_synthetic(3000, np.random.default_rng(5))
    dist = load_distribution("llm-cluster")
    assert dist.min_gpus == {"llama3-70b": 4}
    a = assign_lora(trace, dist, np.random.default_rng(9))
    pd.testing.assert_frame_equal(a, assign_lora(trace, dist, np.random.default_rng(9)))
    small, big = a[a.num_gpus < 4], a[a.num_gpus >= 4]
    assert len(small) > 100 and "llama3-70b" not in set(small.model)
    assert set(small.model) == {"llama3-8b", "qwen3-8b", "qwen2.5-32b"}
    if len(big) > 50:
        assert "llama3-70b" in set(big.model)
    with pytest.raises(InputError, match="min_gpus"):
        LoraDistribution(min_gpus={"gpt-5": 2})
    with pytest.raises(InputError, match="min_gpus"):
        LoraDistribution(min_gpus={"llama3-8b": 0})
