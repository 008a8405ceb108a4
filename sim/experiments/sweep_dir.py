"""A sweep's directory, checked: what ``--out`` may be, and the files of earlier invocations read
back (issue 45: a sweep reads its own files with checks, naming file, row and field).

``check_sweep_out`` accepts an absent or empty directory or a sweep's (``sweep.json``,
``sweep.csv`` or ``cells/``) and refuses a file, another run's directory and an unwritable place;
``read_cell_summary`` reads a finished cell's ``summary.json`` (a cut or edited one is one line
saying how to run the cell again); ``remove_stale_stages`` drops what a SIGKILLed sweep left.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tlora_sim.traces.errors import InputError


NUMBER_MAPS = ("skipped", "extrapolated_gpu_time_share")
"""Fields of a cell's ``summary.json`` that map names to numbers (counts, shares)."""


def read_cell_summary(path: str | Path) -> dict:
    """A finished cell's ``summary.json``, checked: a JSON object whose values are numbers,
    strings, booleans, None, lists or objects (as ``replay`` writes it); the fields of
    :data:`NUMBER_MAPS` map names to numbers.

    Raises:
        InputError: the file cannot be read, is not valid JSON (cut short, or edited), is not an
            object, or a field has a value of the wrong kind; names the file and field, and says
            how to run the cell again.
    """
    path = Path(path)
    again = f"delete {path.parent} to run the cell again"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the cell's summary ({getattr(e, 'strerror', None) or e}); {again}",
                         file=str(path)) from None
    try:
        summary = json.loads(text)
    except ValueError as e:
        raise InputError(f"not valid JSON (cut short?): {e}; {again}", file=str(path)) from None
    if not isinstance(summary, dict):
        raise InputError(f"expected a JSON object, got {type(summary).__name__}; {again}", file=str(path))
    for key, val in summary.items():
        if isinstance(val, dict) and key in NUMBER_MAPS:
            bad = [k for k, v in val.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
            if bad:
                raise InputError(f"expected numbers, got {val[bad[0]]!r} at {bad[0]!r}; {again}", file=str(path),
                                 field=key)
        elif not (val is None or isinstance(val, (int, float, str, bool, list, dict))):
            raise InputError(f"unexpected value {val!r}; {again}", file=str(path), field=key)
    if "skipped" in summary and not isinstance(summary["skipped"], dict):
        raise InputError(f"expected an object of counts, got {summary['skipped']!r}; {again}", file=str(path),
                         field="skipped")
    return summary


def remove_stale_stages(out: Path) -> None:
    """Remove the staging directories (``cells/.ID.stage-*``, ``cells/.ID.old-*``) and lock files
    a SIGKILLed sweep left; called with the sweep's lock held, so no other run is using them."""
    cells = out / "cells"
    if not cells.is_dir():
        return
    for p in cells.iterdir():
        if p.name.startswith(".") and (".stage-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)


SWEEP_MARKERS = ("sweep.json", "sweep.csv", "cells")
"""Entries of which at least one marks a directory as a sweep's (``sweep.json`` is written first)."""


def check_sweep_out(out_dir: str | Path) -> Path:
    """Check that ``out_dir`` may hold this sweep, and create it: absent, empty, or a sweep
    directory (it has ``sweep.json``, ``sweep.csv`` or ``cells/``; the sweep resumes there).

    Raises:
        InputError: ``out_dir`` is a file, a directory of something else (a replay's run directory,
            a comparison: a sweep never mixes its cells into another run), or cannot be created
            (a read-only file system, ``/proc``); one line naming it.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--out is an existing file, not a directory", file=str(out), field="--out")
    if out.is_dir():
        try:
            names = {p.name for p in out.iterdir()}
        except OSError as e:
            raise InputError(f"cannot list the directory ({e.strerror})", file=str(out), field="--out") from None
        visible = {n for n in names if not n.startswith(".")}
        if visible and not visible & set(SWEEP_MARKERS):
            raise InputError("--out holds files that are not a sweep's (no sweep.json); choose another directory",
                             file=str(out), field="--out")
        if "sweep.json" in names:
            _check_sweep_json(out / "sweep.json")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".probe-", delete=True)
        probe.close()
    except OSError as e:
        raise InputError(f"cannot create or write the directory ({e.strerror or type(e).__name__})",
                         file=str(out), field="--out") from None
    return out


def _check_sweep_json(path: Path) -> None:
    """``sweep.json`` of an earlier invocation reads back as a JSON object, or is one line's error."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"not a readable sweep description ({e}); delete it to resume, or choose another --out",
                         file=str(path)) from None
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}", file=str(path))
