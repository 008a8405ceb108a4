"""Reader for the Acme/Kalos (NSDI'24) 319-job extract in ``../shared/traces/acme-kalos-subset``.

PATH may be the directory (``kalos_subset_decoded.csv`` is read when present, else
``converted_kalos_trace.csv``) or either file; the form is recognised by its header:

- decoded: ``job_idx``, ``submit_offset_s`` (s), ``duration_s`` (s), ``gpu_num``, ``type_group`` (tenant).
- converted (third-party "tethys" form), decoded as in its SOURCE.md: ``duration_s = num_iteration * 0.5``,
  ``num_gpus = gpu_workers * gpu_per_worker``, tenant ``Pretrain`` if ``iteration_networking_time == 0.75``,
  ``Other_or_SFT`` if ``0.25`` (any other value raises); ``submit = arrival_time``, id = ``job_id``.

Both forms give identical tables. Rules: duplicate ids raise; zero durations are skipped
(``skipped["zero_duration"]``). The extract is completed-only and biased to large pretraining gangs:
a source of job shapes, not a representative arrival trace (see SOURCE.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.tableio import (existing_path, first, numeric, raise_first, read_csv_strings, require_columns,
                            row_numbers, string_column)

DECODED = "kalos_subset_decoded.csv"
CONVERTED = "converted_kalos_trace.csv"
DECODED_COLUMNS = ("job_idx", "submit_offset_s", "duration_s", "gpu_num", "type_group")
CONVERTED_COLUMNS = ("job_id", "arrival_time", "num_iteration", "gpu_workers", "gpu_per_worker",
                     "iteration_networking_time")
TYPE_BY_NETWORKING_TIME = {0.75: "Pretrain", 0.25: "Other_or_SFT"}


def _resolve(path: str) -> Path:
    p = existing_path(path, want_dir=None)
    if not p.is_dir():
        return p
    for name in (DECODED, CONVERTED):
        if (p / name).is_file():
            return p / name
    raise InputError(f"directory holds neither {DECODED} nor {CONVERTED}", file=str(path))


def _ids(df: pd.DataFrame, col: str, file: str) -> np.ndarray:
    raise_first([first(df[col].isna().to_numpy(), col, "missing job id")], file=file)
    return string_column(df, col)


def _decoded(df: pd.DataFrame, file: str) -> dict:
    require_columns(df, DECODED_COLUMNS, file=file, what="acme (decoded)")
    submit, p1 = numeric(df, "submit_offset_s")
    duration, p2 = numeric(df, "duration_s")
    gpus, p3 = numeric(df, "gpu_num", integer=True, positive=True)
    raise_first([*p1, *p2, *p3], file=file)
    return {"job_id": _ids(df, "job_idx", file), "submit_s": submit, "duration_s": duration, "num_gpus": gpus,
            "tenant": string_column(df, "type_group")}


def _converted(df: pd.DataFrame, file: str) -> dict:
    require_columns(df, CONVERTED_COLUMNS, file=file, what="acme (converted)")
    submit, p1 = numeric(df, "arrival_time")
    iters, p2 = numeric(df, "num_iteration", integer=True)
    workers, p3 = numeric(df, "gpu_workers", integer=True, positive=True)
    per_worker, p4 = numeric(df, "gpu_per_worker", positive=True)
    net, p5 = numeric(df, "iteration_networking_time")
    gpus = workers * per_worker
    with np.errstate(invalid="ignore"):
        frac = np.isfinite(gpus) & (gpus != np.round(gpus))
    known = np.isin(net, list(TYPE_BY_NETWORKING_TIME))
    raise_first([*p1, *p2, *p3, *p4, *p5,
                 first(frac, "gpu_per_worker", "gpu_workers * gpu_per_worker is not a whole number",
                       df["gpu_per_worker"]),
                 first(~known & np.isfinite(net), "iteration_networking_time",
                       "expected 0.75 (Pretrain) or 0.25 (Other_or_SFT)", df["iteration_networking_time"])],
                file=file)
    tenant = np.where(net == 0.75, TYPE_BY_NETWORKING_TIME[0.75], TYPE_BY_NETWORKING_TIME[0.25]).astype(object)
    return {"job_id": _ids(df, "job_id", file), "submit_s": submit, "duration_s": iters * 0.5,
            "num_gpus": np.round(gpus), "tenant": tenant}


def read_acme(path: str) -> pd.DataFrame:
    """Read the Acme/Kalos extract (directory, decoded CSV or converted CSV) into the common table.

    Returns:
        The common trace table; times in seconds; tenant = ``Pretrain`` / ``Other_or_SFT``.

    Raises:
        InputError: missing/unreadable file, unrecognised header (names the columns of both forms),
            bad value (file, row, field), duplicate job id, no jobs.
    """
    p = _resolve(path)
    file = str(p)
    df = read_csv_strings(p)
    if "num_iteration" in df.columns:
        cols = _converted(df, file)
    else:
        cols = _decoded(df, file)
    return finish_frame(**cols, rows=row_numbers(df), file=file, fmt="acme")
