"""Random input to every user-facing entry point (issue 22): synthetic specs, cluster specs,
policy options, sweep files and CSV traces built from hostile values. Whatever arrives, the
command exits 0 or 2 with no traceback, a rejected run leaves no run directory behind, and an
accepted one leaves a complete one."""

from __future__ import annotations

import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from tlora_sim.sim.cli.main import main

NUMBERS = st.sampled_from(["0", "-1", "1", "2", "0.5", "1e309", "-1e309", "nan", "inf", "-inf", "1e-320", "3",
                           "abc", "", "1e12", "7.5", "０"])
SYN_KEYS = st.sampled_from(["jobs", "seed", "load", "gpus", "max_gpus", "dur_scale", "max_dur_h", "diurnal", "bogus"])


@st.composite
def synthetic_spec(draw):
    items = draw(st.lists(st.tuples(SYN_KEYS, NUMBERS), max_size=4))
    small = [("jobs", draw(st.sampled_from(["5", "12"])))]  # keep accepted runs short
    return "synthetic:" + ",".join(f"{k}={v}" for k, v in small + items)


CLUSTERS = st.sampled_from(["1x8xH100", "2x4xH200", "0x8xH100", "1x0xH100", "1x8xB999", "x", "1x8", "-1x8xH100",
                            "1x8xh100", "99999999x8xH100"])
OPTIONS = st.lists(st.tuples(st.sampled_from(["independent", "tlora", "mlora", "nope"]),
                             st.sampled_from(["ordering", "tick_s", "max_group_size", "min_gain", "grouping",
                                              "x"]),
                             st.one_of(NUMBERS, st.sampled_from(["fifo", "backfill", "lifo", "true", "maybe"]))),
                   max_size=2)


def _run(tmp_path, capsys, argv, out):
    if out.exists():
        shutil.rmtree(out)
    capsys.readouterr()  # forget earlier examples' output
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: usage lines, then one "error:" line
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (0, 2), (argv, rc, err)
    assert "Traceback" not in err
    if rc == 2:
        last = err.strip().splitlines()[-1]
        assert last.startswith("tlora-sim") and "error:" in last, err
        assert not out.exists(), "a rejected run left a directory behind"
    else:
        assert {"config.json", "jobs.csv", "timeline.csv", "summary.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.parent.iterdir() if ".stage-" in p.name]
    return rc


@settings(max_examples=25)
@given(spec=synthetic_spec(), cluster=CLUSTERS, options=OPTIONS, policy=st.sampled_from(["independent", "tlora"]))
def test_replay_on_random_specs_and_options(tmp_path_factory, capsys, spec, cluster, options, policy, reliability):
    tmp = tmp_path_factory.mktemp("fz")
    out = tmp / "run"
    argv = ["replay", "--trace", spec, "--cluster", cluster, "--policy", policy, "--out", str(out), "--no-progress",
            "--no-plots"]
    for pol, key, val in options:
        argv += ["--option", f"{pol}.{key}={val}"]
    _run(tmp, capsys, argv, out)
    reliability("bad_inputs")


@settings(max_examples=25)
@given(rows=st.lists(st.tuples(NUMBERS, NUMBERS, NUMBERS), min_size=0, max_size=5),
       header=st.sampled_from(["submit,duration,gpus", "submit,submit,gpus", "a,b,c", "submit,duration", ""]))
def test_csv_traces_of_random_values(tmp_path_factory, capsys, rows, header, reliability):
    tmp = tmp_path_factory.mktemp("fzcsv")
    f = tmp / "t.csv"
    f.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    out = tmp / "run"
    _run(tmp, capsys, ["replay", "--trace", f"csv:{f}", "--columns", "submit=submit,duration=duration,gpus=gpus",
                       "--cluster", "1x8xH100", "--policy", "independent", "--out", str(out), "--no-progress",
                       "--no-plots"], out)
    reliability("fuzz_files")


@settings(max_examples=20)
@given(body=st.sampled_from([
    'traces = ["synthetic:jobs=5"]\npolicies = ["independent"]\n',
    'traces = ["synthetic:jobs=5"]\npolicies = ["independent"]\nseeds = [0, 0]\n',
    'traces = ["synthetic:jobs=5"]\npolicies = "independent"\n',
    'traces = []\npolicies = ["independent"]\n',
    'traces = ["synthetic:jobs=5"]\npolicies = ["independent"]\n[policy_options.independent]\nordering = "lifo"\n',
    'traces = ["synthetic:jobs=5,load=nan"]\npolicies = ["independent"]\n',
    'traces = ["synthetic:jobs=5"]\npolicies = ["independent"]\npolicy_modules = ["missing.py"]\n',
    'this is = not toml [',
    '\x00\x01\x02',
]))
def test_sweep_files_of_random_content(tmp_path_factory, capsys, body, reliability):
    tmp = tmp_path_factory.mktemp("fzsw")
    f = tmp / "s.toml"
    f.write_bytes(body.encode())
    out = tmp / "sw"
    capsys.readouterr()
    rc = main(["sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc in (0, 2) and "Traceback" not in err, err
    reliability("bad_inputs")
