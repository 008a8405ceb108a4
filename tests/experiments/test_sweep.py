"""``tlora-sim sweep``: SWEEP.toml validation, cross product, rows, resumability, failures, backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tlora_sim.sim.experiments import sweep as sw
from tlora_sim.sim.runtime.outlock import SweepLock
from tlora_sim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SYN = "synthetic:jobs=40,seed=1"
SYN2 = "synthetic:jobs=30,seed=2,load=0.9"


def write_toml(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def basic(tmp_path: Path, *, seeds="[0, 1]", policies='["independent-backfill", "tlora"]', extra="") -> Path:
    return write_toml(tmp_path, f'traces = ["{SYN}", "{SYN2}"]\nclusters = ["2x8xH100"]\n'
                                f"policies = {policies}\nseeds = {seeds}\n{extra}")


def run(path: Path, out: Path, **kw) -> sw.SweepResult:
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    return sw.run_sweep(sw.load_sweep(path), out, **kw)


# ---- parsing and validation ------------------------------------------------------------------------
def test_cross_product_ids_and_defaults(tmp_path):
    s = sw.load_sweep(basic(tmp_path, extra='regroup_pause_s = [0, 30.0]\nlora_dists = ["tlora", "mixed-ranks"]\n'))
    assert len(s.cells) == 2 * 1 * 2 * 2 * 2 * 2 * 1
    ids = [c.cell_id for c in s.cells]
    assert len(set(ids)) == len(ids) and all(len(i) == 16 for i in ids)
    assert {c.cost_model for c in s.cells} == {"auto"}
    assert {c.regroup_pause_s for c in s.cells} == {0.0, 30.0}
    # ids depend on the inputs only, not on list order or the file's location
    other = tmp_path / "elsewhere"
    other.mkdir()
    p2 = write_toml(other, f'policies = ["tlora", "independent-backfill"]\nseeds = [1, 0]\ntraces = ["{SYN2}", "{SYN}"]\n'
                           'clusters = ["2x8xH100"]\nregroup_pause_s = [30, 0]\nlora_dists = ["mixed-ranks", "tlora"]\n')
    assert {c.cell_id for c in sw.load_sweep(p2).cells} == set(ids)


def test_policy_options_change_only_that_policy(tmp_path):
    plain = sw.load_sweep(basic(tmp_path))
    opt = sw.load_sweep(basic(tmp_path, extra="[policy_options.tlora]\nmax_group_size = 4\n"))
    changed = {c.cell_id for c in plain.cells} ^ {c.cell_id for c in opt.cells}
    assert len(changed) == 2 * 4  # the 4 tlora cells of each sweep
    assert all(c.policy_options == (("max_group_size", 4),) for c in opt.cells if c.policy == "tlora")


def test_relative_trace_paths_resolve_against_the_sweep_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "t.csv").write_text("ts,dur,n\n0,600,1\n10,900,2\n")
    sub = tmp_path / "sweeps"
    sub.mkdir()
    p = write_toml(sub, 'traces = ["csv:../data/t.csv"]\npolicies = ["independent-backfill"]\nclusters = ["1x8xH100"]\n'
                        '[csv_columns]\nsubmit = "ts"\nduration = "dur"\ngpus = "n"\n')
    s = sw.load_sweep(p)
    assert s.cells[0].trace == "csv:../data/t.csv"
    assert s.cells[0].trace_run == f"csv:{sub / '../data/t.csv'}"
    res = sw.run_sweep(s, tmp_path / "out", workers=1, progress=False)
    assert not res.failed
    assert pd.read_csv(tmp_path / "out" / "sweep.csv")["jobs"].tolist() == [2]


@pytest.mark.parametrize("text, field, expect", [
    ('traces = ["synthetic:jobs=5"]\n', "policies", "missing"),
    ('policies = ["tlora"]\n', "traces", "missing"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nseed = [0]\n', "seed", "unknown key"),
    ('traces = "synthetic:jobs=5"\npolicies = ["tlora"]\n', "traces", "expected a list"),
    ('traces = []\npolicies = ["tlora"]\n', "traces", "non-empty"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["nope"]\n', "policies[0]", "unknown policy"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora", "tlora"]\n', "policies[1]", "duplicate"),
    ('traces = ["bogus:x"]\npolicies = ["tlora"]\n', "traces[0]", "unknown trace format"),
    ('traces = ["itp:no/such/file.csv.gz"]\npolicies = ["tlora"]\n', "traces[0]", "does not exist"),
    ('traces = ["synthetic:jobs=0"]\npolicies = ["tlora"]\n', "traces[0]", "jobs"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nclusters = ["16x8"]\n', "clusters[0]", "NODESxGPUSxTYPE"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nclusters = ["2x8xB300"]\n', "clusters[0]", "GPU type"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nseeds = [0, -1]\n', "seeds[1]", "integer >= 0"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nseeds = [true]\n', "seeds[0]", "integer >= 0"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nregroup_pause_s = [-1.0]\n', "regroup_pause_s[0]", ">= 0"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nregroup_pause_s = [30, 30.0]\n', "regroup_pause_s[1]",
     "duplicate"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\ncost_models = ["profiledx"]\n', "cost_models[0]",
     "expected one of: auto, profiled, roofline"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nlora_dists = ["nope"]\n', "lora_dists[0]",
     "unknown LoRA distribution"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\n[policy_options.mlora]\nconcurrency_num = 2\n',
     "policy_options.mlora", "not in policies"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\n[policy_options.tlora]\nnope = 2\n',
     "policy_options.tlora.nope", "no option"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["mlora"]\n[policy_options.mlora]\nconcurrency_num = "x"\n',
     "policy_options.mlora.concurrency_num", "number"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\nstrict = "yes"\n', "strict", "true or false"),
    ('traces = ["synthetic:jobs=5"]\npolicies = ["tlora"]\ntime_unit = "d"\n', "time_unit", "expected one of"),
    ('traces = ["csv:x.csv"]\npolicies = ["tlora"]\n', "traces[0]", "csv_columns"),
])
def test_bad_sweep_names_file_and_field(tmp_path, text, field, expect, reliability):
    p = write_toml(tmp_path, text)
    with pytest.raises(InputError) as e:
        sw.load_sweep(p)
    assert e.value.file == str(p)
    assert e.value.field == field
    assert expect in e.value.message
    assert str(p) in str(e.value) and f"field '{field}'" in str(e.value)
    reliability("bad_inputs")


def test_bad_toml_syntax_and_missing_file(tmp_path):
    p = write_toml(tmp_path, 'traces = ["synthetic:jobs=5"\npolicies = ["tlora"]\n')
    with pytest.raises(InputError, match="invalid TOML") as e:
        sw.load_sweep(p)
    assert e.value.file == str(p)
    with pytest.raises(InputError, match="cannot read") as e:
        sw.load_sweep(tmp_path / "missing.toml")
    assert e.value.file == str(tmp_path / "missing.toml")


# ---- running -----------------------------------------------------------------------------------------
def test_rows_resume_and_rerun_of_a_deleted_cell(tmp_path, monkeypatch):
    p, out = basic(tmp_path), tmp_path / "out"
    res = run(p, out)
    assert (res.total, res.skipped, res.ran, res.failed) == (8, 0, 8, {})
    table = pd.read_csv(out / "sweep.csv", dtype={"cell_id": str})
    cells = {c.cell_id: c for c in sw.load_sweep(p).cells}
    assert sorted(table["cell_id"]) == table["cell_id"].tolist() == sorted(cells)
    assert table.columns[:len(sw.INPUT_COLUMNS) + 1].tolist() == ["cell_id", *sw.INPUT_COLUMNS]
    for _, r in table.iterrows():
        c = cells[r["cell_id"]]
        assert (r["trace"], r["cluster"], r["policy"], r["seed"]) == (c.trace, c.cluster, c.policy, c.seed)
        summary = json.loads((out / "cells" / r["cell_id"] / "summary.json").read_text())
        assert r["jobs"] == summary["jobs"]
        assert r["avg_jct_s"] == pytest.approx(summary["avg_jct_s"], rel=1e-15)
        assert r["skipped"] == sum(summary["skipped"].values())
    assert "wall_s" not in table.columns  # perf.json is machine-dependent and stays out of the row
    assert not (out / "failed.csv").exists()
    assert len(json.loads((out / "sweep.json").read_text())["cells"]) == 8
    before = (out / "sweep.csv").read_bytes()

    # Nothing left: a re-run runs no cell and writes the same bytes.
    calls = []
    real = sw.run_cell
    monkeypatch.setattr(sw, "run_cell", lambda cell, d: calls.append(cell.cell_id) or real(cell, d))
    res = run(p, out)
    assert (res.skipped, res.ran, calls) == (8, 0, [])
    assert (out / "sweep.csv").read_bytes() == before

    # Delete one cell's outputs: only that cell runs again, and the table comes back identical.
    victim = sorted(cells)[3]
    for f in (out / "cells" / victim).iterdir():
        f.unlink()
    res = run(p, out)
    assert (res.skipped, res.ran, calls) == (7, 1, [victim])
    assert (out / "sweep.csv").read_bytes() == before

    # A cell with config.json but no summary.json (killed mid-run) is not finished.
    (out / "cells" / victim / "summary.json").unlink()
    assert len(pd.read_csv(out / "sweep.csv")) == 8  # the table is only rewritten by a run
    res = run(p, out)
    assert res.ran == 1 and (out / "sweep.csv").read_bytes() == before


def test_interrupted_sweep_keeps_finished_cells(tmp_path, monkeypatch):
    p, out = basic(tmp_path), tmp_path / "out"
    real = sw.run_cell
    n = {"calls": 0}

    def dies_on_fourth(cell, d):
        n["calls"] += 1
        if n["calls"] == 4:
            Path(d).mkdir(parents=True, exist_ok=True)
            (Path(d) / "config.json").write_text("{}")  # a half-written cell
            raise KeyboardInterrupt
        return real(cell, d)

    monkeypatch.setattr(sw, "run_cell", dies_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        run(p, out)
    assert len(pd.read_csv(out / "sweep.csv")) == 3
    monkeypatch.setattr(sw, "run_cell", real)
    res = run(p, out)
    assert (res.skipped, res.ran) == (3, 5)
    assert len(pd.read_csv(out / "sweep.csv")) == 8


def test_failing_cell_is_recorded_and_others_finish(tmp_path, monkeypatch, capsys):
    p, out = basic(tmp_path), tmp_path / "out"
    real = sw.run_cell
    bad = sorted(c.cell_id for c in sw.load_sweep(p).cells)[2]

    def flaky(cell, d):
        if cell.cell_id == bad:
            from tlora_sim.sim.core.invariants import InvariantError

            try:
                raise InvariantError("t=1.0s: group 3 overfills GPU memory")
            except InvariantError as e:
                return {"ok": False, "error": type(e).__name__, "message": str(e)}
        return real(cell, d)

    monkeypatch.setattr(sw, "run_cell", flaky)
    res = run(p, out)
    assert list(res.failed) == [bad] and res.ran == 8
    failed = pd.read_csv(out / "failed.csv", dtype={"cell_id": str})
    assert failed.columns.tolist() == sw.FAILED_COLUMNS
    assert failed["cell_id"].tolist() == [bad] and failed["error"].tolist() == ["InvariantError"]
    assert "overfills" in failed["message"].iat[0]
    assert bad not in pd.read_csv(out / "sweep.csv", dtype={"cell_id": str})["cell_id"].tolist()
    # the next invocation retries it; success clears failed.csv
    monkeypatch.setattr(sw, "run_cell", real)
    res = run(p, out)
    assert (res.ran, res.failed) == (1, {}) and not (out / "failed.csv").exists()


def test_real_error_in_a_cell_does_not_stop_the_sweep(tmp_path):
    # lora_dists JSON that exists at parse time but becomes invalid before the run: an InputError in the cell
    dist = tmp_path / "d.json"
    dist.write_text(json.dumps({"name": "d", "ranks": {"8": 1.0}}))
    p = write_toml(tmp_path, f'traces = ["{SYN}"]\npolicies = ["independent-backfill", "mlora"]\nclusters = ["2x8xH100"]\n'
                             'lora_dists = ["tlora", "d.json"]\n')
    s = sw.load_sweep(p)
    dist.write_text("{not json")
    res = sw.run_sweep(s, tmp_path / "out", workers=2, progress=False)
    assert res.ran == 4 and len(res.failed) == 2
    f = pd.read_csv(tmp_path / "out" / "failed.csv")
    assert set(f["error"]) == {"InputError"} and set(f["lora_dist"]) == {"d.json"}
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == 2


def test_local_pool_matches_in_process(tmp_path):
    p = basic(tmp_path)
    run(p, tmp_path / "a", workers=1)
    run(p, tmp_path / "b", workers=2)
    assert (tmp_path / "a" / "sweep.csv").read_bytes() == (tmp_path / "b" / "sweep.csv").read_bytes()


def test_cli_module_exit_status_and_sigkill_resume(tmp_path):
    """Run the sub-command in a child, SIGKILL it once a cell has finished, resume: nothing finished is lost."""
    p = write_toml(tmp_path, f'traces = ["{SYN}", "{SYN2}", "synthetic:jobs=60,seed=3"]\nclusters = ["2x8xH100"]\n'
                             'policies = ["independent-backfill", "mlora", "tlora"]\nseeds = [0, 1]\n')
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tlora_sim.sim.experiments.sweep", str(p), "--out", str(out), "--workers", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if (out / "sweep.csv").is_file() and len(pd.read_csv(out / "sweep.csv")) >= 2:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = pd.read_csv(out / "sweep.csv", dtype={"cell_id": str})
    assert len(kept) >= 2
    assert all((out / "cells" / c / "summary.json").is_file() for c in kept["cell_id"])
    # a cell is finished once its summary.json exists; the kill may land between that and the sweep.csv rewrite
    finished = len([p for p in (out / "cells").glob("*/summary.json") if not p.parent.name.startswith(".")])
    assert finished >= len(kept)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{finished} already finished" in done.stdout or finished == 18
    final = pd.read_csv(out / "sweep.csv", dtype={"cell_id": str})
    assert len(final) == 18 and set(kept["cell_id"]) <= set(final["cell_id"])
    # a bad file: exit status 2 and one line naming the file
    bad = write_toml(tmp_path, "traces = [1]\npolicies = ['tlora']\n", name="bad.toml")
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.experiments.sweep", str(bad), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "traces[0]" in r.stderr and "Traceback" not in r.stderr


def test_backend_and_lock_errors(tmp_path):
    s = sw.load_sweep(basic(tmp_path))
    with pytest.raises(InputError, match="backend"):
        sw.run_sweep(s, tmp_path / "o", backend="slurm")
    with pytest.raises(InputError, match="--backend ray"):
        sw.run_sweep(s, tmp_path / "o", address="127.0.0.1:6379")
    with SweepLock(tmp_path / "o"):
        with pytest.raises(InputError, match="another sweep"):
            sw.run_sweep(s, tmp_path / "o", workers=1, progress=False)


def test_ray_backend_matches_local(tmp_path):
    ray = pytest.importorskip("ray")
    p = basic(tmp_path)  # 8 cells
    run(p, tmp_path / "local", workers=2)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        res = run(p, tmp_path / "ray", backend="ray")
    finally:
        if started:
            ray.shutdown()
    assert (res.ran, res.failed) == (8, {})
    assert (tmp_path / "ray" / "sweep.csv").read_bytes() == (tmp_path / "local" / "sweep.csv").read_bytes()
    for c in sw.load_sweep(p).cells:  # the driver wrote every file the task produced
        for name in ("config.json", "jobs.csv", "timeline.csv", "summary.json", "perf.json"):
            assert (tmp_path / "ray" / "cells" / c.cell_id / name).is_file()
        assert ((tmp_path / "ray" / "cells" / c.cell_id / "jobs.csv").read_bytes()
                == (tmp_path / "local" / "cells" / c.cell_id / "jobs.csv").read_bytes())


def test_ray_backend_gives_the_local_rows_on_a_100_cell_sweep(tmp_path, reliability):
    """Issue 6's target as ``bench/sweep_ray.py`` measures it: 100 cells, local pool vs a local
    two-CPU Ray, byte-identical ``sweep.csv`` and every cell's ``jobs.csv``."""
    pytest.importorskip("ray")
    script = Path(__file__).resolve().parents[2] / "bench" / "sweep_ray.py"
    res = tmp_path / "result.json"
    r = subprocess.run([sys.executable, str(script), "--out-dir", str(tmp_path / "s"), "--results", str(res)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(res.read_text())
    assert (out["cells"], out["local_ran"], out["ray_ran"], out["failed"]) == (100, 100, 100, 0)
    assert out["same_sweep_csv"] and out["same_jobs_csv_every_cell"]
    rows = (tmp_path / "s" / "ray" / "sweep.csv").read_text().splitlines()
    assert len(rows) == 101
    reliability("determinism_cases", 100)
