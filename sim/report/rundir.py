"""Run-directory files and the run directory as a unit: JSON and CSV writers, the checks of
``--out``, and the staged directory swapped in when a run is done.

Every file is written atomically (``runtime.atomic.atomic_write``: a temp file renamed onto its
target), so a run interrupted at any point leaves each file either complete (the previous or the
new version) or absent, never half-written; a directory is built as a unit in a hidden sibling
(:func:`staged_dir`). Signals and their re-delivery, the output-directory lock and write errors
are the process's concerns (``sim/runtime``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

from tlora_sim.sim.runtime.atomic import UMASK, atomic_write
from tlora_sim.sim.runtime.outlock import acquire_out_lock, release_out_lock
from tlora_sim.sim.runtime.signals import signals_held
from tlora_sim.sim.runtime.write_errors import WRITE_ERRNOS, WriteError, write_error
from tlora_sim.traces.errors import InputError


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON (deterministic bytes)."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n"
    return atomic_write(path, lambda p: p.write_text(text))


def write_csv(path: str | Path, df: pd.DataFrame) -> Path:
    """Write ``df`` as CSV without the index (a header row, then one line per row).

    Written by Arrow's C++ CSV writer (``pyarrow.csv.write_csv``), about 10x faster than
    ``DataFrame.to_csv`` on the million-row ``jobs.csv``/``timeline.csv`` of a long trace (float
    formatting was a tenth of such a replay). Every float is written in its shortest round-trip
    form, so ``pd.read_csv`` reads back the very values (a float that is a whole number is written
    without ``.0``, so a column whose every value is whole reads back as integers); booleans
    are ``true``/``false``; missing values are empty; fields are quoted only where needed. A
    frame Arrow cannot type (an object column mixing kinds) is written by pandas instead.
    """
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return atomic_write(path, lambda p: df.to_csv(p, index=False))
    opts = pa_csv.WriteOptions(quoting_style="needed")
    return atomic_write(path, lambda p: pa_csv.write_csv(table, p, write_options=opts))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def check_out_dir(out: str | Path, *, force: bool = False, what: str = "run") -> Path:
    """Check that ``out`` may receive a new run (or comparison) directory, before any work, and
    take its lock (``runtime.outlock.acquire_out_lock``): held until :func:`staged_dir` has swapped the
    finished directory in, so no other run can pass this check for ``out`` in between.

    Args:
        out: the target directory (need not exist).
        force: replace a directory that already holds files.
        what: "run" or "comparison", for the message.

    Returns:
        ``out`` as a Path.

    Raises:
        InputError: ``out`` is an existing file, holds files and ``force`` is False (a previous run
            is never replaced silently), its parent cannot be created or written (a read-only file
            system, ``/proc``), or another run holds its lock (it is being written now).
    """

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out is an existing file, not a directory", file=str(out), field="--out")
    parent = out.resolve().parent
    if parent == out.resolve():
        raise InputError("--out cannot be the root directory", file=str(out), field="--out")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the parent directory ({e.strerror})", file=str(parent),
                         field="--out") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError("the parent directory is not writable", file=str(parent), field="--out")
    acquire_out_lock(out)  # from here to the swap in staged_dir, this process owns out
    try:
        if out.exists() and not out.is_dir():
            raise InputError(f"--out is an existing file, not a directory", file=str(out), field="--out")
        try:
            holds = out.is_dir() and any(out.iterdir())
        except OSError as e:
            raise InputError(f"cannot list the directory ({e.strerror})", file=str(out), field="--out") from None
        if holds and not force:
            kind = "a run" if (out / "summary.json").is_file() or (out / "config.json").is_file() else "files"
            raise InputError(f"--out already holds {kind}; pass --force to replace it, or choose another directory",
                             file=str(out), field="--out")
    except BaseException:
        release_out_lock(out)
        raise
    return out


@contextlib.contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """Build a directory as a unit: yield a temporary sibling (``.NAME.stage-XXXX``) to write into;
    when the block ends normally it replaces ``out`` (the previous contents are removed only after
    the new directory is in place, so nothing of a replaced run survives); on any exception or
    interrupt the sibling is removed and ``out`` is left exactly as it was. Only SIGKILL can leave
    a stray hidden sibling behind; ``out`` is never half-written.

    The lock of ``out`` (taken by :func:`check_out_dir`, or here when the caller did not) is held
    until the swap is done. A write that fails in the sibling (an ``OSError``: no space left, a
    read-only file system, permissions) is raised as one ``InputError`` naming the file as it
    would have been under ``out``. A ``sim.core.policy_call.PolicyError`` (a policy that
    crashed) keeps the sibling, with the traceback in ``error.txt``, for the user to inspect
    (the error's ``traceback_file`` names it) until the next run into ``out`` completes, which
    removes such leftovers.

    Raises:
        InputError: the sibling cannot be created or written, or another run holds the lock.
    """
    import shutil


    out = Path(out)
    stage: str | None = None
    old: str | None = None
    acquire_out_lock(out)
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with signals_held():
                stage = tempfile.mkdtemp(prefix=f".{out.name}.stage-", dir=out.parent)
                os.chmod(stage, 0o777 & ~UMASK)
        except OSError as e:
            raise write_error(e, out.parent) from None
        try:
            yield Path(stage)
        except Exception as e:
            if _keeps_stage(e):
                kept, stage = stage, None
                if getattr(e, "traceback_file", None) is None:  # else a nested stage kept it already
                    _write_traceback(Path(kept), e)
            else:
                _raise_as_write_error(e, Path(stage), out)
            raise
        try:
            with signals_held():  # swap: out -> old, stage -> out, then drop old
                if out.exists():
                    old = tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent)
                    os.rmdir(old)
                    os.replace(out, old)
                try:
                    os.replace(stage, out)
                except OSError:
                    if old is not None:  # put the previous run back before anything is removed
                        try:
                            os.replace(old, out)
                        except OSError:  # never delete the only copy: say where it is
                            kept, old = old, None
                            raise InputError(f"cannot write; the previous run is kept at {kept}",
                                             file=str(out), field="--out") from None
                        old = None
                    raise
                stage = None
        except OSError as e:
            raise write_error(e, out) from None
        _remove_stale_siblings(out)
    finally:
        with signals_held():
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            release_out_lock(out)


def _raise_as_write_error(e: BaseException, stage: Path, out: Path) -> None:
    """Raise ``e`` as a one-line write error naming the path under ``out`` when it is an
    ``OSError`` of writing into ``stage`` (or of the disk), or an ``InputError`` of
    :func:`atomic_write` naming a file in ``stage``; return otherwise."""

    def under_out(name) -> str | None:
        if name is None:
            return None
        text, root = str(name), str(stage)
        if text == root or text.startswith(root + os.sep):
            return str(out) + text[len(root):]
        return None

    if isinstance(e, InputError):
        mapped = under_out(e.file)
        if mapped is not None:
            err = (WriteError if isinstance(e, WriteError) else InputError)(e.message, file=mapped, row=e.row,
                                                                            field=e.field)
            if isinstance(e, WriteError):
                err.errno, err.strerror = e.errno, e.strerror
            raise err from None
        return
    if isinstance(e, OSError):
        name = getattr(e, "filename", None)
        mapped = under_out(name)
        if mapped is not None or (name is None and getattr(e, "errno", None) in WRITE_ERRNOS):  # not a read
            raise write_error(e, mapped if mapped is not None else out) from None


def _remove_stale_siblings(out: Path) -> None:
    """After a successful swap (the lock of ``out`` held): remove the hidden siblings earlier runs
    into ``out`` left (``.NAME.stage-*`` kept after a crashed policy or left by SIGKILL,
    ``.NAME.old-*``); nobody else can be writing them."""
    import re
    import shutil

    ours = re.compile(rf"\.{re.escape(out.name)}\.(stage|old)-[A-Za-z0-9_]{{8}}")  # tempfile's 8 characters
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for p in siblings:
        if ours.fullmatch(p.name) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _keeps_stage(e: BaseException) -> bool:
    """True for an error whose staging directory is kept for inspection: one that carries a
    ``traceback_text`` and a ``traceback_file`` slot (``sim.core.policy_call.PolicyError``, a
    crashed policy; duck-typed: the report layer imports nothing of ``sim/core``)."""
    return bool(getattr(e, "traceback_text", "")) and hasattr(e, "traceback_file")


def _write_traceback(stage: Path, e: BaseException) -> None:
    """Write ``e``'s traceback (the policy's, as the engine caught it) to ``stage/error.txt`` and
    record the path on ``e.traceback_file``; a failure to write leaves ``traceback_file`` None."""
    text = getattr(e, "traceback_text", "") or ""
    try:
        (stage / "error.txt").write_text(text)
        e.traceback_file = str(stage / "error.txt")
    except OSError:
        pass
