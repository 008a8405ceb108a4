"""A trace given as a pandas DataFrame (the Python API's ``ts.read_trace(df)``), checked and brought to
the common trace table (:mod:`tlora_sim.traces.frame`).

Columns (any order; other columns are ignored):

=================  ========  ==========================================================================
column             required  meaning
=================  ========  ==========================================================================
``submit_time_s``  yes       submission time, seconds on any origin (finite, >= 0)
``duration_s``     yes       traced run time, seconds (finite, >= 0; 0 is skipped: ``zero_duration``)
``num_gpus``       yes       GPUs requested, a whole number >= 1
``job_id``         no        unique id (default: the 1-based row position)
``tenant``         no        tenant / team / virtual cluster (default ``""``)
``model`` ...      no        LoRA attributes: ``model``, ``rank``, ``seq_len``, ``batch_size``,
                             ``max_slowdown``, ``steps`` (:mod:`tlora_sim.traces.job_attrs`; missing
                             values are drawn from the LoRA distribution)
=================  ========  ==========================================================================

Rows are sorted by submit time (stably) and shifted so the first job is at 0 s, as every reader does.
Errors name ``<DataFrame>``, the 1-based row position and the column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.job_attrs import TRACE_ATTRS, attr_values
from tlora_sim.traces.tableio import first, numeric, raise_first

SOURCE = "<DataFrame>"
REQUIRED = ("submit_time_s", "duration_s", "num_gpus")


def from_dataframe(df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` (columns in the module docstring) and return the common trace table.

    ``attrs``: ``source`` ``"dataframe:<DataFrame>"``, ``format`` ``"dataframe"``, ``path`` ``"<DataFrame>"``;
    a table that already carries a reader's attrs (the output of ``read_trace``) keeps its ``source``,
    ``format``, ``path``, ``skipped`` and calendar attrs.

    Raises:
        InputError: not a DataFrame, a required column missing, a bad value (row, field), a repeated job id,
            no jobs.
    """
    if not isinstance(df, pd.DataFrame):
        raise InputError(f"a trace is a FORMAT:PATH spec or a pandas DataFrame, got {type(df).__name__}",
                         field="trace")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"DataFrame trace lacks column(s) {missing}; required: {', '.join(REQUIRED)} "
                         f"(optional: job_id, tenant, {', '.join(TRACE_ATTRS)})", file=SOURCE, field=missing[0])
    if len(df) == 0:
        raise InputError("DataFrame trace has no rows", file=SOURCE)
    table = pd.DataFrame({c: _as_text(df[c]) for c in df.columns if c in (*REQUIRED, "job_id", "tenant", *TRACE_ATTRS)})
    table.index = pd.RangeIndex(len(table))
    submit, p1 = numeric(table, "submit_time_s")
    duration, p2 = numeric(table, "duration_s")
    gpus, p3 = numeric(table, "num_gpus", integer=True, positive=True)
    problems = [*p1, *p2, *p3]
    if "job_id" in table.columns:
        problems.append(first(df["job_id"].isna().to_numpy(), "job_id", "missing job id"))
    attrs = {}
    for key in TRACE_ATTRS:
        if key in table.columns:
            attrs[key], found = attr_values(table, key, key)
            problems += found
    rows = np.arange(1, len(table) + 1)
    raise_first(problems, file=SOURCE, rows=rows)
    job_id = df["job_id"].astype(str).str.strip().to_numpy(dtype=object) if "job_id" in df.columns \
        else rows.astype(str)
    tenant = df["tenant"].fillna("").astype(str).str.strip().to_numpy(dtype=object) if "tenant" in df.columns \
        else np.full(len(df), "", dtype=object)
    out = finish_frame(job_id=job_id, submit_s=submit, duration_s=duration, num_gpus=gpus.astype(np.int64),
                       tenant=tenant, rows=rows, file=SOURCE, fmt="dataframe",
                       skipped=dict(df.attrs.get("skipped", {})), attrs=attrs,
                       attr_columns={k: df.attrs.get("attr_columns", {}).get(k, k) for k in attrs})
    for key in ("source", "format", "path", "epoch_s", "time_zone", "origin"):
        if key in df.attrs and key != "origin":
            out.attrs[key] = df.attrs[key]
    if "origin" in df.attrs and df["submit_time_s"].is_monotonic_increasing and len(df.attrs["origin"]) == len(df):
        out.attrs["origin"] = df.attrs["origin"]  # a reader's table: errors keep naming its file and rows
    return out


def _as_text(col: pd.Series) -> pd.Series:
    """A column as the strings-or-NaN the tableio checks take (numbers kept exact through repr)."""
    return col.astype(object).map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
