"""Reader for any CSV trace, given a column mapping (format name ``csv``).

Mapping keys: ``submit``, ``duration``, ``gpus`` (required), ``job_id``, ``tenant`` (optional); values are
column names of the file. ``time_unit`` (``s``, ``ms``, ``min``, ``h``) applies to submit and duration.
Submit values are non-negative numbers on any origin (they are shifted so the earliest kept job is at 0 s).
Without a ``job_id`` column the id is the 1-based data row; without ``tenant`` it is ``""``.

Rules: duplicate job ids raise; zero durations are skipped (``skipped["zero_duration"]``).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.tableio import first, numeric, raise_first, read_csv_strings, require_columns, row_numbers, string_column

REQUIRED_KEYS = ("submit", "duration", "gpus")
OPTIONAL_KEYS = ("job_id", "tenant")
TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0}
_HELP = ("the csv format needs a column mapping with keys submit, duration, gpus (required) and job_id, "
         "tenant (optional), e.g. --columns submit=ts,duration=dur,gpus=n")


def check_column_mapping(mapping: Mapping[str, str] | None, *, field: str = "csv_columns") -> dict[str, str]:
    """Validate a column mapping and return it as a plain dict (values stripped).

    Raises:
        InputError: mapping missing, a required key absent, an unknown key, or an empty column name.
    """
    if not mapping:
        raise InputError(f"no column mapping given: {_HELP}", field=field)
    out: dict[str, str] = {}
    for key, col in mapping.items():
        if key not in REQUIRED_KEYS + OPTIONAL_KEYS:
            raise InputError(f"unknown mapping key {key!r}: {_HELP}", field=field)
        if not isinstance(col, str) or not col.strip():
            raise InputError(f"empty column name for key {key!r}: {_HELP}", field=field)
        out[key] = col.strip()
    missing = [k for k in REQUIRED_KEYS if k not in out]
    if missing:
        raise InputError(f"mapping lacks {', '.join(missing)}: {_HELP}", field=field)
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


def read_csv_trace(path: str, csv_columns: Mapping[str, str] | None, time_unit: str = "s") -> pd.DataFrame:
    """Read a CSV with the given column mapping into the common trace table.

    Args:
        path: CSV file (may be compressed: .gz, .bz2, .zip, .xz).
        csv_columns: see the module docstring.
        time_unit: unit of the submit and duration columns: ``s``, ``ms``, ``min`` or ``h``.

    Raises:
        InputError: bad mapping or unit, missing/unreadable file, mapped column absent, bad value
            (file, row, field = the file's column name), duplicate job id, no jobs.
    """
    mapping = check_column_mapping(csv_columns)
    if time_unit not in TIME_UNITS_S:
        raise InputError(f"unknown time unit {time_unit!r}; use one of {', '.join(TIME_UNITS_S)}",
                         field="time_unit")
    file = str(path)
    df = read_csv_strings(path)
    require_columns(df, mapping.values(), file=file, what="csv (mapped)")
    submit, p1 = numeric(df, mapping["submit"])
    duration, p2 = numeric(df, mapping["duration"])
    gpus, p3 = numeric(df, mapping["gpus"], integer=True, positive=True)
    id_col = mapping.get("job_id")
    p4 = [first(df[id_col].isna().to_numpy(), id_col, "missing job id")] if id_col else []
    raise_first([*p1, *p2, *p3, *p4], file=file)
    rows = row_numbers(df)
    scale = TIME_UNITS_S[time_unit]
    job_id = string_column(df, id_col) if id_col else rows.astype(str)
    return finish_frame(job_id=job_id, submit_s=submit * scale, duration_s=duration * scale,
                        num_gpus=gpus.astype(np.int64), tenant=string_column(df, mapping.get("tenant")),
                        rows=rows, file=file, fmt="csv")
