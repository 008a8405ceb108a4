"""Per-job LoRA attributes read from the trace itself (operators who log them), instead of drawn.

A trace table (``traces.frame``) may carry, after its five common columns, any of these optional
columns (in this order), read by the ``csv`` reader from mapped columns (``--columns ...,model=COL,rank=COL``)
and by the ``slurm`` reader from the job's ``Comment`` (else ``JobName``) field:

================  =========  ===========================================================================
column            dtype      meaning (a missing value: "not in the trace", drawn from ``--lora-dist``)
================  =========  ===========================================================================
``model``         str        base model catalog name (``llama3-8b``); ``""`` = not given
``rank``          float64    LoRA rank r, a whole number >= 1; NaN = not given
``seq_len``       float64    tokens per sequence, whole >= 1
``batch_size``    float64    sequences per optimizer step of the whole job (global batch), whole >= 1
``max_slowdown``  float64    tolerated slowdown while co-located, finite >= 1
``steps``         float64    training steps to run, whole >= 1 (else derived from the traced duration)
================  =========  ===========================================================================

Values are checked where read (file, row and the file's column named in the error); whether a model
name is known is checked when jobs are built, against the cost model's catalog
(:func:`tlora_sim.traces.lora.check_models`). ``df.attrs["attr_columns"]`` maps each attribute to the
column (or ``Comment`` field) it came from.

Slurm pattern: ``key=value`` items separated by ``;`` (spaces around them ignored), keys as above, other
items ignored, e.g. ``sbatch --comment "model=llama3-8b;rank=16;seq_len=2048;batch_size=32"``; a key given
twice in one field is an error.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.tableio import Problem, first

TRACE_ATTRS: tuple[str, ...] = ("model", "rank", "seq_len", "batch_size", "max_slowdown", "steps")
"""Optional LoRA attribute columns of a trace table, in table order."""
INTEGER_ATTRS = frozenset({"rank", "seq_len", "batch_size", "steps"})
_ITEM = re.compile(r"^\s*([A-Za-z_]+)\s*=\s*(.*?)\s*$")


def attr_values(df: pd.DataFrame, key: str, col: str) -> tuple[np.ndarray, list[Problem]]:
    """One attribute column of a string table: ``model`` as str (``""`` where missing), the others as
    float64 (NaN where missing), and the first problem of each rule (not a number, not whole, < 1, not
    finite; model names are not checked here).

    Args:
        df: the table (cells str or NaN).
        key: one of :data:`TRACE_ATTRS`.
        col: the table's column (named in the problems).
    """
    raw = df[col]
    if key == "model":
        return raw.fillna("").astype(str).str.strip().to_numpy(dtype=object), []
    text = raw.astype(object).where(raw.notna(), None)
    blank = text.map(lambda v: v is None or str(v).strip() == "").to_numpy(dtype=bool)
    values = pd.to_numeric(text.where(~blank, None), errors="coerce").to_numpy(dtype=np.float64, copy=True)
    values[blank] = np.nan
    bad = np.isnan(values) & ~blank
    with np.errstate(invalid="ignore"):
        problems = [first(bad, col, "not a number", raw),
                    first(~np.isfinite(values) & ~np.isnan(values), col, "not a finite number", raw),
                    first(values < 1, col, f"{key} must be >= 1", raw)]
        if key in INTEGER_ATTRS:
            problems.append(first(np.isfinite(values) & (values != np.round(values)), col,
                                  f"{key} must be a whole number", raw))
            problems.append(first(np.isfinite(values) & (values > 2.0**31), col, f"{key} is too large", raw))
    return values, [p for p in problems if p is not None]


def comment_attrs(cells: pd.Series, col: str) -> tuple[dict[str, np.ndarray], list[Problem]]:
    """Attributes from a Slurm ``Comment``/``JobName`` column holding ``key=value;key=value`` items.

    Returns:
        (attribute -> values as :func:`attr_values` gives them, for the keys found in any row; problems
        with field ``COL.key``).
    """
    n = len(cells)
    found: dict[str, list] = {}
    problems: list[Problem] = []
    for i, cell in enumerate(cells.fillna("").astype(str).tolist()):
        if "=" not in cell:
            continue
        seen: set[str] = set()
        for item in cell.split(";"):
            m = _ITEM.match(item)
            if m is None or m.group(1) not in TRACE_ATTRS:
                continue
            key, value = m.group(1), m.group(2)
            if key in seen:
                problems.append(Problem(i, f"{col}.{key}", f"{key} given twice in {cell!r}"))
            seen.add(key)
            found.setdefault(key, [None] * n)[i] = value
    out: dict[str, np.ndarray] = {}
    for key in TRACE_ATTRS:
        if key in found:
            table = pd.DataFrame({f"{col}.{key}": pd.Series(found[key], dtype=object)})
            out[key], p = attr_values(table, key, f"{col}.{key}")
            problems += p
    return out, problems


def check_attr_frame(df: pd.DataFrame, file: str | None) -> None:
    """Check the optional attribute columns of a trace table (see the module docstring).

    Raises:
        InputError: a column out of order or unknown, a wrong dtype, a value breaking its rule
            (``row`` = 1-based table row).
    """
    extra = [c for c in df.columns[5:]]
    if extra != [c for c in TRACE_ATTRS if c in extra]:
        raise InputError(f"optional trace columns must be some of {list(TRACE_ATTRS)} in that order, got {extra}",
                         file=file)
    for col in extra:
        if col == "model":
            if not pd.api.types.is_string_dtype(df[col]) or df[col].isna().any():
                raise InputError("column must hold strings ('' = not given)", file=file, field=col)
            continue
        if df[col].dtype != np.float64:
            raise InputError(f"column must be float64 (NaN = not given), got {df[col].dtype}", file=file, field=col)
        v = df[col].to_numpy()
        with np.errstate(invalid="ignore"):
            bad = (~np.isnan(v) & ~np.isfinite(v)) | (v < 1)
            if col in INTEGER_ATTRS:
                bad |= np.isfinite(v) & (v != np.round(v))
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{col} must be {'a whole number ' if col in INTEGER_ATTRS else ''}>= 1 "
                             f"(value {v[i]!r})", file=file, row=i + 1, field=col)
