"""Reader for the public Microsoft Philly job CSV.

Columns: ``timestamp`` (local wall-clock time ``YYYY-MM-DD HH:MM:SS`` in US/Pacific, rows unsorted),
``duration`` (s, float), ``num_gpus``, ``gpu_time`` (= duration x num_gpus; ignored), ``cluster`` (hashed
virtual-cluster id -> ``tenant``; optional, ``""`` when absent). An optional ``job_id`` column is used as
the id; otherwise the id is the 1-based data row in the original file (before sorting and dedupe).

Time conversion (documented choice): timestamps are localised to ``US/Pacific`` with
``nonexistent="shift_forward"`` (a time inside the spring-forward gap, e.g. 02:30 on the March change day,
becomes 03:00 PDT) and ``ambiguous=True`` (a repeated wall-clock time in the fall-back hour is read as its
*first* occurrence, PDT). Row order cannot resolve ambiguity because the file is unsorted; the error is at
most one hour, for jobs submitted in that one hour a year. Then ``submit_time_s`` = seconds since the
earliest kept job, on the absolute (UTC) time line, so DST changes add or remove no hour.

Rules: exact duplicate rows (every column equal) are dropped, keeping the first, and counted in
``skipped["duplicate"]``; zero durations are dropped (``skipped["zero_duration"]``); a repeated id in a
``job_id`` column on rows that are not exact duplicates raises.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.timestamps import out_of_range, range_problem
from tlora_sim.traces.tableio import first, numeric, raise_first, read_csv_strings, require_columns, row_numbers, string_column

REQUIRED = ("timestamp", "duration", "num_gpus")
TIMEZONE = "US/Pacific"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def read_philly(path: str) -> pd.DataFrame:
    """Read a Philly CSV into the common trace table (times in seconds, DST handled as documented above).

    Raises:
        InputError: missing/unreadable file, missing column, unparsable timestamp or bad number
            (file, row, field), repeated job id on different rows, no jobs.
    """
    file = str(path)
    df = read_csv_strings(path)
    require_columns(df, REQUIRED, file=file, what="philly")
    dup = df.duplicated(keep="first").to_numpy()
    df = df.loc[~dup]
    rows = row_numbers(df)
    raw_ts = df["timestamp"].str.strip()
    far = out_of_range(raw_ts)
    local = pd.to_datetime(raw_ts.where(~far), format=TIME_FORMAT, errors="coerce")
    bad_ts = local.isna().to_numpy() & ~far
    duration, p1 = numeric(df, "duration")
    gpus, p2 = numeric(df, "num_gpus", integer=True, positive=True)
    ts_problem = first(bad_ts, "timestamp", f"not a time in format {TIME_FORMAT!r}", df["timestamp"])
    raise_first([ts_problem, range_problem(far, "timestamp", df["timestamp"]), *p1, *p2], file=file, rows=rows)
    absolute = local.dt.tz_localize(TIMEZONE, ambiguous=np.ones(len(local), dtype=bool),
                                    nonexistent="shift_forward")
    submit = (absolute - absolute.min()).dt.total_seconds().to_numpy(dtype=np.float64)
    has_id = "job_id" in df.columns
    if has_id:
        ids = df["job_id"]
        raise_first([first(ids.isna().to_numpy(), "job_id", "missing job id")], file=file, rows=rows)
        job_id = string_column(df, "job_id")
    else:
        job_id = rows.astype(str)
    tenant = string_column(df, "cluster" if "cluster" in df.columns else None)
    out = finish_frame(job_id=job_id, submit_s=submit, duration_s=duration, num_gpus=gpus.astype(np.int64),
                       tenant=tenant, rows=rows, file=file, fmt="philly",
                       skipped={"duplicate": int(dup.sum())}, check_ids=has_id)
    first_utc = absolute.min().tz_convert("UTC").tz_localize(None)
    out.attrs.update(epoch_s=float((first_utc - pd.Timestamp(0)).total_seconds()) + out.attrs["shift_s"],
                     time_zone=TIMEZONE)
    return out
