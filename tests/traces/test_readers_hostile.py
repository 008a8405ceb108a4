"""Issue 45 item 7 (readers, hostile inputs): times beyond the representable range, files readable once
(FIFOs), only mapped columns parsed, a cap on header width, tz directories, a sparse file of NULs. Each is
one InputError line naming file/row/field, never a traceback or a hang (subprocess timeouts guard the hangs)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tlora_sim.sim.cli.main import main
from tlora_sim.traces import read_trace
from tlora_sim.traces.errors import InputError
from tlora_sim.traces.tableio import MAX_HEADER_COLUMNS
from tlora_sim.traces.timestamps import MAX_YEAR, MIN_YEAR

COLS = {"submit": "t", "duration": "d", "gpus": "g"}


def _one_line_error(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


@given(year=st.one_of(st.integers(1, MIN_YEAR - 1), st.integers(MAX_YEAR + 1, 9999)), row=st.integers(1, 3))
def test_csv_time_outside_the_range_names_file_row_field(tmp_path_factory, year, row):
    p = tmp_path_factory.mktemp("y") / "t.csv"
    lines = [f"2024-01-0{i}T00:00:00,10,1" for i in range(1, 4)]
    lines[row - 1] = f"{year:04d}-06-01T00:00:00,10,1"
    p.write_text("t,d,g\n" + "\n".join(lines) + "\n")
    with pytest.raises(InputError, match="outside the years") as e:
        read_trace(f"csv:{p}", csv_columns=COLS)
    assert (e.value.file, e.value.row, e.value.field) == (str(p), row, "t")


@given(year=st.integers(MIN_YEAR, MAX_YEAR))
def test_csv_times_inside_the_range_read(tmp_path_factory, year):
    p = tmp_path_factory.mktemp("y") / "t.csv"
    p.write_text(f"t,d,g\n{year:04d}-06-01T00:00:00,10,1\n{year:04d}-06-01T01:00:00+00:00,10,1\n")
    t = read_trace(f"csv:{p}", csv_columns=COLS)
    assert sorted(t["submit_time_s"].tolist()) == [0.0, 3600.0]


def test_slurm_end_in_9999_is_one_line(tmp_path, capsys):
    p = tmp_path / "s.txt"
    p.write_text("JobID|Submit|Start|End|AllocTRES|State\n"
                 "1|2024-01-01T00:00:00|2024-01-01T00:00:01|2024-01-01T01:00:00|gres/gpu=1|COMPLETED\n"
                 "2|2024-01-01T00:00:00|2024-01-01T00:00:01|9999-12-31T23:59:59|gres/gpu=1|COMPLETED\n")
    line = _one_line_error(["replay", "--policy", "tlora", "--trace", f"slurm:{p}", "--out", str(tmp_path / "o")],
                           capsys)
    assert line.startswith(f"tlora-sim: error: {p}, row 2, field 'End': time outside the years")


@pytest.mark.parametrize("tz", ["America", "Europe", "..", "/etc"])
def test_time_zone_directory_is_one_line(tmp_path, capsys, tz):
    p = tmp_path / "t.csv"
    p.write_text("t,d,g\n2024-01-01T00:00:00,10,1\n")
    line = _one_line_error(["traces", "describe", f"csv:{p}", "--columns", "submit=t,duration=d,gpus=g",
                            "--time-zone", tz], capsys)
    assert "field 'time_zone': unknown time zone" in line


def _read_in_subprocess(spec: str, cols: str | None, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tlora_sim.sim.cli.main", "traces", "describe", spec]
    if cols:
        argv += ["--columns", cols]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("fmt, body, cols", [
    ("csv", "t,d,g\n0,10,1\n5,20,2\n", "submit=t,duration=d,gpus=g"),
    ("slurm", "JobID|Submit|Start|End|AllocTRES|State\n1|2024-01-01T00:00:00|2024-01-01T00:00:01|"
              "2024-01-01T01:00:00|gres/gpu=1|COMPLETED\n", None),
    ("itp", "job_id,submission_time,duration,num_gpu\na,0,10,1\nb,5,10,2\n", None),
])
def test_a_fifo_is_read_once(tmp_path, fmt, body, cols):
    fifo = tmp_path / "trace.pipe"
    os.mkfifo(fifo)

    def feed():  # one writer, once: a reader that opens the file twice would wait forever
        with open(fifo, "w") as fh:
            fh.write(body)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    p = _read_in_subprocess(f"{fmt}:{fifo}", cols)
    writer.join(5)
    assert p.returncode == 0, p.stderr
    assert "jobs       " in p.stdout


def test_a_million_columns_fail_at_the_header(tmp_path):
    p = tmp_path / "wide.csv"
    n = 1_000_000
    p.write_text(",".join(f"c{i}" for i in range(n)) + "\n" + ",".join("1" for _ in range(n)) + "\n" +
                 ",".join("2" for _ in range(n)) + "\n")
    r = _read_in_subprocess(f"csv:{p}", "submit=c0,duration=c1,gpus=c2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "header line is longer than" in r.stderr


def test_a_wide_but_short_header_is_refused_by_column_count(tmp_path):
    p = tmp_path / "wide.csv"
    n = MAX_HEADER_COLUMNS + 1
    p.write_text(",".join("x" * 2 for _ in range(n)) + "\n")
    with pytest.raises(InputError, match=f"header has {n:,} columns"):
        read_trace(f"csv:{p}", csv_columns=COLS)


def test_a_sparse_file_of_nuls_fails_at_its_first_chunk(tmp_path):
    p = tmp_path / "zeros.csv"
    with open(p, "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB of NULs, sparse: takes no disk
    r = _read_in_subprocess(f"csv:{p}", "submit=a,duration=b,gpus=c")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"{p}: not UTF-8 text: NUL byte at byte 0" in r.stderr


def test_only_mapped_columns_are_parsed(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text("junk1,t,junk2,d,g,junk3\nx,0,y,10,1,z\nx,5,y,10,2,z\n")
    calls = []
    real = pd.read_csv

    def spy(*args, **kw):
        calls.append(kw.get("usecols"))
        return real(*args, **kw)

    monkeypatch.setattr(pd, "read_csv", spy)
    read_trace(f"csv:{p}", csv_columns=COLS)
    assert calls == [[1, 3, 4]]


_cell = st.text(alphabet=st.characters(blacklist_characters=',\n\r"\x00', blacklist_categories=("Cs",)), max_size=6)


@given(extra=st.lists(st.lists(_cell, min_size=3, max_size=3), min_size=1, max_size=4),
       where=st.integers(0, 3))
def test_unmapped_columns_never_change_the_result(tmp_path_factory, extra, where):
    base = [["t", "d", "g"], ["0", "10", "1"], ["7", "20", "2"]]
    d = tmp_path_factory.mktemp("u")
    plain, wide = d / "plain.csv", d / "wide.csv"
    plain.write_text("\n".join(",".join(r) for r in base) + "\n")
    names = [f"x{i}" for i in range(len(extra))]
    rows = [names] + [[col[r] for col in extra] for r in range(2)]
    wide_rows = [b[:where] + e + b[where:] for b, e in zip(base, rows)]
    wide.write_text("\n".join(",".join(r) for r in wide_rows) + "\n")
    a = read_trace(f"csv:{plain}", csv_columns=COLS)
    b = read_trace(f"csv:{wide}", csv_columns=COLS)
    pd.testing.assert_frame_equal(a, b)


@given(rows=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12))
def test_live_export_skips_are_counted_once_each(tmp_path_factory, rows):
    p = tmp_path_factory.mktemp("l") / "live.csv"
    lines = [f"{i},{i + 1 if started else ''},{i + 50 if ended and started else ''},1"
             for i, (started, ended) in enumerate(rows)]
    p.write_text("s,b,e,g\n" + "\n".join(lines) + "\n")
    cols = {"submit": "s", "start": "b", "end": "e", "gpus": "g"}
    pending = sum(not s for s, _ in rows)
    running = sum(s and not e for s, e in rows)
    if pending + running == len(rows):
        with pytest.raises(InputError, match="no jobs left"):
            read_trace(f"csv:{p}", csv_columns=cols)
        return
    t = read_trace(f"csv:{p}", csv_columns=cols)
    assert len(t) == len(rows) - pending - running
    assert t.attrs["skipped"].get("never_started", 0) == pending
    assert t.attrs["skipped"].get("state_running", 0) == running


def test_a_huge_one_line_file_fails_before_it_is_read_whole(tmp_path, monkeypatch):
    from tlora_sim.traces import tableio

    p = tmp_path / "line.csv"
    p.write_bytes(b"a," * (4 << 20))  # 8 MiB, no line break
    reads = []
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n):
            b = self.fh.read(n)
            reads.append(len(b))
            return b

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

    monkeypatch.setattr(tableio, "open", lambda f, mode="r", *a, **k: Counting(real_open(f, mode)), raising=False)
    with pytest.raises(InputError, match="header line is longer than"):
        tableio.read_bytes(p)
    assert sum(reads) <= 2 * tableio.READ_CHUNK  # stopped after the header's limit, not at the end
