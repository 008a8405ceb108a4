"""``tlora-sim sweep SWEEP.toml --out DIR``: replay the cross product of traces, clusters, policies,
seeds and cost-model options, one run directory per cell, one row per cell in ``DIR/sweep.csv``.

SWEEP.toml (every key is checked; an unknown key is an error; each key is a field of the experiment
spec, ``sim/experiments/spec.py``, read through it: docs/experiments.md lists them)::

    traces = ["itp:../shared/traces/msr-itp-elasticflow/cluster02.csv.gz", "synthetic:jobs=2000,seed=1"]
    clusters = ["16x8xH100"]            # optional, default ["16x8xH100"]
    policies = ["independent", "tlora"]
    seeds = [0, 1]                      # optional, default [0]
    lora_dists = ["tlora"]              # optional, default ["tlora"] (names or JSON files)
    regroup_pause_s = [30.0]            # optional, default [30.0]
    cost_models = ["auto"]              # optional, default ["auto"] (see sim/costmodel/factory.py COST_MODELS)
    disciplines = ["default"]           # optional: default, shared, native (policies/discipline.py)
    reference = "independent-backfill"  # optional: the reference baseline, added to policies when absent
    # optional, the same for every cell: strict = false, time_unit = "s", [csv_columns] submit = "...",
    # time_zone = "...", slurm_states = "..." -- reader options reach only the traces whose format takes
    # them (traces/registry.py); one that fits no trace of the sweep is refused before any cell runs
    # artifact = "calibrated_h200.json"  # optional: a cost-model artifact file (costmodel calibrate)
    windows = ["0,604800"]              # optional trace cuts, each an axis (--window, --first-jobs,
    first_jobs = [2000]                 # --arrival-scale; every reader takes them: traces/window.py)
    arrival_scales = [1.0, 1.5]

    [policy_options.tlora]              # overrides of one policy's config (policy must be listed)
    max_group_size = 8
    ordering = ["urgency", "backfill"]  # a list is an axis: one cell per value (cross product of lists)

Relative paths (trace files, LoRA distribution JSON files) are resolved against the directory of
SWEEP.toml, so a sweep file runs the same from any working directory. The ``trace`` column of
``sweep.csv`` and the cell id keep the spec as written.

Cells and outputs:

* a cell is one combination; its id is the first 16 hex digits of the SHA-256 of its canonical
  inputs (JSON, keys sorted), so it is stable across runs, machines and the order of the lists;
* ``DIR/cells/<id>/`` is the cell's run directory (``tlora_sim.sim.experiments.replay.replay``; no figures);
* a cell is finished iff ``DIR/cells/<id>/summary.json`` exists; finished cells are skipped, so a
  killed sweep resumes where it stopped and loses no finished cell;
* ``DIR/sweep.csv``: one row per finished cell, sorted by ``cell_id`` (independent of completion
  order): ``cell_id``, the inputs (``INPUT_COLUMNS``) and the summary metrics (``summary.json``;
  ``skipped`` is the total and ``skipped.<reason>`` each count). Rewritten atomically after every
  finished cell;
* ``DIR/failed.csv``: cells that raised in this invocation (error type and message); they do not stop
  the others and are retried by the next invocation. The exit status is 1 when any cell failed;
* ``DIR/sweep.json``: the sweep as parsed and every cell's id and inputs.

Backends: ``local`` (default): worker processes (``--workers N``, default the CPU count; 1 runs the
cells in this process). ``ray``: cells as Ray tasks (1 CPU each) on the cluster at ``--address``
(``ray.init(address=...)``), or on a local Ray started with ``num_cpus`` = ``--workers`` (default the
CPU count) when no address is given and Ray is not already initialised. A task simulates into a
temporary directory on its worker and returns the files; the driver writes them, so workers need
tlora-sim installed and the trace files at the same absolute paths, but no shared output directory.
Both backends write the same bytes.

Changing the code does not invalidate finished cells: use a fresh DIR (or delete ``cells/<id>``) to
re-run them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from tlora_sim.traces.errors import InputError
from tlora_sim.sim.runtime.outlock import SweepLock
from tlora_sim.sim.experiments.sweep_dir import check_sweep_out, read_cell_summary, remove_stale_stages
from tlora_sim.sim.experiments.sweep_file import Cell, FAILED_COLUMNS, INPUT_COLUMNS, Sweep, load_sweep


# ---- one cell --------------------------------------------------------------------------------------
def replay_config(cell: Cell):
    """The experiment spec a cell runs (``spec.ExperimentSpec``): its paths resolved, its synthetic
    trace seeded (``seeds.seed_spec``) and its discipline's options merged under its own."""
    from tlora_sim.sim.experiments.replay import policy_options_with_discipline
    from tlora_sim.sim.experiments.seeds import seed_spec
    from tlora_sim.sim.experiments.spec import ExperimentSpec

    return ExperimentSpec(
        trace=seed_spec(cell.trace_run, cell.seed), policy=cell.policy, cluster=cell.cluster, seed=cell.seed,
        lora_dist=cell.lora_dist_run, regroup_pause_s=cell.regroup_pause_s, cost_model=cell.cost_model,
        policy_options=policy_options_with_discipline(cell.policy, cell.discipline, dict(cell.policy_options)),
        csv_columns=dict(cell.csv_columns) if cell.csv_columns is not None else None, time_unit=cell.time_unit,
        strict=cell.strict, policy_modules=cell.policy_modules, time_zone=cell.time_zone,
        slurm_states=cell.slurm_states, window=cell.window, first_jobs=cell.first_jobs,
        arrival_scale=cell.arrival_scale, discipline=cell.discipline, reference=cell.reference,
        artifact=cell.artifact_run or None)


def run_cell(cell: Cell, out_dir: str) -> dict:
    """Replay ``cell`` into ``out_dir``; returns ``{"ok": bool, "error": type name, "message": str}``.

    Input and invariant errors (and any other exception) are returned, not raised, so one bad cell
    does not stop the sweep; KeyboardInterrupt propagates.
    """
    from tlora_sim.sim.experiments.replay import replay

    out = Path(out_dir)
    try:
        for tmp in out.glob(".*.tmp") if out.is_dir() else ():  # leftovers of a SIGKILLed run
            tmp.unlink(missing_ok=True)
        replay(replay_config(cell), out, progress=False, plots=False, force=True)  # the sweep owns its cells
        return {"ok": True, "error": "", "message": ""}
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the sweep goes on
        from tlora_sim.sim.core.invariants import InvariantError

        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not isinstance(e, (InputError, InvariantError)):
            msg += " (traceback in error.txt)"
            try:
                out.mkdir(parents=True, exist_ok=True)
                (out / "error.txt").write_text(traceback.format_exc())
            except OSError:
                pass
        return {"ok": False, "error": type(e).__name__, "message": msg}


def _run_cell_files(cell: Cell) -> dict:
    """Ray task body: replay ``cell`` into a temporary directory and return its files' bytes."""
    with tempfile.TemporaryDirectory(prefix="tlora-sweep-") as tmp:
        res = run_cell(cell, tmp)
        files = {}
        for p in sorted(Path(tmp).rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                files[p.relative_to(tmp).as_posix()] = p.read_bytes()
        return {**res, "files": files}


def _write_cell_files(out: Path, files: dict[str, bytes]) -> None:
    """Write a cell's files atomically, ``summary.json`` (the finished marker) last."""
    from tlora_sim.sim.runtime.atomic import atomic_write

    for name in sorted(files, key=lambda n: (n == "summary.json", n)):
        data = files[name]
        atomic_write(out / name, lambda p, d=data: p.write_bytes(d))


# ---- the sweep ---------------------------------------------------------------------------------------
def cell_dir(out_dir: str | Path, cell: Cell) -> Path:
    """``DIR/cells/<id>``."""
    return Path(out_dir) / "cells" / cell.cell_id


def is_finished(out_dir: str | Path, cell: Cell) -> bool:
    """A cell is finished iff its ``summary.json`` exists."""
    return (cell_dir(out_dir, cell) / "summary.json").is_file()


def cell_row(out_dir: str | Path, cell: Cell) -> dict:
    """``sweep.csv`` row of a finished cell: id, inputs, then the summary metrics.

    Raises:
        InputError: a ``summary.json`` that does not read back (``sweep_dir.read_cell_summary``).
    """
    summary = read_cell_summary(cell_dir(out_dir, cell) / "summary.json")
    row: dict[str, Any] = {"cell_id": cell.cell_id, **cell.inputs_row()}
    for key, val in summary.items():
        if key in row or key in ("policy", "trace", "cluster", "seed"):
            continue
        if isinstance(val, dict):
            if key == "skipped":
                row["skipped"] = sum(val.values())
            for sub, v in sorted(val.items()):
                row[f"{key}.{sub}"] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
        elif isinstance(val, list):
            row[key] = json.dumps(val)
        else:
            row[key] = val
    if "skipped" in summary and "skipped" not in row:
        row["skipped"] = 0
    return row


def write_table(out_dir: str | Path, rows: Iterable[dict]) -> Path:
    """Write ``DIR/sweep.csv`` atomically: rows sorted by ``cell_id``, columns in a fixed order
    (id, inputs, ``metrics.SUMMARY_KEYS``, then the other metric names sorted)."""
    import pandas as pd

    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.report.rundir import write_csv
    from tlora_sim.sim.report.rundir_layout import RunDir

    rows = sorted(rows, key=lambda r: r["cell_id"])
    first = ["cell_id", *INPUT_COLUMNS]
    keys = {k for r in rows for k in r}
    lead = first + [k for k in metrics.SUMMARY_KEYS if k in keys]
    cols = lead + sorted(keys - set(lead))
    return write_csv(Path(out_dir) / RunDir.SWEEP_TABLE, pd.DataFrame(rows, columns=cols))


def _write_failed(out_dir: Path, failed: dict[str, dict]) -> None:
    import pandas as pd

    from tlora_sim.sim.report.rundir import write_csv

    path = out_dir / "failed.csv"
    if not failed:
        path.unlink(missing_ok=True)
        return
    write_csv(path, pd.DataFrame([failed[k] for k in sorted(failed)], columns=FAILED_COLUMNS))


@dataclass
class SweepResult:
    """What :func:`run_sweep` did: cells in total, skipped (finished before), run now, failed."""

    total: int
    skipped: int
    ran: int
    failed: dict[str, dict]
    table: Path


def run_sweep(sweep: Sweep, out_dir: str | Path, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool = True) -> SweepResult:
    """Run every unfinished cell of ``sweep`` into ``out_dir`` (see the module docstring).

    Args:
        sweep: from :func:`load_sweep`.
        out_dir: DIR.
        backend: ``local`` or ``ray``.
        workers: local worker processes (default: CPU count; 1 = in this process), or the CPUs of a
            local Ray started here.
        address: Ray cluster address (``ray`` backend only); None starts a local Ray unless one is
            already initialised in this process.
        progress: a tqdm bar over cells on stderr.

    Raises:
        InputError: unknown backend, Ray not installed, ``address`` without the ray backend, another
            sweep running in ``out_dir``.
        KeyboardInterrupt: interrupted; finished cells and their rows are kept.
    """
    from tlora_sim.sim.report.rundir import write_json

    if backend not in ("local", "ray"):
        raise InputError(f"unknown backend {backend!r}; expected local or ray", field="--backend")
    if address is not None and backend != "ray":
        raise InputError("--address needs --backend ray", field="--address")
    if workers is not None and workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}", field="--workers")
    out = check_sweep_out(out_dir)
    with SweepLock(out):
        remove_stale_stages(out)
        write_json(out / "sweep.json", sweep.describe())
        done = [c for c in sweep.cells if is_finished(out, c)]
        todo = [c for c in sweep.cells if not is_finished(out, c)]
        rows = {c.cell_id: cell_row(out, c) for c in done}
        table = write_table(out, rows.values())
        failed: dict[str, dict] = {}
        _write_failed(out, failed)
        bar = _bar(len(sweep.cells), len(done), progress)

        def finished(cell: Cell, res: dict) -> None:
            if res["ok"] and is_finished(out, cell):
                rows[cell.cell_id] = cell_row(out, cell)
                write_table(out, rows.values())
            else:
                failed[cell.cell_id] = {"cell_id": cell.cell_id, **cell.inputs_row(),
                                        "error": res.get("error") or "Error",
                                        "message": res.get("message") or "no summary.json written"}
                _write_failed(out, failed)
            if bar is not None:
                bar.update(1)
                if failed:
                    bar.set_postfix(failed=len(failed), refresh=False)

        try:
            if todo:
                if backend == "ray":
                    _run_ray(todo, out, finished, address, workers)
                else:
                    _run_local(todo, out, finished, workers or os.cpu_count() or 1)
        finally:
            if bar is not None:
                bar.close()
    return SweepResult(len(sweep.cells), len(done), len(todo), failed, table)


def _bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="cell", desc="sweep", file=sys.stderr, dynamic_ncols=True,
                smoothing=0.1)


def _run_local(todo: list[Cell], out: Path, finished: Callable[[Cell, dict], None], workers: int) -> None:
    from tlora_sim.sim.runtime.pool import run_tasks

    run_tasks(run_cell, [(c, str(cell_dir(out, c))) for c in todo], workers,
              lambda i, res: finished(todo[i], res), order=lambda i: todo[i].cell_id)


def _run_ray(todo: list[Cell], out: Path, finished: Callable[[Cell, dict], None], address: str | None,
             workers: int | None) -> None:
    try:
        import ray
    except ImportError:
        raise InputError('the ray backend needs Ray: pip install "tlora-sim[ray]"', field="--backend") from None
    started = False
    if address is not None:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        started = True
    elif not ray.is_initialized():
        ray.init(num_cpus=workers or os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
        started = True
    task = ray.remote(num_cpus=1)(_run_cell_files)
    refs: dict = {}
    try:
        refs = {task.remote(c): c for c in todo}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in ready:
                cell = refs.pop(ref)
                try:
                    res = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a task that died (worker lost, OOM)
                    res = {"ok": False, "error": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
                if res.get("files"):
                    _write_cell_files(cell_dir(out, cell), res["files"])
                finished(cell, res)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


# ---- command line --------------------------------------------------------------------------------
def add_sweep_parser(subparsers) -> None:
    """Add the ``sweep`` sub-command to ``tlora-sim``'s ``add_subparsers()`` object."""
    import argparse

    s = subparsers.add_parser(
        "sweep", help="replay the cross product of traces, clusters, policies, seeds and options (resumable)",
        description="Replay every cell of SWEEP.toml (cross product of traces, clusters, policies, seeds, "
                    "lora_dists, regroup_pause_s, cost_models). Writes DIR/cells/<id>/ run directories, "
                    "DIR/sweep.csv (one row per finished cell, sorted by cell id), DIR/failed.csv and "
                    "DIR/sweep.json. Finished cells (summary.json present) are skipped, so an interrupted "
                    "sweep resumes. Exit status 1 when any cell failed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("sweep_file", type=Path, metavar="SWEEP.toml",
                   help="the sweep definition (docs/examples/sweep.toml); or the word 'report' followed by a sweep "
                        "DIR: aggregate its cells over seeds into DIR/report.csv and a figure")
    s.add_argument("report_dir", type=Path, nargs="?", metavar="DIR", help=argparse.SUPPRESS)
    from tlora_sim.sim.experiments.spec import add_flags

    add_flags(s, "sweep")  # --out, --backend, ... from spec.SweepOptions


def run_sweep_command(args) -> int:
    """Run ``tlora-sim sweep``; returns the exit status (0 all cells finished, 1 some failed).

    Raises:
        InputError: bad sweep file or options (the CLI prints one line and exits 2).
    """
    if str(args.sweep_file) == "report" and not args.sweep_file.is_file():
        from tlora_sim.sim.report.sweep_report import plot_sweep

        if args.report_dir is None:
            raise InputError("usage: tlora-sim sweep report DIR", field="DIR")
        files = plot_sweep(args.report_dir, plots=not getattr(args, "no_plots", False))
        print(f"wrote {Path(args.report_dir) / 'report.csv'}" + "".join(f"\n{p}" for p in files))
        return 0
    if args.out is None:
        raise InputError("--out is required to run a sweep", field="--out")
    sweep = load_sweep(args.sweep_file)
    if args.dry_run:
        for c in sweep.cells:
            state = "done" if is_finished(args.out, c) else "todo"
            print(c.cell_id, state, json.dumps(c.inputs_row(), sort_keys=False), sep="\t")
        return 0
    t0 = time.perf_counter()
    res = run_sweep(sweep, args.out, backend=args.backend, workers=args.workers, address=args.address,
                    progress=not args.no_progress)
    ok = res.ran - len(res.failed)
    print(f"sweep: {res.total} cells: {res.skipped} already finished, {ok} ran, {len(res.failed)} failed "
          f"({time.perf_counter() - t0:.1f} s) -> {res.table}")
    if res.failed:
        for row in list(res.failed.values())[:5]:
            print(f"  failed {row['cell_id']} ({row['policy']}, {row['trace']}): {row['error']}: {row['message']}",
                  file=sys.stderr)
        print(f"  all failures: {Path(args.out) / 'failed.csv'}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tlora_sim.sim.experiments.sweep SWEEP.toml --out DIR ...``: the sub-command without the rest of the CLI."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tlora_sim.sim.experiments.sweep")
    sub = ap.add_subparsers(dest="command", required=True)
    add_sweep_parser(sub)
    args = ap.parse_args(["sweep", *(sys.argv[1:] if argv is None else argv)])
    from tlora_sim.sim.runtime.signals import signals_raise_interrupt
    from tlora_sim.sim.runtime.outlock import release_all_out_locks

    try:
        with signals_raise_interrupt():  # SIGTERM/SIGHUP unwind like Ctrl-C: exit 128 + the signal
            return run_sweep_command(args)
    except InputError as e:
        print(f"tlora-sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("tlora-sim: interrupted; finished cells are kept, re-run to resume", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)
    finally:
        release_all_out_locks()


if __name__ == "__main__":
    sys.exit(main())
