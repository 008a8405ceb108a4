"""Reader for any CSV trace, given a column mapping (format name ``csv``): cluster exports, pod tables.

Mapping keys (values are column names of the file):

* ``submit``, ``gpus`` (required) and exactly one of ``duration`` or ``end``;
* ``start`` (optional, only with ``end``), ``job_id``, ``tenant``, ``state`` (optional);
* LoRA attributes (optional, any subset): ``model``, ``rank``, ``seq_len``, ``batch_size`` (sequences per
  optimizer step of the whole job), ``max_slowdown``, ``steps`` (:mod:`tlora_sim.traces.job_attrs`); an
  empty cell, or an attribute not mapped, is drawn from the LoRA distribution.

Only the mapped columns are parsed (``read_csv_strings(usecols=...)``): a wide export costs what its
mapped columns cost.

Runtime: ``duration`` as given; with ``end`` and ``start``, ``end - start`` (the log's own queueing,
``start - submit``, is left out: the simulator queues the job itself); with ``end`` but no ``start``,
``end - submit``, which includes whatever the job waited in the logged cluster.

Time columns (``submit``, ``start``, ``end``) are numbers (epoch or any other origin, times ``time_unit``:
``s``, ``ms``, ``min``, ``h``) or ISO 8601 times (naive ones are wall clock in ``time_zone``, default UTC);
see :mod:`tlora_sim.traces.timestamps`. All time columns of a file must be of one kind. ``duration`` is a
number in ``time_unit``. Submit times are shifted so the earliest kept job is at 0 s. Without a ``job_id``
column the id is the 1-based data row; without ``tenant`` it is ``""``.

Live exports (a snapshot of a running cluster): with ``start`` mapped, a row without a start time (empty,
``Unknown`` or ``None``: pending) is skipped as ``never_started``; with ``end`` mapped, a row without an end
time (running) as ``state_running``. With ``state`` mapped and ``keep_states`` given (``"Succeeded,Failed"``,
case-insensitive, first word of the cell), rows in other states are skipped as ``state_<name>``
(lower case); without ``keep_states`` the state column filters nothing. Each row is counted once, under its
first reason in the order state, never started, running, zero GPUs.

Rules: a row requesting 0 GPUs (a CPU job or pod) is skipped (``skipped["zero_gpus"]``), before its other
fields are checked; a fractional request (0.5 GPU) is rounded up to whole GPUs and kept
(``attrs["adjusted"]["gpus_rounded_up"]``); an end before its start (or before submit) raises naming file,
row and the end column; duplicate job ids raise; zero durations are skipped (``skipped["zero_duration"]``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.job_attrs import TRACE_ATTRS, attr_values
from tlora_sim.traces.tableio import (first, gpu_requests, numeric, raise_first, read_csv_strings, require_columns,
                                     row_numbers, shift_problems, string_column)
from tlora_sim.traces.timestamps import check_time_zone, time_column

REQUIRED_KEYS = ("submit", "gpus")
RUNTIME_KEYS = ("duration", "end")
OPTIONAL_KEYS = ("start", "job_id", "tenant", "state")
ALL_KEYS = REQUIRED_KEYS + RUNTIME_KEYS + OPTIONAL_KEYS + TRACE_ATTRS
NOT_GIVEN = frozenset({"", "UNKNOWN", "NONE", "NAN", "NULL", "NAT"})
"""Time cells that mean "not yet" in a live export (upper-cased, stripped)."""
TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0}
_HELP = ("the csv format needs a column mapping with keys submit, duration, gpus (or end instead of "
         "duration) and optionally start (with end), job_id, tenant, e.g. --columns submit=ts,duration=dur,gpus=n "
         "or --columns submit=created,start=started,end=finished,gpus=n")


def check_column_mapping(mapping: Mapping[str, str] | None, *, field: str = "csv_columns") -> dict[str, str]:
    """Validate a column mapping and return it as a plain dict (values stripped).

    Raises:
        InputError: mapping missing, a required key absent, both or neither of ``duration`` and ``end``,
            ``start`` without ``end``, an unknown key, or an empty column name.
    """
    if not mapping:
        raise InputError(f"no column mapping given: {_HELP}", field=field)
    out: dict[str, str] = {}
    for key, col in mapping.items():
        if key not in ALL_KEYS:
            raise InputError(f"unknown mapping key {key!r}: {_HELP}", field=field)
        if not isinstance(col, str) or not col.strip():
            raise InputError(f"empty column name for key {key!r}: {_HELP}", field=field)
        out[key] = col.strip()
    missing = [k for k in REQUIRED_KEYS if k not in out]
    if not any(k in out for k in RUNTIME_KEYS):
        missing.append("duration (or end)")
    if missing:
        raise InputError(f"mapping lacks {', '.join(missing)}: {_HELP}", field=field)
    if all(k in out for k in RUNTIME_KEYS):
        raise InputError(f"give either duration or end, not both: {_HELP}", field=field)
    if "start" in out and "end" not in out:
        raise InputError(f"start is used only with end (runtime = end - start): {_HELP}", field=field)
    return out


def parse_states(states: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``keep_states`` (``"Succeeded,Failed"`` or a list) as upper-case names; None/empty -> None (keep all).

    Raises:
        InputError (field ``keep_states``): a list with no name in it.
    """
    if states is None or (isinstance(states, str) and not states.strip()):
        return None
    items = states.split(",") if isinstance(states, str) else list(states)
    out = tuple(dict.fromkeys(str(s).strip().upper() for s in items if str(s).strip()))
    if not out:
        raise InputError("no state named", field="keep_states")
    return out


def parse_column_mapping(text: str) -> dict[str, str]:
    """Parse ``"submit=ts,duration=dur,gpus=n[,job_id=id][,tenant=vc]"`` (the CLI's ``--columns``).

    Raises:
        InputError (field ``--columns``): an item without ``=``, a repeated or unknown key, an empty
            name, or a missing required key.
    """
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, col = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"expected KEY=COLUMN, got {item.strip()!r}: {_HELP}", field="--columns")
        if key in out:
            raise InputError(f"key {key!r} given twice", field="--columns")
        out[key] = col
    return check_column_mapping(out, field="--columns")


def read_csv_trace(path: str, csv_columns: Mapping[str, str] | None, time_unit: str = "s",
                   time_zone: str | None = None, keep_states: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Read a CSV with the given column mapping into the common trace table.

    Args:
        path: CSV file (may be compressed: .gz, .bz2, .zip, .xz).
        csv_columns: see the module docstring.
        time_unit: unit of numeric time columns and of ``duration``: ``s``, ``ms``, ``min`` or ``h``.
        time_zone: IANA zone of naive ISO 8601 times (default ``UTC``); numbers and times with an offset
            ignore it.
        keep_states: states kept when ``state`` is mapped (see the module docstring); needs ``state``.

    Returns:
        The common table, plus the mapped LoRA attribute columns; ``attrs["skipped"]`` has ``zero_gpus``
        and ``zero_duration`` (and ``never_started``, ``state_running``, ``state_<name>`` where they apply),
        ``attrs["adjusted"]`` has ``gpus_rounded_up``.

    Raises:
        InputError: bad mapping, unit or time zone, missing/unreadable file, mapped column absent, bad
            value (file, row, field = the file's column name), time columns of different kinds, end before
            start (or before submit without ``start``), duplicate job id, no jobs.
    """
    mapping = check_column_mapping(csv_columns)
    if time_unit not in TIME_UNITS_S:
        raise InputError(f"unknown time unit {time_unit!r}; use one of {', '.join(TIME_UNITS_S)}",
                         field="time_unit")
    tz = check_time_zone(time_zone)
    states = parse_states(keep_states)
    if states is not None and "state" not in mapping:
        raise InputError("keep_states filters by the state column: map it (--columns ...,state=COL)",
                         field="keep_states")
    file = str(path)
    df = read_csv_strings(path, usecols=list(mapping.values()))
    require_columns(df, mapping.values(), file=file, what="csv (mapped)")
    rows_all = row_numbers(df)
    reasons = pd.Series("", index=df.index, dtype=object)

    def skip(mask, reason):  # a row keeps its first reason; reason is a str or a per-row Series
        m = (reasons == "").to_numpy() & np.asarray(mask, dtype=bool)
        reasons[m] = reason[m] if isinstance(reason, pd.Series) else reason

    if states is not None:
        state = df[mapping["state"]].fillna("").str.strip().str.split().str[0].fillna("").str.upper()
        skip(~state.isin(states), state.map(lambda s: f"state_{s.lower() or 'missing'}"))
    not_given = {k: df[mapping[k]].fillna("").str.strip().str.upper().isin(NOT_GIVEN).to_numpy()
                 for k in ("start", "end") if k in mapping}
    if "start" in not_given:
        skip(not_given["start"], "never_started")
    if "end" in not_given:
        skip(not_given["end"], "state_running")
    live = (reasons != "").to_numpy()
    gpus, zero, rounded, problems = gpu_requests(df, mapping["gpus"])
    raise_first([p for p in problems if not live[p.index]], file=file, rows=rows_all)
    skip(zero, "zero_gpus")
    kept = np.flatnonzero((reasons == "").to_numpy())
    skipped = {r: int(n) for r, n in reasons[reasons != ""].value_counts().sort_index().items()}
    skipped.setdefault("zero_gpus", 0)
    if len(kept) == 0:
        if skipped["zero_gpus"] == len(df):
            raise InputError(f"no jobs left: all {len(df)} rows request zero GPUs", file=file, field=mapping["gpus"])
        detail = ", ".join(f"{r} {n}" for r, n in skipped.items() if n)
        raise InputError(f"no jobs left in {len(df)} rows (skipped: {detail})", file=file)
    sub = df.iloc[kept]
    scale = TIME_UNITS_S[time_unit]
    times, problems, kinds = {}, [], {}
    for key in ("submit", "start", "end"):
        if key in mapping:
            times[key], found, kinds[key] = time_column(sub, mapping[key], scale_s=scale, time_zone=tz)
            problems += found
    if "duration" in mapping:
        duration, found = numeric(sub, mapping["duration"])
        problems += found
        duration = duration * scale
    id_col = mapping.get("job_id")
    if id_col:
        problems.append(first(sub[id_col].isna().to_numpy(), id_col, "missing job id"))
    attrs = {}
    for key in TRACE_ATTRS:
        if key in mapping:
            attrs[key], found = attr_values(sub, key, mapping[key])
            problems += found
    raise_first(shift_problems(problems, kept), file=file, rows=rows_all)
    if len(set(kinds.values())) > 1:
        described = ", ".join(f"{mapping[k]} ({'numbers' if v == 'number' else 'ISO 8601 times'})"
                              for k, v in kinds.items())
        raise InputError(f"time columns must all be numbers or all ISO 8601 times, got {described}",
                         file=file, field=mapping["end"])
    if "end" in mapping:
        origin = "start" if "start" in mapping else "submit"
        early = times["end"] < times[origin]
        raise_first(shift_problems([first(early, mapping["end"], f"end precedes {origin} "
                                          f"(column {mapping[origin]!r})", sub[mapping["end"]])], kept),
                    file=file, rows=rows_all)
        duration = times["end"] - times[origin]
    rows = rows_all[kept]
    job_id = string_column(sub, id_col) if id_col else rows.astype(str)
    out = finish_frame(job_id=job_id, submit_s=times["submit"], duration_s=duration,
                       num_gpus=gpus[kept], tenant=string_column(sub, mapping.get("tenant")),
                       rows=rows, file=file, fmt="csv", skipped=skipped,
                       adjusted={"gpus_rounded_up": rounded[kept]}, attrs=attrs,
                       attr_columns={k: mapping[k] for k in attrs})
    if kinds["submit"] == "iso":  # calendar times: seconds since 1970-01-01 UTC
        out.attrs.update(epoch_s=out.attrs["shift_s"], time_zone=tz)
    return out
