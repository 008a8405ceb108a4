"""One CSV of a run directory, read and checked: what ``validate-run`` and the host-speed series
read from executed runs (``workload.csv``, ``jobs.csv``, ``steps.csv``, ``probes.csv``). Errors
name the file, and for a bad value its row (as a spreadsheet counts: the header is row 1) and
field."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError


def read_run_csv(path: str | Path, what: str, need: Sequence[str]) -> pd.DataFrame:
    """The CSV at ``path`` (called ``what`` in messages) with at least the columns ``need``.

    Raises:
        InputError: empty (not even a header), unreadable, not CSV, or a missing column.
    """
    path = Path(path)
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise InputError(f"{what} is empty", file=str(path)) from None
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise InputError(f"cannot read {what} ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                         file=str(path)) from None
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(f"{what} lacks column(s) {missing}", file=str(path))
    return df


def check_finite(df: pd.DataFrame, cols: Sequence[str], path: str | Path, positive: Sequence[str] = ()) -> None:
    """Check that every value of ``cols`` is a finite number (and > 0 for the columns in
    ``positive``); ``df`` is not changed.

    Raises:
        InputError: the first bad value, naming the file, row and field.
    """
    for c in cols:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna() | ~np.isfinite(v.fillna(0))
        if c in positive:
            bad |= v <= 0
        if bad.any():
            k = int(np.flatnonzero(bad.to_numpy())[0])
            kind = "finite positive" if c in positive else "finite"
            raise InputError(f"not a {kind} number: {df[c].iloc[k]!r}", file=str(path), row=k + 2, field=c)
