"""Trace windows and load scaling, for every format: ``window``, ``first_jobs``, ``arrival_scale``.

Applied by :func:`tlora_sim.traces.registry.read_trace` after the reader, in this order:

1. ``window="START,END"``: keep the jobs submitted in ``[START, END)``. Each bound is seconds from the
   trace start (``86400``, ``1.5e6``; the first job of the whole trace is at 0) or a calendar time
   (``2017-10-01``, ``2017-10-01T12:00``, ISO 8601), read in the trace's time zone (csv/slurm
   ``time_zone``, Philly US/Pacific; a time with an offset is absolute). Calendar bounds need a trace
   with calendar times (csv with ISO 8601 times, slurm, philly): ITP, Acme, synthetic and numeric csv
   times have no calendar and take seconds only. An empty bound is open (``",86400"``).
   Dropped jobs are counted in ``attrs["skipped"]["outside_window"]``.
2. ``first_jobs=N``: keep the first N jobs in submit order (``skipped["after_first_jobs"]``).
3. ``arrival_scale=X``: divide every submit time by X (X = 2: arrivals twice as dense, "the trace at 2x its
   arrival rate"); durations and GPU counts are kept. ``attrs["arrival_scale"]`` records X.

After 1 and 2 the submit times are shifted so the first kept job is at 0 s again; ``attrs["epoch_s"]``
(the calendar time of 0 s, where known) moves with them.
"""

from __future__ import annotations

import math
import zoneinfo

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import Origin


def parse_window(text: str | tuple | None) -> tuple[str, str] | None:
    """``"START,END"`` (or a ``(start, end)`` pair, None = open) -> (start, end) strings (either may be
    ``""``: open); None/empty -> None.

    Raises:
        InputError (field ``window``): not two comma-separated bounds, or both empty.
    """
    if isinstance(text, (tuple, list)) and len(text) == 2:  # (start, end) from Python
        text = ",".join("" if v is None else str(v) for v in text)
    if text is None or not str(text).strip():
        return None
    parts = str(text).split(",")
    if len(parts) != 2 or not any(p.strip() for p in parts):
        raise InputError(f"expected START,END (seconds from the trace start or dates, e.g. 0,86400 or "
                         f"2017-10-01,2017-11-01), got {text!r}", field="window")
    return parts[0].strip(), parts[1].strip()


def _bound(text: str, df: pd.DataFrame, open_value: float) -> float:
    """One window bound as seconds from the trace's 0 s."""
    if text == "":
        return open_value
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value):
            raise InputError(f"bound must be finite, got {text!r}", field="window")
        return value
    epoch = df.attrs.get("epoch_s")
    if epoch is None:
        raise InputError(f"{text!r} is a date, but this trace ({df.attrs.get('format', '?')}) has no calendar "
                         f"times; give seconds from the trace start", field="window")
    tz = df.attrs.get("time_zone") or "UTC"
    try:
        t = pd.Timestamp(text)
        if t.tzinfo is None:
            t = t.tz_localize(zoneinfo.ZoneInfo(tz), ambiguous=True, nonexistent="shift_forward")
    except (ValueError, TypeError, OverflowError) as e:
        raise InputError(f"not seconds or an ISO 8601 date: {text!r} ({e})", field="window") from None
    return float(t.timestamp()) - float(epoch)


def apply_window(df: pd.DataFrame, *, window: str | None = None, first_jobs: int | None = None,
                 arrival_scale: float | None = None) -> pd.DataFrame:
    """Cut and scale a trace table (rules in the module docstring); returns a new table (or ``df`` itself
    when nothing is asked).

    Raises:
        InputError: a bad window (field ``window``), ``first_jobs`` < 1 or not an integer, ``arrival_scale``
            not finite and > 0, or no job left in the window.
    """
    bounds = parse_window(window)
    if first_jobs is not None and (isinstance(first_jobs, bool) or not isinstance(first_jobs, (int, np.integer))
                                   or first_jobs < 1):
        raise InputError(f"must be an integer >= 1, got {first_jobs!r}", field="first_jobs")
    if arrival_scale is not None:
        if isinstance(arrival_scale, bool) or not isinstance(arrival_scale, (int, float)) or \
                not (math.isfinite(arrival_scale) and arrival_scale > 0):
            raise InputError(f"must be a finite number > 0, got {arrival_scale!r}", field="arrival_scale")
    if bounds is None and first_jobs is None and arrival_scale in (None, 1, 1.0):
        return df
    submit = df["submit_time_s"].to_numpy()
    keep = np.ones(len(df), dtype=bool)
    skipped = dict(df.attrs.get("skipped", {}))
    if bounds is not None:
        lo, hi = _bound(bounds[0], df, -math.inf), _bound(bounds[1], df, math.inf)
        if not lo < hi:
            raise InputError(f"START must be before END, got {window!r}", field="window")
        keep = (submit >= lo) & (submit < hi)
        skipped["outside_window"] = int((~keep).sum())
        if not keep.any():
            span = f"{submit.min():g}..{submit.max():g} s"
            raise InputError(f"no job submitted in the window {window!r} (submit times span {span})",
                             file=df.attrs.get("path"), field="window")
    if first_jobs is not None:
        order = np.cumsum(keep)
        extra = keep & (order > first_jobs)
        skipped["after_first_jobs"] = int(extra.sum())
        keep &= ~extra
    out = df.loc[keep].reset_index(drop=True) if not keep.all() else df.copy()
    attrs = dict(df.attrs)
    origin = attrs.get("origin")
    if origin is not None and len(origin) == len(df) and not keep.all():
        attrs["origin"] = Origin(origin.rows[keep], None if origin.files is None else origin.files[keep])
    t0 = float(out["submit_time_s"].iloc[0])
    out["submit_time_s"] = out["submit_time_s"] - t0
    if attrs.get("epoch_s") is not None:
        attrs["epoch_s"] = float(attrs["epoch_s"]) + t0
    if arrival_scale not in (None, 1, 1.0):
        out["submit_time_s"] = out["submit_time_s"] / float(arrival_scale)
        attrs["arrival_scale"] = float(arrival_scale)
    attrs["skipped"] = skipped
    out.attrs = attrs
    return out
