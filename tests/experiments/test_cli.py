"""The ``tlora-sim`` command line: help, bad inputs (one stderr line, exit 2, no traceback), outputs."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ITP02, ROOT, needs_itp
from tlora_sim.sim.cli.main import main

SUMMARY_COLUMNS = ["policy", "jobs", "avg_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "avg_queue_s",
                   "makespan_s", "throughput_tokens_per_s", "gpu_alloc_util", "gpu_compute_util"]
RUN_FILES = ["config.json", "jobs.csv", "timeline.csv", "summary.json", "perf.json"]
EXE = [sys.executable, "-m", "tlora_sim.sim.cli.main"]
ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``tlora-sim`` in a fresh interpreter (as a user would)."""
    return subprocess.run([*EXE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ---- help ------------------------------------------------------------------------------------------
def test_top_level_help_lists_every_subcommand():
    r = cli("--help")
    assert r.returncode == 0 and r.stderr == ""
    for sub in ("replay", "compare", "traces", "policies", "plot"):
        assert sub in r.stdout


@pytest.mark.parametrize("sub", [["replay"], ["compare"], ["traces"], ["traces", "describe"], ["policies"],
                                 ["plot"]])
def test_each_subcommand_has_help(sub, capsys):
    with pytest.raises(SystemExit) as info:
        main([*sub, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tlora-sim " + " ".join(sub))
    if sub[0] in ("replay", "compare"):
        for flag in ("--trace", "--cluster", "--seed", "--out", "--strict", "--no-invariants"):
            assert flag in out


def test_policies_lists_name_and_description_per_line():
    r = cli("policies")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    names = [ln.split("\t")[0] for ln in lines]
    assert {"independent", "mlora", "tlora"} <= set(names)
    for ln in lines:
        name, desc = ln.split("\t", 1)
        assert name and desc.strip() and " " not in name


# ---- bad inputs ------------------------------------------------------------------------------------
def _files(tmp: Path) -> dict[str, Path]:
    """Small broken (and one good) trace files, by name."""
    def w(name, text):
        p = tmp / name
        p.write_text(text, encoding="utf-8")
        return p

    files = {
        "good": w("good.csv", ITP_HEADER + "a,0,3600,1\nb,60,7200,2\n"),
        "missing_col": w("missing.csv", "job_id,submission_time,num_gpu\na,0,1\n"),
        "misspelt_col": w("misspelt.csv", "job_id,submision_time,duration,num_gpu\na,0,100,1\n"),
        "non_numeric": w("nonnum.csv", ITP_HEADER + "a,0,100,1\nb,5,soon,1\n"),
        "negative": w("negative.csv", ITP_HEADER + "a,0,100,1\nb,5,100,-2\n"),
        "nan": w("nan.csv", ITP_HEADER + "a,0,NaN,1\n"),
        "inf": w("inf.csv", ITP_HEADER + "a,0,inf,1\n"),
        "zero_gpus": w("zerogpu.csv", ITP_HEADER + "a,0,100,0\n"),
        "fraction_gpus": w("fracgpu.csv", ITP_HEADER + "a,0,100,1.5\n"),
        "duplicate_id": w("dup.csv", ITP_HEADER + "a,0,100,1\na,5,100,1\n"),
        "empty": w("empty.csv", ""),
        "header_only": w("header.csv", ITP_HEADER),
        "oversized": w("oversized.csv", ITP_HEADER + "a,0,100,1\nb,5,100,4096\n"),
        "zero_duration": w("zerodur.csv", ITP_HEADER + "a,0,100,1\nb,5,0,1\n"),
        "philly_time": w("philly.csv", "timestamp,duration,num_gpus\n2017-10-03 10:00:00,100,1\nyesterday,5,1\n"),
        "bad_dist": w("dist.json", '{"ranks": {"8": 0.5}}'),
        "not_json": w("dist2.json", "{ranks"),
    }
    (tmp / "latin1.csv").write_bytes((ITP_HEADER + "caf\xe9,0,100,1\n").encode("latin-1"))
    files["not_utf8"] = tmp / "latin1.csv"
    (tmp / "trunc.csv.gz").write_bytes(gzip.compress((ITP_HEADER + "a,0,100,1\n" * 200).encode())[:60])
    files["truncated_gzip"] = tmp / "trunc.csv.gz"
    return files


# (case name, argv template with {name} placeholders for files, what the one error line must contain)
BAD = [
    ("missing column", ["--trace", "itp:{missing_col}"], ["{missing_col}", "'duration'"]),
    ("misspelt column", ["--trace", "itp:{misspelt_col}"], ["{misspelt_col}", "'submission_time'", "did you mean"]),
    ("non-numeric", ["--trace", "itp:{non_numeric}"], ["{non_numeric}", "row 2", "'duration'", "soon"]),
    ("negative", ["--trace", "itp:{negative}"], ["{negative}", "row 2", "'num_gpu'"]),
    ("NaN", ["--trace", "itp:{nan}"], ["{nan}", "row 1", "'duration'"]),
    ("inf", ["--trace", "itp:{inf}"], ["{inf}", "row 1", "'duration'"]),
    ("zero GPUs", ["--trace", "itp:{zero_gpus}"], ["{zero_gpus}", "row 1", "'num_gpu'"]),
    ("fractional GPUs", ["--trace", "itp:{fraction_gpus}"], ["{fraction_gpus}", "row 1", "whole number"]),
    ("duplicate id", ["--trace", "itp:{duplicate_id}"], ["{duplicate_id}", "row 2", "'job_id'"]),
    ("empty file", ["--trace", "itp:{empty}"], ["{empty}", "empty"]),
    ("header only", ["--trace", "itp:{header_only}"], ["{header_only}", "no data rows"]),
    ("not UTF-8", ["--trace", "itp:{not_utf8}"], ["{not_utf8}", "UTF-8"]),
    ("truncated gzip", ["--trace", "itp:{truncated_gzip}"], ["{truncated_gzip}", "truncated"]),
    ("missing file", ["--trace", "itp:{good}.missing"], ["{good}.missing", "not found"]),
    ("directory as file", ["--trace", "csv:{dir}", "--columns", "submit=a,duration=b,gpus=c"], ["{dir}"]),
    ("philly timestamp", ["--trace", "philly:{philly_time}"], ["{philly_time}", "row 2", "'timestamp'"]),
    ("unknown format", ["--trace", "parquet:{good}"], ["unknown trace format 'parquet'", "itp"]),
    ("no format", ["--trace", "{good}"], ["FORMAT:PATH"]),
    ("csv without mapping", ["--trace", "csv:{good}"], ["column mapping"]),
    ("csv mapping bad key", ["--trace", "csv:{good}", "--columns", "start=a,duration=b,gpus=c"], ["'--columns'"]),
    ("csv mapped column absent", ["--trace", "csv:{good}", "--columns", "submit=t,duration=duration,gpus=num_gpu"],
     ["{good}", "'t'"]),
    ("mapping on non-csv", ["--trace", "itp:{good}", "--columns", "submit=a,duration=b,gpus=c"], ["csv format"]),
    ("unknown policy", ["--trace", "itp:{good}", "--policy", "fastest"], ["unknown policy 'fastest'", "tlora"]),
    ("bad cluster spec", ["--trace", "itp:{good}", "--cluster", "16xH100"], ["'--cluster'", "NODESxGPUSxTYPE"]),
    ("unknown GPU", ["--trace", "itp:{good}", "--cluster", "2x8xB300"], ["'--cluster'", "B300"]),
    ("zero nodes", ["--trace", "itp:{good}", "--cluster", "0x8xH100"], ["'--cluster'"]),
    ("oversized --strict", ["--trace", "itp:{oversized}", "--strict"], ["{oversized}", "row 2", "'num_gpus'", "4096"]),
    ("memory --strict", ["--trace", "itp:{good}", "--strict", "--lora-dist", "{big_model}"],
     ["{good}", "row 1", "does not fit"]),
    ("zero duration --strict", ["--trace", "itp:{zero_duration}", "--strict"], ["{zero_duration}", "zero_duration"]),
    ("unknown LoRA dist", ["--trace", "itp:{good}", "--lora-dist", "huge"], ["unknown LoRA distribution"]),
    ("bad LoRA dist", ["--trace", "itp:{good}", "--lora-dist", "{bad_dist}"], ["{bad_dist}", "'ranks'", "sum to 1"]),
    ("LoRA dist not JSON", ["--trace", "itp:{good}", "--lora-dist", "{not_json}"], ["{not_json}", "JSON"]),
    ("unknown option", ["--trace", "itp:{good}", "--option", "turbo=1"], ["'turbo'"]),
    ("non-numeric option", ["--trace", "itp:{good}", "--option", "max_group_size=many"], ["'max_group_size'"]),
    ("out-of-range option", ["--trace", "itp:{good}", "--option", "max_group_size=0"], ["max_group_size"]),
    ("option syntax", ["--trace", "itp:{good}", "--option", "max_group_size"], ["'--option'"]),
    ("negative pause", ["--trace", "itp:{good}", "--regroup-pause", "-1"], ["'--regroup-pause'"]),
    ("negative seed", ["--trace", "itp:{good}", "--seed", "-3"], ["'--seed'"]),
    ("synthetic bad option", ["--trace", "synthetic:jobs=many"], ["'jobs'", "int"]),
    ("synthetic unknown key", ["--trace", "synthetic:users=5"], ["'users'"]),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    files = {k: str(v) for k, v in _files(tmp).items()}
    files["dir"] = str(tmp)
    big = tmp / "big.json"
    big.write_text(json.dumps({"models": {"llama3-70b": 1.0}}))
    files["big_model"] = str(big)
    return files


@pytest.mark.parametrize("command", ["replay", "compare"])
@pytest.mark.parametrize("case, argv, expect", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gives_one_line_exit_2_no_traceback(case, argv, expect, command, bad_files, tmp_path, capsys,
                                                      reliability):
    argv = [a.format(**bad_files) for a in argv]
    if command == "compare":
        argv = [("--policies" if a == "--policy" else a) for a in argv]
        if "--policies" not in argv:
            argv += ["--policies", "independent,tlora"]
        argv += ["--workers", "1"]
        if "--option" in argv:
            argv[argv.index("--option") + 1] = "tlora." + argv[argv.index("--option") + 1]
    elif "--policy" not in argv:
        argv += ["--policy", "tlora"]
    rc = main([command, *argv, "--out", str(tmp_path / "out"), "--no-progress", "--cluster", "2x8xH100"]
              if "--cluster" not in argv else [command, *argv, "--out", str(tmp_path / "out"), "--no-progress"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("tlora-sim: error: ")
    for piece in expect:
        assert piece.format(**bad_files) in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "out" / "jobs.csv").exists() and not (tmp_path / "out" / "summary.csv").exists()
    reliability("bad_inputs")


@pytest.mark.parametrize("case, argv", [
    ("oversized without --strict", ["--trace", "itp:{oversized}"]),
    ("zero duration without --strict", ["--trace", "itp:{zero_duration}"]),
])
def test_documented_skips_are_counted_without_strict(case, argv, bad_files, tmp_path):
    argv = [a.format(**bad_files) for a in argv]
    assert main(["replay", *argv, "--policy", "independent", "--out", str(tmp_path), "--no-progress",
                 "--no-plots", "--cluster", "2x8xH100"]) == 0
    skipped = json.loads((tmp_path / "summary.json").read_text())["skipped"]
    assert sum(skipped.values()) == 1


@pytest.mark.slow
def test_bad_inputs_in_a_real_subprocess_print_one_line(bad_files, tmp_path, reliability):
    """The console script itself (not just main()): exit 2, one line, no traceback."""
    for argv in (["replay", "--trace", f"itp:{bad_files['misspelt_col']}", "--policy", "tlora"],
                 ["compare", "--trace", f"itp:{bad_files['oversized']}", "--policies", "independent,mlora",
                  "--strict", "--cluster", "2x8xH100"],
                 ["replay", "--trace", "itp:" + bad_files["good"], "--policy", "nope"]):
        r = cli(*argv, "--out", str(tmp_path / "o"), "--no-progress")
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        reliability("bad_inputs")


def test_usage_errors_exit_2():
    r = cli("replay", "--trace", "synthetic:jobs=5")  # --policy and --out missing
    assert r.returncode == 2 and "required" in r.stderr and "Traceback" not in r.stderr
    r = cli("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr


# ---- outputs ---------------------------------------------------------------------------------------
def test_replay_writes_a_complete_run_directory(tmp_path):
    out = tmp_path / "run"
    assert main(["replay", "--trace", "synthetic:jobs=40", "--cluster", "2x8xH100", "--policy", "tlora",
                 "--out", str(out), "--no-progress"]) == 0
    for f in RUN_FILES:
        assert (out / f).is_file(), f
    jobs = pd.read_csv(out / "jobs.csv")
    assert len(jobs) == 40 and jobs["finish_time_s"].notna().all()
    assert (jobs["jct_s"] >= 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 40 and summary["policy"] == "tlora"
    config = json.loads((out / "config.json").read_text())
    assert config["seed"] == 0 and config["lora_distribution"]["name"] == "tlora"
    assert any((out / "figures").glob("*.png")) and any((out / "figures").glob("*.pdf"))
    assert not list(out.rglob("*.tmp"))


def test_no_invariants_flag_switches_the_checks_off(tmp_path):
    for flag, expected in (([], True), (["--no-invariants"], False)):
        out = tmp_path / str(expected)
        assert main(["replay", "--trace", "synthetic:jobs=20", "--cluster", "2x8xH100", "--policy", "mlora",
                     "--out", str(out), "--no-progress", "--no-plots", *flag]) == 0
        assert json.loads((out / "perf.json").read_text())["invariants_checked"] is expected
    for name in ("jobs.csv", "summary.json", "timeline.csv"):
        assert (tmp_path / "True" / name).read_bytes() == (tmp_path / "False" / name).read_bytes()


def test_compare_writes_summary_csv_run_dirs_and_figures(tmp_path):
    out = tmp_path / "cmp"
    r = cli("compare", "--trace", "synthetic:jobs=40", "--cluster", "2x8xH100", "--policies",
            "independent,mlora,tlora", "--seed", "1", "--out", str(out), "--no-progress", "--workers", "2")
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out / "summary.csv")
    assert list(table.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert list(table["policy"]) == ["independent-backfill", "independent", "mlora", "tlora"]  # the reference added
    assert (table["jobs"] == 40).all()
    assert ((table["gpu_alloc_util"] > 0) & (table["gpu_alloc_util"] <= 1)).all()
    assert (table["p50_jct_s"] <= table["p90_jct_s"]).all() and (table["p90_jct_s"] <= table["p99_jct_s"]).all()
    for p in ("independent", "mlora", "tlora"):
        for f in RUN_FILES:
            assert (out / p / f).is_file()
    assert any((out / "figures").glob("*.png"))
    assert not list(out.rglob("*.tmp"))
    assert "wrote" in r.stdout


@pytest.mark.slow
@needs_itp
def test_itp_cluster02_compare_every_job_finishes_exactly_once(tmp_path, reliability):
    out = tmp_path / "itp02"
    r = cli("compare", "--trace", f"itp:{ITP02}", "--cluster", "16x8xH100", "--policies", "independent,mlora,tlora",
            "--seed", "0", "--out", str(out), "--no-progress", "--workers", "2", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(out / "summary.csv")
    for p in ("independent", "mlora", "tlora"):
        jobs = pd.read_csv(out / p / "jobs.csv")
        assert len(jobs) == 5778 and jobs["job_id"].is_unique
        assert jobs["finish_time_s"].notna().all() and (jobs["finish_time_s"] >= jobs["start_time_s"]).all()
        assert ((jobs["steps_trained"] - jobs["total_steps"]).abs() <= 1e-6 * jobs["total_steps"] + 1e-3).all()
        assert int(table.loc[table["policy"] == p, "jobs"].iloc[0]) == 5778
        if p == "independent":
            assert (jobs["jct_s"] >= jobs["isolated_runtime_s"] * (1 - 1e-9)).all()
        reliability("invariant_cases")


def test_write_csv_reads_back_the_same_values(tmp_path):
    """The Arrow writer: shortest round-trip floats, NaN as empty, bools, quoted text; a frame Arrow
    cannot type (an object column of mixed kinds) goes through pandas and reads back too."""
    import numpy as np

    from tlora_sim.sim.report.rundir import write_csv

    rng = np.random.default_rng(3)
    df = pd.DataFrame({"t": rng.random(200) * 10.0 ** rng.integers(-12, 16, 200), "n": np.arange(200),
                       "ok": rng.random(200) < 0.5, "name": [f'job,{i} "q"' if i % 3 else None for i in range(200)],
                       "gap": np.where(np.arange(200) % 7 == 0, np.nan, 1.5)})
    back = pd.read_csv(write_csv(tmp_path / "a.csv", df))
    assert list(back.columns) == list(df.columns)
    assert (back.t.to_numpy() == df.t.to_numpy()).all() and (back.n == df.n).all() and (back.ok == df.ok).all()
    assert back.name.equals(df.name.where(df.name.notna(), np.nan)) and back.gap.equals(df.gap)
    mixed = pd.DataFrame({"x": [1, "a", 2.5]})
    assert pd.read_csv(write_csv(tmp_path / "b.csv", mixed)).x.astype(str).tolist() == ["1", "a", "2.5"]


# ---- interrupted runs: every output complete or absent, no temp file -------------------------------
def test_atomic_write_keeps_the_previous_file_when_the_writer_fails(tmp_path):
    from tlora_sim.sim.runtime.atomic import atomic_write

    target = tmp_path / "x.csv"
    target.write_text("old complete\n")

    def boom(p):
        p.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, boom)
    assert target.read_text() == "old complete\n" and os.listdir(tmp_path) == ["x.csv"]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_while_writing_leaves_the_previous_file_and_no_temp(sig, tmp_path, reliability):
    from tlora_sim.sim.runtime.atomic import atomic_write
    from tlora_sim.sim.runtime.signals import Interrupted, signals_raise_interrupt

    target = tmp_path / "summary.json"
    target.write_text('{"old": true}\n')

    def slow(p):
        p.write_text('{"new": ')
        os.kill(os.getpid(), getattr(signal, sig))  # arrives mid-write
        time.sleep(0.05)
        p.write_text('{"new": true}\n')

    with signals_raise_interrupt(), pytest.raises(Interrupted) as info:
        atomic_write(target, slow)
    assert info.value.signum == getattr(signal, sig)
    assert json.loads(target.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["summary.json"]
    reliability("signal_cases")


def test_a_signal_inside_a_finalizer_is_delivered_again_not_printed(capfd, reliability):
    """A signal handled while a weakref callback runs raises ``Interrupted`` where Python can only
    print and drop it ("Exception ignored in ..."); it must instead interrupt the ordinary code that
    follows (seen as a flaky traceback in the killed-compare test below)."""
    import weakref

    from tlora_sim.sim.runtime.signals import Interrupted, signals_raise_interrupt

    class Thing:
        pass

    def callback(_ref):
        signal.raise_signal(signal.SIGTERM)  # handled at the next bytecode check: inside this callback
        for _ in range(1000):
            pass

    with signals_raise_interrupt(), pytest.raises(Interrupted) as info:
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # runs the callback
        for _ in range(10**7):  # the re-delivered signal lands here
            pass
    assert info.value.signum == signal.SIGTERM and ref() is None
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err
    reliability("signal_cases")


def test_an_interrupt_dropped_in_a_finalizer_unwinds_the_write_at_its_next_line(tmp_path, reliability):
    """The dropped interrupt is raised again by a trace function at the next line of the frame the
    finalizer ran under: the write stops there, the previous file and no temp file are left, and no
    trace function is left behind."""
    import traceback
    import weakref

    from tlora_sim.sim.runtime.atomic import atomic_write
    from tlora_sim.sim.runtime.signals import Interrupted, signals_raise_interrupt

    class Thing:
        pass

    def callback(_ref):
        signal.raise_signal(signal.SIGTERM)

    def write(p):
        p.write_text("partial")
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the interrupt is dropped inside the callback ...
        p.write_text("complete\n")  # ... and raised again here
        assert ref() is None

    target = tmp_path / "out.txt"
    target.write_text("previous\n")
    with signals_raise_interrupt(), pytest.raises(Interrupted) as info:
        atomic_write(target, write)
    raised_in = [f for f in traceback.extract_tb(info.value.__traceback__) if f.name == "write"]
    assert raised_in and raised_in[-1].line == 'p.write_text("complete\\n")  # ... and raised again here'
    assert sys.gettrace() is None
    assert target.read_text() == "previous\n" and os.listdir(tmp_path) == ["out.txt"]
    reliability("signal_cases")


def test_a_signal_during_the_rename_is_held_until_the_file_is_complete(tmp_path, monkeypatch, reliability):
    from tlora_sim.sim.report import rundir
    from tlora_sim.sim.runtime.atomic import atomic_write
    from tlora_sim.sim.runtime.signals import Interrupted, signals_raise_interrupt

    target = tmp_path / "jobs.csv"
    real_replace = os.replace

    def replace_with_signal(src, dst):
        os.kill(os.getpid(), signal.SIGTERM)  # held back: the rename completes first
        real_replace(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace_with_signal)
    with signals_raise_interrupt(), pytest.raises(Interrupted):
        atomic_write(target, lambda p: p.write_text("a,b\n1,2\n"))
    assert target.read_text() == "a,b\n1,2\n" and os.listdir(tmp_path) == ["jobs.csv"]
    reliability("signal_cases")


def test_signal_handlers_are_restored():
    from tlora_sim.sim.runtime.signals import signals_raise_interrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with signals_raise_interrupt():
        assert all(signal.getsignal(s) is not h for s, h in before.items())
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_from_another_thread_is_still_held_during_the_rename(tmp_path, monkeypatch):
    """The OS may deliver a process signal to any thread (tqdm, pool managers); holding must not rely on masks."""
    import threading

    from tlora_sim.sim.report import rundir
    from tlora_sim.sim.runtime.atomic import atomic_write
    from tlora_sim.sim.runtime.signals import Interrupted, signals_raise_interrupt

    target = tmp_path / "timeline.csv"
    real_replace = os.replace

    def replace_after_signal_from_thread(src, dst):
        t = threading.Thread(target=lambda: os.kill(os.getpid(), signal.SIGTERM))
        t.start()
        t.join()
        time.sleep(0.01)
        real_replace(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace_after_signal_from_thread)
    with signals_raise_interrupt(), pytest.raises(Interrupted):
        atomic_write(target, lambda p: p.write_text("t\n0\n"))
    assert target.read_text() == "t\n0\n" and os.listdir(tmp_path) == ["timeline.csv"]


REPLAY_ARGS = ["replay", "--trace", "synthetic:jobs=3000,seed=4", "--cluster", "4x8xH100", "--policy", "tlora",
               "--no-progress"]


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    """A complete run directory of REPLAY_ARGS (the bytes every interrupted run must match or lack)."""
    out = tmp_path_factory.mktemp("baseline") / "run"
    r = cli(*REPLAY_ARGS, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def check_complete_or_absent(out: Path, baseline: Path) -> list[str]:
    """Every file under ``out`` is complete: deterministic ones equal the baseline's bytes, the others parse."""
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], "temp file left behind"
    present = []
    for p in sorted(out.rglob("*")):
        if p.is_dir():
            continue
        rel = p.relative_to(out)
        present.append(str(rel))
        data = p.read_bytes()
        if p.name in ("jobs.csv", "timeline.csv", "summary.json", "config.json"):
            assert data == (baseline / rel).read_bytes(), f"{rel} is not the complete file"
        elif p.suffix == ".json":
            json.loads(data)
        elif p.suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and data.rstrip().endswith(b"IEND\xaeB`\x82"), rel
        elif p.suffix == ".pdf":
            assert data.startswith(b"%PDF") and data.rstrip().endswith(b"%%EOF"), rel
        else:
            raise AssertionError(f"unexpected file {rel}")
    return present


@pytest.mark.slow
@pytest.mark.parametrize("sig, delay, previous", [
    ("SIGTERM", 1.0, False), ("SIGTERM", 1.7, False), ("SIGTERM", 2.5, True), ("SIGTERM", 3.3, False),
    ("SIGTERM", 4.2, True), ("SIGINT", 2.0, False), ("SIGINT", 3.7, True),
])
def test_killed_replay_leaves_only_complete_files(sig, delay, previous, baseline_run, tmp_path, reliability):
    import shutil

    out = tmp_path / "run"
    if previous:  # a complete earlier run in the same directory must survive intact
        shutil.copytree(baseline_run, out)
    proc = subprocess.Popen([*EXE, *REPLAY_ARGS, "--out", str(out), *(["--force"] if previous else [])], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    signum = getattr(signal, sig)
    assert proc.returncode in (0, 128 + signum, -signum), err
    if proc.returncode == 128 + signum:
        # a signal during start-up ends the process at once and silently, before anything is
        # written (sim/cli/main.py _exit_on_signal); a later one says so in one line
        started = "interrupted" in err
        assert (started or (err == "" and (previous or not out.exists()))) and "Traceback" not in err, err
    present = check_complete_or_absent(out, baseline_run) if out.exists() else []
    if previous:
        assert set(present) >= {"config.json", "jobs.csv", "timeline.csv", "summary.json", "perf.json"}
    else:  # the run directory appears whole or not at all
        assert not present or set(present) >= {"config.json", "jobs.csv", "timeline.csv", "summary.json"}
    assert not [p.name for p in tmp_path.iterdir() if ".stage-" in p.name or ".old-" in p.name]
    reliability("signal_cases")


def test_out_holding_a_run_is_refused_without_force(baseline_run, tmp_path, reliability):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(baseline_run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = cli("replay", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--policy", "independent",
            "--out", str(out), "--no-progress")
    assert r.returncode == 2 and "--force" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    r = cli("compare", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--policies", "independent",
            "--out", str(out), "--no-progress")
    assert r.returncode == 2 and "--force" in r.stderr
    reliability("bad_inputs", 2)


def test_force_replaces_the_whole_directory(baseline_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(baseline_run, out)
    (out / "stale.txt").write_text("from an earlier run")
    r = cli("replay", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--policy", "independent",
            "--out", str(out), "--no-progress", "--no-plots", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "config.json").read_text())["policy"] == "independent"
    assert not (out / "stale.txt").exists() and not (out / "figures").exists()  # nothing of the old run is left


def test_killed_forced_replay_keeps_the_earlier_run(tmp_path, reliability):
    """A replay killed while replacing a different earlier run leaves that earlier run, whole."""
    out = tmp_path / "run"
    r = cli("replay", "--trace", "synthetic:jobs=30,seed=2", "--cluster", "1x8xH100", "--policy", "independent",
            "--out", str(out), "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = subprocess.Popen([*EXE, *REPLAY_ARGS, "--out", str(out), "--force"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    if proc.returncode != 0:  # interrupted: the earlier run, byte for byte
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p.name for p in tmp_path.iterdir() if ".stage-" in p.name]
    reliability("signal_cases")


@pytest.mark.parametrize("make", ["file", "unwritable"])
def test_bad_out_is_one_line(tmp_path, make, reliability):
    if make == "file":
        out = tmp_path / "f.txt"
        out.write_text("x")
    else:
        if os.geteuid() == 0:
            out = Path("/proc/tlora-sim-cannot-write/run")
        else:
            ro = tmp_path / "ro"
            ro.mkdir()
            ro.chmod(0o500)
            out = ro / "run"
    for cmd in (["replay", "--policy", "independent"], ["compare", "--policies", "independent,mlora", "--workers", "2"]):
        r = cli(*cmd, "--trace", "synthetic:jobs=10,seed=1", "--cluster", "1x8xH100", "--out", str(out),
                "--no-progress")
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    reliability("bad_inputs", 2)


def test_killed_parallel_compare_stops_its_workers_and_leaves_only_complete_files(tmp_path, reliability):
    out = tmp_path / "cmp"
    proc = subprocess.Popen([*EXE, "compare", "--trace", "synthetic:jobs=3000,seed=4", "--cluster", "4x8xH100",
                             "--policies", "independent,mlora,tlora", "--out", str(out), "--no-progress",
                             "--workers", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a timed-out wait must not leave the run (and its workers) behind
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 143), err
    assert "Traceback" not in err, err
    deadline = time.time() + 10
    while time.time() < deadline and _processes_mentioning(str(out)):
        time.sleep(0.2)
    assert not _processes_mentioning(str(out)), "compare workers outlived the parent"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    for p in out.rglob("*.json"):
        json.loads(p.read_bytes())
    for p in out.rglob("*.csv"):
        pd.read_csv(p)
    reliability("signal_cases")


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (Linux /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def test_a_failure_while_unwinding_from_a_signal_exits_as_interrupted(monkeypatch, capsys):
    """A library that fails while a signal's interruption unwinds through it (matplotlib's PDF
    writer flushing a half-compressed stream raised ``zlib.error`` on SIGTERM) ends the run as
    interrupted, exit 128 + the signal, not as a crash."""
    import tlora_sim.sim.cli.main as cli
    from tlora_sim.sim.runtime.signals import Interrupted

    def run(_args):
        try:
            raise Interrupted(signal.SIGTERM)
        finally:
            raise RuntimeError("Error -2 while flushing: inconsistent stream state")

    monkeypatch.setattr(cli, "_run", run)
    assert main(["policies"]) == 128 + signal.SIGTERM
    assert "interrupted (signal 15)" in capsys.readouterr().err

    def crash(_args):
        raise RuntimeError("a bug, no signal")

    monkeypatch.setattr(cli, "_run", crash)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["policies"])
