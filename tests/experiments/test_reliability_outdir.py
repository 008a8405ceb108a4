"""Defect classes "a run directory owned by two runs" and "tracebacks where one line is promised"
for writes (issue 45, items 2 and 3 of the helper's brief): an exclusive lock from the --out check to
the swap, ``--force`` leaving nothing of the replaced run, signals leaving the previous run intact,
``sweep``/``plot`` refusing directories that are not theirs or that mix runs, and write errors
(ENOSPC, EROFS, EACCES) as one line naming the path with the previous run intact."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.runtime import outlock
from tlora_sim.sim.runtime.outlock import lock_path

ROOT = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "tlora_sim.sim.cli.main"]
TINY = ["--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--no-progress"]


def _replay(out: Path, *extra: str) -> list[str]:
    return ["replay", "--policy", "independent", *TINY, "--out", str(out), "--no-plots", *extra]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".") and
            any(k in p.name for k in (".stage-", ".old-", ".lock", ".tmp"))]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
    """Two complete comparisons of independent and mlora, on two traces (made once: figures cost)."""
    base = tmp_path_factory.mktemp("comparisons")
    a, b = base / "a", base / "b"
    assert main(["-q", "compare", "--policies", "independent,mlora", *TINY, "--out", str(a)]) == 0
    assert main(["-q", "compare", "--policies", "independent,mlora", "--trace", "synthetic:jobs=20,seed=2",
                 "--cluster", "1x8xH100", "--no-progress", "--out", str(b)]) == 0
    return a, b


# ---- one owner -------------------------------------------------------------------------------------
def test_a_run_into_a_locked_out_fails_at_once_with_one_line(tmp_path, reliability):
    from filelock import FileLock

    out = tmp_path / "run"
    held = FileLock(str(lock_path(out)))
    held.acquire()
    try:
        t0 = time.monotonic()
        r = subprocess.run([*EXE, *_replay(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert time.monotonic() - t0 < 60  # at once, no waiting for the lock
    finally:
        held.release()
    line = _one_line(r.stderr)
    assert r.returncode == 2 and "another run" in line and str(out) in line
    assert not out.exists()
    reliability("bad_inputs")


def test_two_replays_started_together_leave_one_run_and_one_refusal(tmp_path):
    out = tmp_path / "run"
    procs = [subprocess.Popen([*EXE, *_replay(out, "--seed", str(s))], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    res = [(p.wait(timeout=180), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in res)
    assert codes == [0, 2], res
    winner = [s for s, (rc, _) in zip((1, 2), res) if rc == 0][0]
    loser_err = [err for rc, err in res if rc == 2][0]
    assert "another run" in _one_line(loser_err) or "already holds a run" in loser_err
    assert json.loads((out / "config.json").read_text())["seed"] == winner
    assert _leftovers(tmp_path) == []


def test_the_lock_is_released_after_a_run_and_after_a_refusal(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_replay(out)) == 0
    assert main(_replay(out)) == 2  # holds a run, no --force
    assert main(["compare", "--policies", "nosuch", *TINY, "--out", str(tmp_path / "cmp")]) == 2
    capsys.readouterr()
    assert outlock.held_out_locks() == () and _leftovers(tmp_path) == []


def test_force_leaves_nothing_of_the_replaced_run(tmp_path, comparisons):
    out = tmp_path / "run"
    shutil.copytree(comparisons[0], out)
    assert (out / "figures").is_dir() and (out / "mlora").is_dir()
    assert main(_replay(out, "--force")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "jobs.csv", "perf.json", "summary.json",
                                                     "timeline.csv"]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_leaves_the_previous_run_intact_and_no_staged_leftovers(tmp_path, sig, reliability):
    out = tmp_path / "run"
    assert main(_replay(out)) == 0
    before = _files(out)
    proc = subprocess.Popen([*EXE, "replay", "--policy", "tlora", "--trace", "synthetic:jobs=400,seed=3",
                             "--cluster", "4x8xH100", "--no-progress", "--out", str(out), "--force"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    signum = getattr(signal, sig)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    if proc.returncode != 0:  # interrupted (not finished first): 128 + signal, the old run byte for byte
        assert proc.returncode == 128 + signum, err
        assert _files(out) == before
    assert "Traceback" not in err and _leftovers(tmp_path) == []
    reliability("signal_cases")


# ---- sweep and plot refuse what is not theirs ---------------------------------------------------------
SWEEP = 'traces = ["synthetic:jobs=20,seed=1"]\nclusters = ["1x8xH100"]\npolicies = ["independent"]\n'


@pytest.mark.parametrize("kind", ["replay dir", "file", "proc"])
def test_sweep_out_that_is_not_a_sweep_is_one_line(tmp_path, capsys, kind, reliability):
    f = tmp_path / "s.toml"
    f.write_text(SWEEP)
    if kind == "replay dir":
        out = tmp_path / "run"
        assert main(_replay(out)) == 0
    elif kind == "file":
        out = tmp_path / "afile"
        out.write_text("x")
    else:
        out = Path("/proc/tlora-sim-x")
    before = _files(out) if out.is_dir() else None
    capsys.readouterr()
    rc = main(["sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(out) in line
    if before is not None:
        assert _files(out) == before
    reliability("bad_inputs")


def test_plot_refuses_a_comparison_whose_policy_dir_comes_from_another(tmp_path, comparisons, capsys, reliability):
    a = tmp_path / "a"
    shutil.copytree(comparisons[0], a)
    shutil.rmtree(a / "mlora")
    shutil.copytree(comparisons[1] / "mlora", a / "mlora")
    capsys.readouterr()
    assert main(["plot", str(a)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "mlora" in line and "config.json" in line and "trace" in line
    reliability("bad_inputs")


def test_plot_refuses_a_comparison_whose_summary_row_is_from_another_run(tmp_path, comparisons, capsys):
    a = tmp_path / "a"
    shutil.copytree(comparisons[0], a)
    summary = json.loads((a / "mlora" / "summary.json").read_text())
    summary["avg_jct_s"] *= 1.5
    (a / "mlora" / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["plot", str(a)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "summary.csv" in line and "avg_jct_s" in line and "row" in line


# ---- write errors ------------------------------------------------------------------------------------
def _disk_full(monkeypatch, code: int = errno.ENOSPC) -> None:
    import pyarrow.csv as pa_csv

    def full(*_a, **_k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(pa_csv, "write_csv", full)


WRITE_CASES = [("replay", errno.ENOSPC), ("replay", errno.EROFS), ("replay", errno.EACCES),
               ("compare", errno.ENOSPC), ("compare", errno.EROFS), ("compare --seeds", errno.ENOSPC),
               ("sweep", errno.ENOSPC), ("sweep", errno.EACCES)]


@pytest.mark.parametrize("command,code", WRITE_CASES, ids=[f"{c}-{errno.errorcode[e]}" for c, e in WRITE_CASES])
def test_a_write_error_is_one_line_and_the_previous_run_stays(tmp_path, comparisons, monkeypatch, capsys, code,
                                                              command, reliability):
    out = tmp_path / "out"
    if command == "replay":
        argv = _replay(out, "--force")
        assert main(argv) == 0
    elif command.startswith("compare"):  # the previous run: a complete comparison
        argv = ["compare", "--policies", "independent,mlora", *TINY, "--workers", "1", "--out", str(out), "--force"]
        if command.endswith("--seeds"):
            argv += ["--seeds", "0-1"]
        shutil.copytree(comparisons[0], out)
    else:
        f = tmp_path / "s.toml"
        f.write_text(SWEEP)
        argv = ["sweep", str(f), "--out", str(out), "--workers", "1", "--no-progress"]
        assert main(argv) == 0
        f.write_text(SWEEP.replace('["independent"]', '["independent", "mlora"]'))
    before = _files(out)
    capsys.readouterr()
    _disk_full(monkeypatch, code)
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and os.strerror(code) in line and str(out) in line, line
    after = _files(out)
    if command == "sweep":  # finished cells and their table are kept; only the new cell is missing
        assert after["sweep.csv"] == before["sweep.csv"]
        assert all(after[k] == v for k, v in before.items() if k != "sweep.json")
    else:
        assert after == before
        assert _leftovers(tmp_path) == []
    reliability("bad_inputs")


def test_a_write_error_while_staging_is_one_line(tmp_path, monkeypatch, capsys):
    import tempfile

    def ro(*_a, **_k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", ro)
    rc = main(_replay(tmp_path / "run"))
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and os.strerror(errno.EROFS) in line and str(tmp_path) in line
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories (permissions not checked)")
def test_a_read_only_parent_is_one_line(tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        rc = main(_replay(parent / "run"))
        line = _one_line(capsys.readouterr().err)
        assert rc == 2 and str(parent) in line
    finally:
        parent.chmod(0o755)


def test_plot_on_a_full_disk_is_one_line_and_keeps_the_figures(tmp_path, monkeypatch, capsys, reliability):
    from matplotlib.figure import Figure

    out = tmp_path / "run"
    assert main(["replay", "--policy", "independent", *TINY, "--out", str(out)]) == 0
    before = _files(out)

    def full(self, fname, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full)
    capsys.readouterr()
    rc = main(["plot", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and os.strerror(errno.ENOSPC) in line
    assert _files(out) == before and not [p for p in out.rglob(".*.tmp")]
    reliability("bad_inputs")


# ---- fault injection: the k-th write fails -------------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=30)
@given(k=st.integers(0, 8), code=st.sampled_from([errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT]),
       where=st.sampled_from(["replace", "mkstemp", "mkdtemp"]))
def test_whichever_write_fails_the_previous_run_stays(tmp_path_factory, k, code, where):
    import tempfile

    base = tmp_path_factory.mktemp("kth")
    out = base / "run"
    argv = ["-q", *_replay(out, "--force")]
    assert main(argv) == 0
    before = _files(out)
    calls = {"n": 0}
    owner = os if where == "replace" else tempfile
    real = getattr(owner, where)

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == k + 1:
            raise OSError(code, os.strerror(code))
        return real(*a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(owner, where, flaky)
    try:
        rc = main(argv)
    finally:
        mp.undo()
    if calls["n"] <= k:  # fewer such calls than k: the run went through
        assert rc == 0
    else:
        assert rc == 2
        assert _files(out) == before
    assert _leftovers(base) == []
