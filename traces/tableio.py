"""Reading a CSV trace file as raw strings and checking its columns, vectorised.

Every library failure (missing file, not UTF-8, truncated or corrupt gzip, malformed CSV, empty file)
becomes an :class:`InputError` naming the file. Value checks find the first bad row with numpy and report
the 1-based data row (the first row after the header is row 1), the field and the offending value.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError


@dataclass(frozen=True)
class Problem:
    """A bad value found by a vectorised check: 0-based table index, column, message."""

    index: int
    field: str
    message: str


def existing_path(path: str | Path, *, want_dir: bool | None = False) -> Path:
    """Return ``path`` as a Path after checking it exists.

    Args:
        want_dir: False = must be a file, True = must be a directory, None = either.

    Raises:
        InputError: the path is missing, or is a directory where a file is expected (or vice versa).
    """
    if not str(path):
        raise InputError("no path given")
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError("file not found", file=str(path))
    if want_dir is False and p.is_dir():
        raise InputError("expected a file, found a directory", file=str(path))
    if want_dir is True and not p.is_dir():
        raise InputError("expected a directory", file=str(path))
    return p


def read_csv_strings(path: str | Path, *, sep: str = ",", quoting: bool = True) -> pd.DataFrame:
    """Read a CSV (plain or .gz/.bz2/.zip/.xz by extension) with every cell as a string or NaN.

    ``sep`` is the field separator (``"|"`` for ``sacct --parsable2``); ``quoting=False`` reads ``"``
    as an ordinary character (sacct does not quote fields).

    Header names are stripped of surrounding spaces; trailing empty lines are dropped; an empty line
    (or a row with no values) inside the data raises, with its row number.

    Raises:
        InputError: missing file, empty file, header-only file, empty row, not UTF-8, truncated/corrupt
            compressed file, malformed CSV.
    """
    p = existing_path(path)
    file = str(path)
    quote = csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            # index_col=False: a row longer than the header must not become the index
            df = pd.read_csv(p, dtype=str, encoding="utf-8", skip_blank_lines=False, index_col=False,
                             sep=sep, quoting=quote)
        if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
            _raise_long_row(p, file, sep)
    except pd.errors.EmptyDataError:
        raise InputError("file is empty (no header row)", file=file) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start})", file=file) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"compressed file is truncated or corrupt ({type(e).__name__}: {e})",
                         file=file) from None
    except pd.errors.ParserError as e:
        raise InputError(f"malformed CSV: {str(e).strip()}", file=file) from None
    except OSError as e:
        raise InputError(f"cannot read file ({e})", file=file) from None
    df.columns = [str(c).strip() for c in df.columns]
    _no_duplicate_names(p, file, len(df.columns), sep, quote)
    filled = ~df.isna().all(axis=1).to_numpy()
    df = df.iloc[: len(filled) - int(np.argmax(filled[::-1]))] if filled.any() else df.iloc[:0]
    if len(df) == 0:
        raise InputError(f"no data rows (header only: {', '.join(df.columns)})", file=file)
    raise_first([first(~filled[: len(df)], str(df.columns[0]), "empty row (no values)")], file=file)
    return df


def _no_duplicate_names(p, file: str, n_columns: int, sep: str = ",", quote: int = csv.QUOTE_MINIMAL) -> None:
    """pandas renames a repeated header name (``a``, ``a.1``), so a mapping would silently take the
    first: read the raw header and refuse a name given twice."""
    raw = pd.read_csv(p, dtype=str, header=None, nrows=1, encoding="utf-8", index_col=False, sep=sep,
                      quoting=quote).iloc[0]
    names = [str(x).strip() for x in raw.tolist()[:n_columns]]
    seen = set()
    for name in names:
        if name in seen:
            raise InputError("column name appears twice in the header", file=file, field=name)
        seen.add(name)


def _raise_long_row(path: Path, file: str, sep: str = ",") -> None:
    """Find the first data row with more fields than the header and raise naming it."""
    import io

    opener = {".gz": gzip.open}.get(path.suffix, None)
    raw = opener(path, "rt", encoding="utf-8") if opener else open(path, encoding="utf-8", newline="")
    with raw as fh:
        reader = csv.reader(io.StringIO(fh.read()), delimiter=sep)
        header = next(reader, [])
        for row, fields in enumerate(reader, start=1):
            if len(fields) > len(header):
                raise InputError(f"row has {len(fields)} fields but the header has {len(header)} "
                                 f"({', '.join(h.strip() for h in header)})", file=file, row=row)
    raise InputError("a row has more fields than the header", file=file)


def require_columns(df: pd.DataFrame, required: Iterable[str], *, file: str, what: str) -> None:
    """Raise if a required column is absent, suggesting the closest header name.

    Args:
        what: the trace kind for the message (e.g. ``"itp"``).

    Raises:
        InputError: field = the missing column; the message lists the columns found.
    """
    found = list(df.columns)
    for name in required:
        if name in found:
            continue
        lower = {c.lower(): c for c in found}
        close = [lower[name.lower()]] if name.lower() in lower else difflib.get_close_matches(name, found, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(f"missing required column {name!r} for {what} traces{hint}; "
                         f"columns found: {', '.join(found)}", file=file, field=name)


def first(mask: np.ndarray, field: str, message: str, values: pd.Series | None = None) -> Problem | None:
    """The first True entry of ``mask`` as a Problem (message gets ``: <value>`` when values given)."""
    if not mask.any():
        return None
    i = int(np.argmax(mask))
    if values is not None:
        message = f"{message}: {values.iloc[i]!r}"
    return Problem(i, field, message)


def numeric(df: pd.DataFrame, col: str, *, integer: bool = False, min_value: float = 0.0,
            positive: bool = False) -> tuple[np.ndarray, list[Problem]]:
    """Convert one string column to float64 and find its first problems (no exception yet).

    Rules: missing value (NaN/empty), non-numeric text, inf, value < ``min_value`` (negative),
    value == 0 when ``positive``, fractional value when ``integer``.

    Returns:
        (values as float64 with NaN where bad, list of the first Problem of each rule).
    """
    raw = df[col]
    missing = raw.isna().to_numpy()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    nan = np.isnan(values)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        problems = [
            first(missing, col, "missing value (NaN or empty)"),
            first(nan & ~missing, col, "not a number", raw),
            first(~finite & ~nan, col, "not a finite number", raw),
            first(finite & (values < min_value), col, f"must be >= {min_value:g}", raw),
            first(finite & (values == 0), col, "must be > 0", raw) if positive else None,
            first(finite & (values != np.round(values)), col, "must be a whole number", raw) if integer else None,
            first(finite & (np.abs(values) > 2.0**53), col, "is too large (above 2^53)", raw) if integer else None,
        ]
    return values, [p for p in problems if p is not None]


def gpu_requests(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Problem]]:
    """GPU requests of operators' logs (csv and slurm formats): zero is allowed (a CPU job, to be skipped)
    and a fractional request is rounded up to whole GPUs.

    Rules: missing, non-numeric, infinite, negative or > 2^53 values are problems.

    Returns:
        (GPUs as int64 (0 where bad), zero mask, rounded-up mask, first problems).
    """
    values, problems = numeric(df, col)
    finite = np.isfinite(values)
    problems += [p for p in [first(finite & (values > 2.0**53), col, "is too large (above 2^53)", df[col])] if p]
    ok = finite & (values >= 0) & (values <= 2.0**53)
    whole = np.where(ok, np.ceil(np.where(ok, values, 0.0)), 0.0)
    return whole.astype(np.int64), ok & (values == 0), ok & (whole != values), problems


def shift_problems(problems: Sequence[Problem], positions: np.ndarray) -> list[Problem]:
    """Problems found on a subset of a table (``positions``: the subset's 0-based positions in the full
    table) re-indexed to the full table, so :func:`raise_first` names the right row."""
    return [Problem(int(positions[p.index]), p.field, p.message) for p in problems if p is not None]


def raise_first(problems: Sequence[Problem | None], *, file: str, rows: np.ndarray | None = None) -> None:
    """Raise an InputError for the earliest problem (smallest row; ties by list order).

    Args:
        rows: 1-based data row per table index; default ``index + 1``.
    """
    found = [p for p in problems if p is not None]
    if not found:
        return
    p = min(found, key=lambda q: q.index)
    row = int(rows[p.index]) if rows is not None else p.index + 1
    raise InputError(p.message, file=file, row=row, field=p.field)


def string_column(df: pd.DataFrame, col: str | None, default: str = "") -> np.ndarray:
    """A column as an object array of str (missing -> ``default``); all ``default`` when col is None."""
    if col is None:
        return np.full(len(df), default, dtype=object)
    return df[col].fillna(default).astype(str).str.strip().to_numpy(dtype=object)


def row_numbers(df: pd.DataFrame) -> np.ndarray:
    """1-based data row of each table row, from the (file-order) RangeIndex of :func:`read_csv_strings`."""
    return df.index.to_numpy(dtype=np.int64) + 1
