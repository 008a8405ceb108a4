"""Defect classes "exit 0 with the wrong thing done" and "tracebacks where one line is promised"
for options and for the files a command reads back (issue 45): seeds checked for range and
emptiness before any run, finite in-range numbers, ``POLICY.key`` options checked against the
policies run, and a sweep's own files (cell ``summary.json``, ``sweep.json``, ``sweep.csv``)
schema-checked on read, naming file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.experiments.seeds import MAX_SEED, parse_seeds
from tlora_sim.traces.errors import InputError

TINY = ["--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--no-progress"]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- options, checked before any run -----------------------------------------------------------------
BAD = [
    (["compare", "--policies", "independent", "--seeds="], "--seeds"),
    (["compare", "--policies", "independent", "--seeds", " "], "--seeds"),
    (["compare", "--policies", "independent", "--seeds", str(2**63)], "--seeds"),
    (["compare", "--policies", "independent", "--seeds", f"0-{2**64}"], "--seeds"),
    (["compare", "--policies", "independent", "--workers", "0"], "--workers"),
    (["compare", "--policies", "independent,mlora,independent"], "--policies"),
    (["replay", "--policy", "independent", "--seed", str(2**63)], "--seed"),
    (["replay", "--policy", "independent", "--seed", "-1"], "--seed"),
    (["replay", "--policy", "independent", "--regroup-pause", "inf"], "--regroup-pause"),
    (["replay", "--policy", "independent", "--regroup-pause", "nan"], "--regroup-pause"),
    (["replay", "--policy", "independent", "--regroup-pause", "-1"], "--regroup-pause"),
    (["replay", "--policy", "independent", "--option", "tlora.max_group_size=2"], "--option"),
    (["compare", "--policies", "independent,mlora", "--option", "nosuchpolicy.concurrency_num=2"], "--option"),
    (["replay", "--policy", "mlora", "--option", "mlora.nosuch=2"], "nosuch"),
    (["replay", "--policy", "tlora", "--option", "tlora.tick_s=inf"], "tick_s"),
]


@pytest.mark.parametrize("argv,field", BAD, ids=[" ".join(a[2:]) for a, _ in BAD])
def test_bad_options_are_one_line_before_any_run(tmp_path, capsys, argv, field, reliability):
    out = tmp_path / "out"
    rc = main([*argv, *TINY, "--out", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and field in line, line
    assert not out.exists() and not [p for p in tmp_path.iterdir()]  # nothing written, no lock left
    reliability("bad_inputs")


@given(st.lists(st.integers(0, 2**66), min_size=1, max_size=4))
def test_parse_seeds_accepts_exactly_the_int64_range(seeds):
    spec = ",".join(map(str, seeds))
    if max(seeds) > MAX_SEED:
        with pytest.raises(InputError, match="2\\^63-1"):
            parse_seeds(spec)
    else:
        assert parse_seeds(spec) == sorted(set(seeds))


@given(st.text(alphabet=" ,-0123456789x", max_size=8))
def test_parse_seeds_never_crashes(spec):
    try:
        seeds = parse_seeds(spec)
    except InputError as e:
        assert "\n" not in str(e) and e.field == "--seeds"
    else:
        assert seeds and all(0 <= s <= MAX_SEED for s in seeds)


def test_the_largest_seed_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--policies", "independent", "--seeds", str(MAX_SEED), *TINY, "--out", str(out)]) == 0
    assert (out / "summary.csv").is_file() and (out / f"seed-{MAX_SEED}").is_dir()


# ---- a sweep's own files, read back --------------------------------------------------------------------
SWEEP = 'traces = ["synthetic:jobs=20,seed=1"]\nclusters = ["1x8xH100"]\npolicies = ["independent", "mlora"]\n'


@pytest.fixture()
def finished_sweep(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(SWEEP)
    out = tmp_path / "sw"
    assert main(["sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    return f, out


def _cut(p: Path, n: int) -> None:
    p.write_bytes(p.read_bytes()[:n])


@pytest.mark.parametrize("damage", ["cut summary", "summary not an object", "skipped not counts",
                                    "cut sweep.json"])
def test_a_damaged_sweep_file_on_resume_is_one_line(finished_sweep, capsys, damage, reliability):
    f, out = finished_sweep
    summary = sorted(out.glob("cells/*/summary.json"))[0]
    if damage == "cut summary":
        _cut(summary, 40)
    elif damage == "summary not an object":
        summary.write_text("[1, 2]\n")
    elif damage == "skipped not counts":
        obj = json.loads(summary.read_text())
        obj["skipped"] = {"memory": "many"}
        summary.write_text(json.dumps(obj))
    else:
        _cut(out / "sweep.json", 30)
    table = (out / "sweep.csv").read_bytes()
    capsys.readouterr()
    rc = main(["sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"])
    line = _one_line(capsys.readouterr().err)
    target = out / "sweep.json" if damage == "cut sweep.json" else summary
    assert rc == 2 and str(target) in line, line
    if damage == "skipped not counts":
        assert "field 'skipped'" in line
    assert (out / "sweep.csv").read_bytes() == table  # nothing rewritten from a bad read
    reliability("bad_inputs")


@pytest.mark.parametrize("content,where", [("", "empty file"), (None, "header only"),
                                           ("bad seed", "row 1, field 'seed'"), ("bad jct", "field 'avg_jct_s'")])
def test_sweep_report_checks_sweep_csv(finished_sweep, capsys, content, where, reliability):
    _, out = finished_sweep
    import pandas as pd

    path = out / "sweep.csv"
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    if content is None:
        table.iloc[:0].to_csv(path, index=False)
    elif content == "bad seed":
        table.loc[0, "seed"] = "abc"
        table.to_csv(path, index=False)
    elif content == "bad jct":
        table.loc[0, "avg_jct_s"] = "fast"
        table.to_csv(path, index=False)
    else:
        path.write_text(content)
    capsys.readouterr()
    rc = main(["sweep", "report", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(path) in line and (where in line or (content is None and "no finished cells" in line)), line
    assert not (out / "report.csv").exists()
    reliability("bad_inputs")


@pytest.mark.parametrize("tz", ["America", "Nowhere/City", "../etc", ""])
def test_a_time_zone_that_is_not_a_zone_is_one_line(tmp_path, capsys, tz, reliability):
    trace = tmp_path / "t.csv"
    trace.write_text("submit,gpus,duration\n2020-01-01T00:00:00,1,100\n2020-01-01T00:10:00,2,50\n")
    out = tmp_path / "out"
    rc = main(["replay", "--policy", "independent", "--trace", f"csv:{trace}", "--columns",
               "submit=submit,gpus=gpus,duration=duration", "--cluster", "1x8xH100", "--no-progress",
               "--no-plots", "--out", str(out), "--time-zone", tz])
    err = capsys.readouterr().err
    if tz == "":  # empty: the default zone (UTC)
        assert rc == 0, err
        return
    line = _one_line(err)
    assert rc == 2 and "time zone" in line and not out.exists()
    reliability("bad_inputs")


# ---- generated damage to a sweep's files --------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep_template(tmp_path_factory):
    base = tmp_path_factory.mktemp("sweep-template")
    f = base / "s.toml"
    f.write_text(SWEEP)
    out = base / "sw"
    assert main(["-q", "sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    return f, out


@given(data=st.data())
def test_any_cut_of_a_cell_summary_or_sweep_csv_is_one_line_or_reads(sweep_template, tmp_path_factory, data):
    import contextlib
    import io
    import shutil

    f, template = sweep_template
    out = tmp_path_factory.mktemp("cut") / "sw"
    shutil.copytree(template, out)
    which = data.draw(st.sampled_from(["summary", "sweep.csv"]))
    path = sorted(out.glob("cells/*/summary.json"))[0] if which == "summary" else out / "sweep.csv"
    raw = path.read_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    path.write_bytes(raw[:cut] + data.draw(st.sampled_from([b"", b"\x00", b"\xff\xfe", b"}", b",,,\n"])))
    argv = (["-q", "sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"] if which == "summary"
            else ["-q", "sweep", "report", str(out)])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc != 0:
        assert rc == 2
        line = _one_line(err.getvalue())
        assert str(path) in line


@pytest.mark.parametrize("command", ["replay", "compare"])
def test_an_input_inside_out_is_refused_not_deleted_by_force(tmp_path, capsys, command, reliability):
    out = tmp_path / "out"
    out.mkdir()
    trace = out / "t.csv"
    trace.write_text("submit,gpus,duration\n0,1,100\n10,2,50\n")
    what = ["--policy", "independent"] if command == "replay" else ["--policies", "independent,mlora"]
    rc = main([command, *what, "--trace", f"csv:{trace}", "--columns", "submit=submit,gpus=gpus,duration=duration",
               "--cluster", "1x8xH100", "--no-progress", "--out", str(out), "--force"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(trace) in line and "--trace" in line
    assert trace.is_file() and sorted(p.name for p in out.iterdir()) == ["t.csv"]
    reliability("bad_inputs")
