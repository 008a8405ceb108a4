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
from typing import Callable, Iterable, Sequence

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


#: widest header a reader accepts (columns): a trace needs a handful; a million-column header is refused
#: before anything is parsed.
MAX_HEADER_COLUMNS = 10_000
#: longest header line accepted (bytes).
MAX_HEADER_BYTES = 1 << 20
#: bytes read per call while streaming a file (a plain file fails at its first chunk holding a NUL byte).
READ_CHUNK = 1 << 20
#: compression by file-name suffix (as pandas infers it from a path).
COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zip": "zip"}


def read_bytes(path: str | Path) -> bytes:
    """The whole file as (decompressed) bytes, read once, front to back, in :data:`READ_CHUNK` pieces,
    so a FIFO or ``<(cat file)`` works and a file is never opened twice.

    A NUL byte is not text: a plain file fails at the first chunk that holds one (a 2 GiB sparse file
    of NULs fails after 1 MiB); a compressed one after decompression. A plain file whose first line
    runs past :data:`MAX_HEADER_BYTES` fails there too, before the rest is read.

    Raises:
        InputError: missing file, directory, unreadable file, NUL byte (binary file or UTF-16), a first
            line longer than :data:`MAX_HEADER_BYTES`, truncated or corrupt compressed file.
    """
    p = existing_path(path)
    file = str(path)
    kind = COMPRESSION.get(p.suffix.lower())
    chunks: list[bytes] = []
    offset = 0
    try:
        with open(p, "rb") as fh:
            while True:
                block = fh.read(READ_CHUNK)
                if not block:
                    break
                if kind is None:
                    _no_nul(block, offset, file)
                    if offset <= MAX_HEADER_BYTES < offset + len(block) and b"\n" not in b"".join(chunks + [block]):
                        _header_too_long(file)  # before reading the rest of a huge one-line file
                chunks.append(block)
                offset += len(block)
    except OSError as e:
        raise InputError(f"cannot read file ({e.strerror or e})", file=file) from None
    data = b"".join(chunks)
    if kind is not None:
        data = _decompress(data, kind, file)
        _no_nul(data, 0, file)
    return data


def _header_too_long(file: str) -> None:
    raise InputError(f"header line is longer than {MAX_HEADER_BYTES:,} bytes; a trace has a few "
                     f"columns (at most {MAX_HEADER_COLUMNS:,} are read)", file=file)


def _no_nul(block: bytes, offset: int, file: str) -> None:
    k = block.find(b"\0")
    if k >= 0:
        raise InputError(f"not UTF-8 text: NUL byte at byte {offset + k:,} (a binary file, or UTF-16)", file=file)


def _decompress(data: bytes, kind: str, file: str) -> bytes:
    import bz2
    import io
    import lzma
    import zipfile

    try:
        if kind == "gzip":
            return gzip.decompress(data)
        if kind == "bz2":
            return bz2.decompress(data)
        if kind == "xz":
            return lzma.decompress(data)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
            if len(names) != 1:
                raise InputError(f"a zip trace must hold exactly one file, found {len(names)}", file=file)
            return z.read(names[0])
    except (EOFError, OSError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, ValueError) as e:
        raise InputError(f"compressed file is truncated or corrupt ({type(e).__name__}: {e})", file=file) from None


def header_names(data: bytes, *, sep: str, quote: int, file: str) -> list[str]:
    """The header row's names (stripped; a UTF-8 BOM dropped), checked for width before any parsing.

    Raises:
        InputError: empty file, a header line over :data:`MAX_HEADER_BYTES` bytes or with more than
            :data:`MAX_HEADER_COLUMNS` columns, not UTF-8.
    """
    end = data.find(b"\n", 0, MAX_HEADER_BYTES + 1)
    if end < 0:
        if len(data) > MAX_HEADER_BYTES:
            _header_too_long(file)
        end = len(data)
    line = data[:end]
    width = line.count(sep.encode()) + 1
    if width > MAX_HEADER_COLUMNS:
        raise InputError(f"header has {width:,} columns; at most {MAX_HEADER_COLUMNS:,} are read", file=file)
    try:
        text = line.decode("utf-8").lstrip("\ufeff").rstrip("\r")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start})", file=file) from None
    if not text.strip() and len(data.strip()) == 0:
        raise InputError("file is empty (no header row)", file=file)
    return [n.strip() for n in next(csv.reader([text], delimiter=sep, quoting=quote), [])]


def read_csv_strings(path: str | Path, *, sep: str = ",", quoting: bool = True,
                     usecols: Sequence[str] | Callable[[list[str]], Iterable[str]] | None = None) -> pd.DataFrame:
    """Read a CSV (plain or .gz/.bz2/.zip/.xz by extension) with every cell as a string or NaN.

    ``sep`` is the field separator (``"|"`` for ``sacct --parsable2``); ``quoting=False`` reads ``"``
    as an ordinary character (sacct does not quote fields). ``usecols``: the column names to parse (or a
    function of the header's names returning them); other columns are never parsed, names absent from the
    header are left for :func:`require_columns` to report. ``df.attrs["header"]`` keeps every header name.

    The file is read once (:func:`read_bytes`) and its header checked (:func:`header_names`) before
    pandas parses anything. Header names are stripped of surrounding spaces; trailing empty lines are
    dropped; an empty line inside the data raises, with its row number; a row with more fields than the
    header raises (with ``usecols`` and quoted fields in the file, every column is parsed to check it).

    Raises:
        InputError: missing file, empty file, header-only file, empty row, not UTF-8, NUL bytes, truncated/
            corrupt compressed file, malformed CSV, a header too wide, a name given twice in the header.
    """
    import io

    file = str(path)
    quote = csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE
    data = read_bytes(path)
    names = header_names(data, sep=sep, quote=quote, file=file)
    positions = None
    if usecols is not None:
        wanted = set(usecols(names) if callable(usecols) else usecols)
        positions = [i for i, n in enumerate(names) if n in wanted]
        _no_duplicate_names([names[i] for i in positions], file)
        if quoting and b'"' in data:
            positions = None  # quoted fields may hold separators or line breaks: parse all, pandas checks rows
    else:
        _no_duplicate_names(names, file)
    n_rows = None
    if positions is not None:
        n_rows = _check_lines(data, len(names), sep, file,
                              names[positions[0]] if positions else (names[0] if names else None))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            # index_col=False: a row longer than the header must not become the index
            df = pd.read_csv(io.BytesIO(data), dtype=str, encoding="utf-8", skip_blank_lines=False,
                             index_col=False, sep=sep, quoting=quote,
                             usecols=positions if positions is not None else None)
        if positions is None and any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
            _raise_long_row(data, file, sep, quote)
    except InputError:
        raise
    except pd.errors.EmptyDataError:
        raise InputError("file is empty (no header row)", file=file) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason} at byte {e.start})", file=file) from None
    except pd.errors.ParserError as e:
        raise InputError(f"malformed CSV: {str(e).strip()}", file=file) from None
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read file ({e})", file=file) from None
    if positions is not None:
        df.columns = [names[i] for i in positions]
        df = df.iloc[:n_rows]
    else:
        df.columns = [str(c).strip() for c in df.columns]
        if usecols is not None:
            wanted = set(usecols(names) if callable(usecols) else usecols)
            df = df.loc[:, [c for c in df.columns if c in wanted]]
    df.attrs["header"] = names
    if positions is not None:
        if n_rows == 0:
            raise InputError(f"no data rows (header only: {', '.join(names)})", file=file)
        return df
    filled = ~df.isna().all(axis=1).to_numpy()
    df = df.iloc[: len(filled) - int(np.argmax(filled[::-1]))] if filled.any() else df.iloc[:0]
    if len(df) == 0:
        raise InputError(f"no data rows (header only: {', '.join(names)})", file=file)
    raise_first([first(~filled[: len(df)], str(df.columns[0]) if len(df.columns) else "", "empty row (no values)")],
                file=file)
    return df


def _check_lines(data: bytes, width: int, sep: str, file: str, field: str | None) -> int:
    """Line checks of an unquoted file, from its bytes (numpy, no parsing): an empty line inside the
    data or a line with more fields than the header raises; returns the number of data rows (trailing
    empty lines not counted)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    starts = np.r_[0, nl + 1]
    ends = np.r_[nl, len(arr)]
    if starts[-1] >= len(arr):  # the file ends with a line break
        starts, ends = starts[:-1], ends[:-1]
    length = ends - starts
    cr = (length > 0) & (arr[np.maximum(ends - 1, 0)] == 13)
    blank = (length - cr) == 0
    data_blank = blank[1:]
    filled = np.flatnonzero(~data_blank)
    n_rows = int(filled[-1]) + 1 if len(filled) else 0
    if data_blank[:n_rows].any():
        raise InputError("empty row (no values)", file=file, row=int(np.argmax(data_blank[:n_rows])) + 1, field=field)
    seps = np.flatnonzero(arr == ord(sep))
    fields = np.bincount(np.searchsorted(nl, seps), minlength=len(starts))[: len(starts)] + 1
    long = np.flatnonzero(fields[1:n_rows + 1] > width)
    if len(long):
        row = int(long[0]) + 1
        raise InputError(f"row has {int(fields[row])} fields but the header has {width}", file=file, row=row)
    return n_rows


def _no_duplicate_names(names: list[str], file: str) -> None:
    """pandas renames a repeated header name (``a``, ``a.1``), so a mapping would silently take the
    first: refuse a name given twice."""
    seen = set()
    for name in names:
        if name in seen:
            raise InputError("column name appears twice in the header", file=file, field=name)
        seen.add(name)


def _raise_long_row(data: bytes, file: str, sep: str = ",", quote: int = csv.QUOTE_MINIMAL) -> None:
    """Find the first data row with more fields than the header and raise naming it."""
    import io

    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace")), delimiter=sep, quoting=quote)
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
    found = list(df.attrs.get("header", df.columns))
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
