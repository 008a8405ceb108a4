"""The common trace table that every reader returns, and its invariants.

Schema (exactly these columns, in this order; one row per job):

=================  =========  ==========================================================
column             dtype      meaning
=================  =========  ==========================================================
``job_id``         str        unique job id (the trace's own id, else the 1-based data row)
``submit_time_s``  float64    submission time in seconds from the trace start; the earliest
                              kept job has 0.0
``duration_s``     float64    traced run time in seconds (> 0)
``num_gpus``       int64      GPUs requested (>= 1)
``tenant``         str        tenant / virtual cluster / job class; ``""`` where the trace has none
=================  =========  ==========================================================

Rows are sorted by (``submit_time_s``, original file order) and the index is a fresh RangeIndex.

Optional LoRA attribute columns read from the trace (``model``, ``rank``, ``seq_len``, ``batch_size``,
``max_slowdown``, ``steps``) may follow, in that order (:mod:`tlora_sim.traces.job_attrs`); their source
columns are in ``attrs["attr_columns"]`` (attribute -> column of the file).

``df.attrs`` carries ``"source"`` (the spec string, e.g. ``"itp:../shared/traces/.../cluster02.csv.gz"``),
``"format"`` (reader name), ``"path"`` (file or directory read; the option string for synthetic traces)
and ``"skipped"`` (dict: reason -> number of rows dropped by a documented rule, see ``traces/README.md``);
``"shift_s"`` is what was subtracted from the submit times. Readers of calendar times also record
``"epoch_s"`` (seconds since 1970-01-01 UTC of the table's 0 s) and ``"time_zone"`` (the zone naive times
were read in), which trace windows given as dates use (:mod:`tlora_sim.traces.window`).
Readers that change a value by a documented rule also record ``"adjusted"`` (dict: rule -> number of kept
rows changed, e.g. ``{"gpus_rounded_up": 2}``); these rows are kept, so they are not in ``skipped``.
Readers of files also record where each row came from, for error messages about a job
(:func:`source_of`): ``"origin"``, an :class:`Origin` (1-based data row in the file of each table
row and, for a merge of several files, the file of each).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.job_attrs import TRACE_ATTRS, check_attr_frame

COLUMNS: tuple[str, ...] = ("job_id", "submit_time_s", "duration_s", "num_gpus", "tenant")
ATTR_KEYS: tuple[str, ...] = ("source", "format", "path", "skipped")


def check_unique_ids(job_id: np.ndarray, rows: np.ndarray, file: str | None) -> None:
    """Raise :class:`InputError` at the first repeated job id.

    Args:
        job_id: job ids as strings, in file order.
        rows: the 1-based data row of each entry (same length).
        file: file named in the error.

    Raises:
        InputError: row = the second occurrence, field ``job_id``; the message names the first one.
    """
    ids = pd.Series(job_id)
    dup = ids.duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.argmax(dup))
        first = int(np.argmax(ids.to_numpy() == ids.iloc[i]))
        raise InputError(f"duplicate job id {ids.iloc[i]!r} (first seen at row {int(rows[first])})",
                         file=file, row=int(rows[i]), field="job_id")


def finish_frame(*, job_id: Any, submit_s: Any, duration_s: Any, num_gpus: Any, tenant: Any,
                 rows: Any, file: str, fmt: str, skipped: Mapping[str, int] | None = None,
                 check_ids: bool = True, files: Any = None,
                 adjusted: Mapping[str, Any] | None = None, attrs: Mapping[str, Any] | None = None,
                 attr_columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Build the common trace table from already-parsed, already-checked columns.

    Applies the shared rules: duplicate ids raise (when ``check_ids``), rows with zero duration are
    dropped and counted in ``skipped["zero_duration"]``, submit times are shifted so the earliest
    kept job is at 0.0 s, rows are stably sorted by submit time.

    Args:
        job_id, submit_s (s), duration_s (s), num_gpus, tenant: equal-length arrays in file order.
        rows: 1-based data row of each entry (for error messages); None for generated traces.
        file: path named in errors and stored in ``attrs["path"]``.
        fmt: reader name for ``attrs["format"]``.
        skipped: counts of rows the reader already dropped (e.g. ``{"duplicate": 3}``).
        check_ids: check job-id uniqueness here (readers that merged files check it themselves).
        files: the file of each entry, for a merge of several files (else every entry is ``file``'s).
        adjusted: rule -> boolean mask (one entry per row) of the rows whose values that rule changed;
            ``attrs["adjusted"]`` gets the count among the kept rows.
        attrs: optional LoRA attribute columns read from the trace (:mod:`tlora_sim.traces.job_attrs`:
            name -> array, same length, ``""``/NaN = not given); ``attr_columns`` their file columns.

    Raises:
        InputError: duplicate job id, or no job left after skipping.
    """
    job_id = np.asarray(job_id, dtype=object).astype(str)
    submit = np.asarray(submit_s, dtype=np.float64)
    duration = np.asarray(duration_s, dtype=np.float64)
    gpus = np.asarray(num_gpus, dtype=np.int64)
    tenant = np.asarray(tenant, dtype=object).astype(str)
    rows = None if rows is None else np.asarray(rows, dtype=np.int64)
    if check_ids:
        check_unique_ids(job_id, rows, file)
    skipped = dict(skipped or {})
    keep = duration > 0
    skipped["zero_duration"] = skipped.get("zero_duration", 0) + int((~keep).sum())
    if not keep.any():
        raise InputError(f"no jobs left: all {len(keep)} rows have zero duration", file=file)
    submit = submit[keep]
    order = np.argsort(submit, kind="stable")
    df = pd.DataFrame({
        "job_id": pd.Series(job_id[keep][order], dtype=str),
        "submit_time_s": submit[order] - submit.min(),
        "duration_s": duration[keep][order],
        "num_gpus": gpus[keep][order],
        "tenant": pd.Series(tenant[keep][order], dtype=str),
    })
    for name in TRACE_ATTRS:
        if attrs and name in attrs:
            col = np.asarray(attrs[name], dtype=object if name == "model" else np.float64)[keep][order]
            df[name] = pd.Series(col, dtype=str) if name == "model" else col
    df.attrs.update({"source": f"{fmt}:{file}", "format": fmt, "path": str(file), "skipped": skipped,
                     "shift_s": float(submit.min())})
    if attrs:
        df.attrs["attr_columns"] = {k: str(v) for k, v in (attr_columns or {}).items() if k in attrs}
    if adjusted is not None:
        df.attrs["adjusted"] = {k: int(np.asarray(m, dtype=bool)[keep].sum()) for k, m in adjusted.items()}
    if rows is not None:
        df.attrs["origin"] = Origin(rows[keep][order],
                                    None if files is None else np.asarray(files, dtype=object)[keep][order])
    return df


class Origin:
    """Where each row of a trace table was read from: ``rows`` (int64, shape (n,): 1-based data row
    in its file) and ``files`` (object, shape (n,): the file of each row, or None when every row
    comes from ``attrs["path"]``). Read-only; a copy of the table's attrs shares it (pandas deep-copies
    attrs on every operation, and copying 10^5 rows each time would cost more than the read)."""

    __slots__ = ("rows", "files")

    def __init__(self, rows: np.ndarray, files: np.ndarray | None = None) -> None:
        self.rows = np.array(rows, dtype=np.int64)
        self.files = None if files is None else np.array(files, dtype=object)
        for a in (self.rows, self.files):
            if a is not None:
                a.flags.writeable = False

    def __len__(self) -> int:
        return len(self.rows)

    def __deepcopy__(self, memo: dict) -> "Origin":
        return self

    def repeat(self, reps: np.ndarray) -> "Origin":
        """Each row repeated ``reps[i]`` times (a table expanded row by row, e.g. into sweeps)."""
        return Origin(np.repeat(self.rows, reps), None if self.files is None else np.repeat(self.files, reps))


def source_of(df: pd.DataFrame, i: int) -> tuple[str | None, int | None]:
    """(file, 1-based data row) that row ``i`` (0-based position) of a trace table was read from,
    for error messages. A table without ``attrs["origin"]`` (generated, or built by hand in file
    order) answers its own position, i + 1; one whose rows no longer line up with it, None."""
    path = df.attrs.get("path")
    origin = df.attrs.get("origin")
    if origin is None:
        return path, i + 1
    if len(origin) != len(df):
        return path, None
    return (path if origin.files is None else str(origin.files[i])), int(origin.rows[i])


def validate_frame(df: pd.DataFrame, path: str | None = None) -> None:
    """Check that ``df`` follows the common trace schema (see the module docstring).

    Args:
        df: a trace table.
        path: file named in the error (defaults to ``df.attrs["path"]``).

    Raises:
        InputError: wrong columns (the five common ones first, then optional attribute columns) or dtypes, no rows, NaN/inf values, submit times not sorted or not
            starting at 0, duration <= 0, num_gpus < 1, repeated job ids, or missing attrs. ``row`` is
            the 1-based row of the table where a row-level rule fails.
    """
    file = path if path is not None else df.attrs.get("path")
    if tuple(df.columns[:len(COLUMNS)]) != COLUMNS:
        raise InputError(f"trace table columns must be {list(COLUMNS)}, got {list(df.columns)}", file=file)
    if len(df) == 0:
        raise InputError("trace has no jobs", file=file)
    check_attr_frame(df, file)
    for col in ("job_id", "tenant"):
        if not pd.api.types.is_string_dtype(df[col]):
            raise InputError(f"column must hold strings, got {df[col].dtype}", file=file, field=col)
    for col, dtype in (("submit_time_s", np.float64), ("duration_s", np.float64), ("num_gpus", np.int64)):
        if df[col].dtype != dtype:
            raise InputError(f"column must be {np.dtype(dtype)}, got {df[col].dtype}", file=file, field=col)
    submit = df["submit_time_s"].to_numpy()
    duration = df["duration_s"].to_numpy()
    gpus = df["num_gpus"].to_numpy()
    checks = [
        ("job_id", df["job_id"].isna().to_numpy(), "missing job id"),
        ("tenant", df["tenant"].isna().to_numpy(), "missing tenant (use '')"),
        ("submit_time_s", ~np.isfinite(submit) | (submit < 0), "submit time must be finite and >= 0"),
        ("duration_s", ~np.isfinite(duration) | (duration <= 0), "duration must be finite and > 0"),
        ("num_gpus", gpus < 1, "num_gpus must be >= 1"),
        ("submit_time_s", np.r_[False, np.diff(submit) < 0], "rows not sorted by submit time"),
        ("job_id", df["job_id"].duplicated().to_numpy(), "duplicate job id"),
    ]
    for field, bad, msg in checks:
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{msg} (value {df[field].iloc[i]!r})", file=file, row=i + 1, field=field)
    if submit[0] != 0.0:
        raise InputError(f"earliest submit time must be 0.0 s, got {submit[0]}", file=file, row=1,
                         field="submit_time_s")
    missing = [k for k in ATTR_KEYS if k not in df.attrs]
    if missing or not isinstance(df.attrs.get("skipped"), dict):
        raise InputError(f"trace attrs must hold {list(ATTR_KEYS)} (skipped: dict); missing {missing}",
                         file=file)
