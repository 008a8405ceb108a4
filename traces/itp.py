"""Reader for the Microsoft ITP traces (ElasticFlow, ASPLOS'23): ``clusterNN.csv.gz`` or ``.csv``.

Columns: ``job_id`` (UUID), ``submission_time`` (s from collection start), ``duration`` (s),
``num_gpu``. See ``../shared/traces/msr-itp-elasticflow/SOURCE.md``.

PATH may be one file (tenant ``""``: the trace has no tenant) or the directory holding the
``cluster*.csv[.gz]`` files: all clusters are merged into one stream (they share the same time origin)
and the tenant is the cluster name (``"cluster02"``).

Rules: duplicate job ids raise (within a file and across merged files); zero durations are skipped
(``skipped["zero_duration"]``; the published files have none).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import check_unique_ids, finish_frame
from tlora_sim.traces.tableio import (existing_path, first, numeric, raise_first, read_csv_strings, require_columns,
                            row_numbers)

REQUIRED = ("job_id", "submission_time", "duration", "num_gpu")


def cluster_files(directory: Path) -> list[Path]:
    """The `cluster*.csv[.gz]` files of an ITP directory, sorted by name.

    Raises:
        InputError: none found.
    """
    files = sorted(p for p in directory.iterdir()
                   if p.name.startswith("cluster") and p.name.endswith((".csv", ".csv.gz")))
    if not files:
        raise InputError("no clusterNN.csv[.gz] files in directory", file=str(directory))
    return files


def _parse_file(path: Path) -> dict[str, np.ndarray]:
    """Parse and check one ITP file; returns raw columns (submit not yet shifted) and row numbers."""
    file = str(path)
    df = read_csv_strings(path)
    require_columns(df, REQUIRED, file=file, what="itp")
    submit, p1 = numeric(df, "submission_time")
    duration, p2 = numeric(df, "duration")
    gpus, p3 = numeric(df, "num_gpu", integer=True, positive=True)
    ids = df["job_id"]
    raise_first([first(ids.isna().to_numpy(), "job_id", "missing job id"), *p1, *p2, *p3], file=file)
    rows = row_numbers(df)
    job_id = ids.str.strip().to_numpy(dtype=object)
    check_unique_ids(job_id, rows, file)
    return {"job_id": job_id, "submit": submit, "duration": duration, "gpus": gpus.astype(np.int64),
            "rows": rows}


def read_itp(path: str) -> pd.DataFrame:
    """Read one ITP cluster file, or merge every ``cluster*.csv[.gz]`` in a directory.

    Args:
        path: file or directory.

    Returns:
        The common trace table (see :mod:`tlora_sim.traces.frame`); times in seconds.

    Raises:
        InputError: missing/unreadable file, missing column, bad value (file, row, field), duplicate
            job id, no jobs.
    """
    p = existing_path(path, want_dir=None)
    if not p.is_dir():
        cols = _parse_file(p)
        tenant = np.full(len(cols["job_id"]), "", dtype=object)
        return finish_frame(job_id=cols["job_id"], submit_s=cols["submit"], duration_s=cols["duration"],
                            num_gpus=cols["gpus"], tenant=tenant, rows=cols["rows"], file=str(path), fmt="itp",
                            check_ids=False)
    files = cluster_files(p)
    parts = [_parse_file(f) for f in files]
    which = np.concatenate([np.full(len(c["job_id"]), k) for k, c in enumerate(parts)])
    names = np.array([f.name.split(".")[0] for f in files], dtype=object)[which]
    merged = {k: np.concatenate([c[k] for c in parts]) for k in parts[0]}
    dup = pd.Series(merged["job_id"]).duplicated().to_numpy()
    if dup.any():
        i = int(np.argmax(dup))
        j = int(np.argmax(merged["job_id"] == merged["job_id"][i]))
        raise InputError(f"duplicate job id {merged['job_id'][i]!r} (also in {files[which[j]].name} "
                         f"row {merged['rows'][j]})", file=str(files[which[i]]), row=int(merged["rows"][i]),
                         field="job_id")
    return finish_frame(job_id=merged["job_id"], submit_s=merged["submit"], duration_s=merged["duration"],
                        num_gpus=merged["gpus"], tenant=names, rows=merged["rows"], file=str(path), fmt="itp",
                        check_ids=False, files=np.array([str(f) for f in files], dtype=object)[which])
