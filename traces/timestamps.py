"""Time columns of operators' logs: numbers, ISO 8601 strings, Slurm times and Slurm elapsed times.

Every function returns seconds as float64 (NaN where a value is bad) together with the first
:class:`~tlora_sim.traces.tableio.Problem` of each rule, so readers report the earliest bad row with
:func:`~tlora_sim.traces.tableio.raise_first`.

Rules (documented in ``traces/README.md``):

* A *number* column (the majority of its non-missing values parse as numbers) is read as numbers on any
  origin (epoch seconds, seconds since the trace start, ...) times the reader's unit; values must be >= 0.
* Otherwise the column holds *ISO 8601 times* (``2024-05-01T13:00:00``, ``2024-05-01 13:00``,
  ``2024-05-01T13:00:00.5+02:00``, ``...Z``), parsed by ``pandas.to_datetime(format="ISO8601")``. A time
  with an offset or ``Z`` is absolute; a naive one is wall-clock time in ``time_zone`` (an IANA name,
  default ``UTC``) and is localised like the Philly reader does: a time inside a spring-forward gap moves
  forward (``nonexistent="shift_forward"``), a repeated fall-back time is read as its first occurrence
  (``ambiguous=True``). The result is seconds since 1970-01-01 UTC.
* Since every reader shifts submit times so that the first job is at 0 s, the time zone only matters for
  intervals that span a daylight-saving change.
"""

from __future__ import annotations

import re
import zoneinfo

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.tableio import Problem, first, numeric

DEFAULT_TIME_ZONE = "UTC"
_OFFSET = re.compile(r"[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?\s*(?:Z|z|[+-]\d{2}(?::?\d{2})?)$")
_EPOCH = pd.Timestamp(0, tz="UTC")
_ELAPSED = r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+(?:\.\d+)?)$"
ISO_EXAMPLE = "2024-05-01T13:00:00"


def check_time_zone(time_zone: str | None, *, field: str = "time_zone") -> str:
    """Return a valid IANA time-zone name (``None`` or ``""`` -> ``UTC``).

    Raises:
        InputError (field ``field``): a name the tz database does not know.
    """
    if time_zone is None or not str(time_zone).strip():
        return DEFAULT_TIME_ZONE
    name = str(time_zone).strip()
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a tz directory (America)
        raise InputError(f"unknown time zone {name!r}; use an IANA name such as UTC, Europe/Berlin, "
                         "America/Chicago, Asia/Shanghai", field=field) from None
    return name


#: years a time may lie in: pandas' nanosecond timestamps span 1677-09-21 to 2262-04-11.
MIN_YEAR, MAX_YEAR = 1678, 2261
_YEAR = r"^\s*([+-]?\d+)-"


def out_of_range(raw: pd.Series) -> np.ndarray:
    """Mask of the time strings whose year lies outside ``MIN_YEAR``..``MAX_YEAR`` (a Slurm ``End`` of
    ``9999-12-31T23:59:59``, a submit in 2300): such times are errors, not pandas' ``OutOfBoundsDatetime``."""
    year = pd.to_numeric(raw.astype(object).where(raw.notna(), None).astype("string").str.extract(_YEAR, expand=False),
                         errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        return (year < MIN_YEAR) | (year > MAX_YEAR)


def range_problem(mask: np.ndarray, col: str, raw: pd.Series) -> Problem | None:
    """The first out-of-range time (:func:`out_of_range`) as a Problem."""
    return first(mask, col, f"time outside the years {MIN_YEAR}-{MAX_YEAR} that can be represented", raw)


def is_numeric_column(raw: pd.Series) -> bool:
    """True when at least half of the column's non-missing values parse as numbers (an empty column
    counts as numeric, so its problems read as ``missing value``)."""
    present = raw.dropna()
    if len(present) == 0:
        return True
    return bool(pd.to_numeric(present, errors="coerce").notna().mean() >= 0.5)


def localize(naive: pd.Series, time_zone: str) -> pd.Series:
    """Naive datetimes (wall clock in ``time_zone``) -> seconds since 1970-01-01 UTC (float64; NaT -> NaN).

    DST: gap times shift forward, repeated times are read as their first occurrence (see module doc).
    """
    aware = naive.dt.tz_localize(time_zone, ambiguous=np.ones(len(naive), dtype=bool), nonexistent="shift_forward")
    return (aware - _EPOCH).dt.total_seconds().astype(np.float64)


def iso_seconds(raw: pd.Series, time_zone: str) -> np.ndarray:
    """ISO 8601 strings -> seconds since 1970-01-01 UTC (float64, NaN where missing or unparsable).

    Strings with an offset or ``Z`` are absolute; naive ones are wall-clock time in ``time_zone``.
    """
    text = raw.astype(object).where(raw.notna(), None)
    out = np.full(len(raw), np.nan)
    s = pd.Series([None if v is None else str(v).strip() for v in text], index=raw.index, dtype=object)
    aware = s.map(lambda v: v is not None and bool(_OFFSET.search(v))).to_numpy(dtype=bool)
    if aware.any():
        t = pd.to_datetime(s[aware], format="ISO8601", utc=True, errors="coerce")
        out[aware] = (t - _EPOCH).dt.total_seconds().to_numpy(dtype=np.float64)
    naive = ~aware & s.notna().to_numpy()
    if naive.any():
        t = pd.to_datetime(s[naive], format="ISO8601", errors="coerce")
        if isinstance(t.dtype, pd.DatetimeTZDtype):  # an offset the pattern missed: absolute anyway
            out[naive] = (t - _EPOCH).dt.total_seconds().to_numpy(dtype=np.float64)
        else:
            out[naive] = localize(t, time_zone).to_numpy(dtype=np.float64)
    return out


def time_column(df: pd.DataFrame, col: str, *, scale_s: float, time_zone: str) -> tuple[np.ndarray, list[Problem], str]:
    """Read one time column (numbers x ``scale_s``, or ISO 8601 times) as seconds.

    Returns:
        (seconds float64 with NaN where bad, first problems, kind ``"number"`` or ``"iso"``). Numbers are
        on the file's own origin; ISO times are seconds since 1970-01-01 UTC.
    """
    raw = df[col]
    if is_numeric_column(raw):
        values, problems = numeric(df, col)
        return values * scale_s, problems, "number"
    far = out_of_range(raw)
    values = iso_seconds(raw.where(~far), time_zone)
    missing = raw.isna().to_numpy()
    problems = [first(missing, col, "missing value (NaN or empty)"), range_problem(far, col, raw),
                first(np.isnan(values) & ~missing & ~far, col,
                      f"not a number or an ISO 8601 time (e.g. {ISO_EXAMPLE})", raw)]
    return values, [p for p in problems if p is not None], "iso"


def slurm_time_column(df: pd.DataFrame, col: str, time_zone: str, *,
                      unknown: np.ndarray | None = None) -> tuple[np.ndarray, list[Problem]]:
    """A Slurm time column (``YYYY-MM-DDTHH:MM:SS``, cluster-local wall clock in ``time_zone``) as seconds
    since 1970-01-01 UTC. Cells flagged in ``unknown`` (e.g. ``Unknown``/``None``) are NaN and not problems.
    """
    raw = df[col]
    skip = np.zeros(len(df), dtype=bool) if unknown is None else unknown
    far = out_of_range(raw) & ~skip
    t = pd.to_datetime(raw.where(~skip & ~far).str.strip(), format="%Y-%m-%dT%H:%M:%S", errors="coerce")
    values = localize(t, time_zone).to_numpy(dtype=np.float64)
    missing = raw.isna().to_numpy() & ~skip
    problems = [first(missing, col, "missing value (NaN or empty)"), range_problem(far, col, raw),
                first(np.isnan(values) & ~missing & ~skip & ~far, col,
                      "not a Slurm time YYYY-MM-DDTHH:MM:SS (export with SLURM_TIME_FORMAT=standard)", raw)]
    return values, [p for p in problems if p is not None]


def elapsed_seconds(df: pd.DataFrame, col: str) -> tuple[np.ndarray, list[Problem]]:
    """A Slurm ``Elapsed`` column (``[D-][HH:]MM:SS``) as seconds (float64, NaN where bad)."""
    raw = df[col]
    parts = raw.str.strip().str.extract(_ELAPSED)
    values = (parts["d"].astype(float).fillna(0) * 86400 + parts["h"].astype(float).fillna(0) * 3600
              + parts["m"].astype(float) * 60 + parts["s"].astype(float)).to_numpy(dtype=np.float64)
    missing = raw.isna().to_numpy()
    problems = [first(missing, col, "missing value (NaN or empty)"),
                first(np.isnan(values) & ~missing, col, "not an elapsed time [D-]HH:MM:SS", raw)]
    return values, [p for p in problems if p is not None]
