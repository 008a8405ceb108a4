"""Reader for Slurm accounting exports, ``sacct --parsable2`` (format name ``slurm``).

Export, for example::

    SLURM_TIME_FORMAT=standard sacct --allusers --parsable2 --starttime 2024-05-01 --endtime 2024-06-01 \\
        --format JobID,Submit,Start,End,Elapsed,AllocTRES,State,Account > sacct.txt

The file is ``|``-separated with a header line (``--parsable``, with a trailing ``|``, is read too). Columns
(names as sacct writes them, case-sensitive):

=============== =========================================================================================
``JobID``       required; ``123``, array tasks ``123_4`` (kept as separate jobs), heterogeneous components
                ``123+0``; job steps (``123.batch``, ``123.extern``, ``123.0``) are skipped (``job_steps``)
``Submit``      required; ``YYYY-MM-DDTHH:MM:SS``, the cluster's local time (``time_zone``, default UTC)
``Start``       required; ``Unknown``/``None``/empty = the job never started (skipped, ``never_started``)
``End``         ``End`` or ``Elapsed`` required; runtime = ``End - Start`` when ``End`` is there (an end
``Elapsed``     before the start raises), else ``Elapsed`` (``[D-][HH:]MM:SS``). A kept job whose
                ``End`` is ``Unknown`` (still running) is skipped (``no_end``)
GPUs            the first of ``AllocTRES``, ``AllocGRES``, ``ReqTRES``, ``ReqGRES`` that is present and
                non-empty in the row: TRES lists ``billing=8,cpu=8,gres/gpu=4,mem=64G,node=1`` (the
                untyped ``gres/gpu=N``, else the sum of typed ``gres/gpu:a100=N``), GRES lists ``gpu:4``,
                ``gpu:a100:4``, ``gpu:a100:4(IDX:0-3)`` (summed over ``gpu`` entries). No GPU entry =
                0 GPUs: skipped (``zero_gpus``). At least one of these columns is required.
``State``       required; the first word, upper case (``CANCELLED by 123`` -> ``CANCELLED``; a trailing
                ``+`` is dropped). ``PENDING`` = never started. Kept states: ``slurm_states`` (default
                :data:`DEFAULT_STATES`); other states are skipped as ``state_<name>`` (``state_running``)
``Account``     optional tenant (else ``Partition``, else ``""``)
``Comment``     optional LoRA attributes of the job (else ``JobName``): ``key=value`` items separated by ``;``
                with keys ``model``, ``rank``, ``seq_len``, ``batch_size``, ``max_slowdown``, ``steps``
                (``sbatch --comment "model=llama3-8b;rank=16"``; export with ``--format ...,Comment``); other
                items are ignored, attributes not given are drawn (:mod:`tlora_sim.traces.job_attrs`)
=============== =========================================================================================

Only these columns are parsed; other columns of the export cost nothing.

Skips are applied in the order steps, never started, state, zero GPUs, no end; each row is counted once,
under its first reason. A job id repeated after these skips (``sacct --duplicates``) raises.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import finish_frame
from tlora_sim.traces.job_attrs import comment_attrs
from tlora_sim.traces.tableio import (Problem, first, raise_first, read_csv_strings, require_columns, row_numbers,
                                     shift_problems, string_column)
from tlora_sim.traces.timestamps import check_time_zone, elapsed_seconds, slurm_time_column

DEFAULT_STATES: tuple[str, ...] = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL")
"""States kept by default: every job that ran and ended. CANCELLED jobs count only if they started
(cancelled while pending they have no start and are skipped as ``never_started``)."""
KNOWN_STATES: tuple[str, ...] = DEFAULT_STATES + (
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "RUNNING", "REQUEUED", "RESIZING", "REVOKED", "SUSPENDED")
"""Job states sacct reports for jobs that started (``man sacct``, JOB STATE CODES; PENDING jobs never ran
and are always skipped); ``slurm_states`` must name some of these."""
GPU_COLUMNS: tuple[str, ...] = ("AllocTRES", "AllocGRES", "ReqTRES", "ReqGRES")
ATTR_FIELDS: tuple[str, ...] = ("Comment", "JobName")
"""Where a job's LoRA attributes are looked for, first present column wins."""
USED_COLUMNS: tuple[str, ...] = ("JobID", "Submit", "Start", "End", "Elapsed", *GPU_COLUMNS, "State", "Account",
                                 "Partition", *ATTR_FIELDS)
"""The columns the reader parses (the rest of an export is skipped unparsed)."""
NOT_STARTED = frozenset({"", "UNKNOWN", "NONE"})
_TRES_UNTYPED = r"(?:^|,)\s*gres/gpu=([^,]*)"
_TRES_TYPED = r"(?:^|,)\s*gres/gpu:[^=,]+=([^,]*)"
_GRES_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)(?:\(.*\))?$|^gpu(?:\(.*\))?$")


def parse_states(states: str | Sequence[str] | None) -> tuple[str, ...]:
    """The kept states from ``"COMPLETED,FAILED"`` or a list (case-insensitive); None -> :data:`DEFAULT_STATES`.

    Raises:
        InputError (field ``slurm_states``): an empty list or a state sacct does not report.
    """
    if states is None or (isinstance(states, str) and not states.strip()):
        return DEFAULT_STATES
    items = states.split(",") if isinstance(states, str) else list(states)
    out = tuple(dict.fromkeys(str(s).strip().upper() for s in items if str(s).strip()))
    bad = [s for s in out if s not in KNOWN_STATES]
    if bad or not out:
        raise InputError(f"unknown Slurm state(s) {', '.join(bad) or '(none given)'}; known: "
                         f"{', '.join(KNOWN_STATES)}", field="slurm_states")
    return out


def tres_gpus(text: str) -> float:
    """GPUs in a TRES list (``cpu=8,gres/gpu=4,mem=64G``): the untyped ``gres/gpu`` count, else the sum of
    typed ``gres/gpu:TYPE`` counts, else 0. NaN when a count is not a whole number."""
    found = re.findall(_TRES_UNTYPED, text) or re.findall(_TRES_TYPED, text)
    return _sum_counts(found)


def gres_gpus(text: str) -> float:
    """GPUs in a GRES list (``gpu:4``, ``gpu:a100:2(IDX:0-1),gpu:v100:2``): the sum of ``gpu`` entries
    (a bare ``gpu`` is 1), 0 without one; NaN when a ``gpu`` entry has no readable count."""
    total = 0.0
    for item in re.split(r",(?![^()]*\))", text):
        item = item.strip()
        if not (item == "gpu" or item.startswith(("gpu:", "gpu("))):
            continue
        m = _GRES_GPU.match(item)
        if m is None:
            return float("nan")
        total += int(m.group(1)) if m.group(1) else 1
    return total


def _sum_counts(found: list[str]) -> float:
    counts = [c.strip() for c in found]
    if not all(c.isdigit() for c in counts):
        return float("nan")
    return float(sum(int(c) for c in counts))


def _gpu_counts(df: pd.DataFrame) -> tuple[np.ndarray, list[Problem]]:
    """GPUs per row from the first present, non-empty GPU column of :data:`GPU_COLUMNS` (NaN where bad)."""
    gpus = np.full(len(df), np.nan)
    source = np.full(len(df), "", dtype=object)
    for col in (c for c in GPU_COLUMNS if c in df.columns):
        cells = df[col].fillna("").str.strip()
        todo = np.isnan(gpus) & (source == "") & (cells != "").to_numpy()
        parse = tres_gpus if col.endswith("TRES") else gres_gpus
        gpus[todo] = [parse(v) for v in cells[todo]]
        source[todo] = col
    problems = []
    for col in GPU_COLUMNS:
        bad = (source == col) & np.isnan(gpus)
        problems.append(first(bad, col, "GPU count is not a whole number", df[col] if col in df.columns else None))
    gpus[source == ""] = 0.0  # no GPU column filled in: no GPUs
    return gpus, [p for p in problems if p is not None]


def read_slurm(path: str, time_zone: str | None = None,
               slurm_states: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Read a ``sacct --parsable2`` export into the common trace table (rules in the module docstring).

    Args:
        path: the export (plain or compressed by extension).
        time_zone: IANA zone of the cluster's clock (Submit/Start/End are its local time); default UTC.
        slurm_states: states kept, e.g. ``"COMPLETED,FAILED"``; default :data:`DEFAULT_STATES`.

    Returns:
        The common table; ``attrs["skipped"]`` has ``job_steps``, ``never_started``, ``state_<name>`` for
        each state not kept, ``zero_gpus``, ``no_end`` and ``zero_duration``.

    Raises:
        InputError: bad time zone or state list, missing/unreadable file, missing column, bad time, elapsed
            time or GPU count, End before Start (file, row, field), duplicate job id, no jobs left.
    """
    tz = check_time_zone(time_zone)
    keep_states = parse_states(slurm_states)
    file = str(path)
    df = read_csv_strings(path, sep="|", quoting=False, usecols=USED_COLUMNS)
    require_columns(df, ("JobID", "Submit", "Start", "State"), file=file, what="slurm")
    if "End" not in df.columns and "Elapsed" not in df.columns:
        require_columns(df, ("End",), file=file, what="slurm (End or Elapsed)")
    if not any(c in df.columns for c in GPU_COLUMNS):
        require_columns(df, ("AllocTRES",), file=file, what=f"slurm (one of {', '.join(GPU_COLUMNS)})")
    rows_all = row_numbers(df)
    raise_first([first(df["JobID"].isna().to_numpy(), "JobID", "missing job id")], file=file, rows=rows_all)
    job_id = df["JobID"].str.strip()
    state = df["State"].fillna("").str.strip().str.split().str[0].fillna("").str.rstrip("+").str.upper()
    start_raw = df["Start"].fillna("").str.strip()
    reasons = pd.Series("", index=df.index, dtype=object)

    def skip(mask, reason):  # a row keeps its first reason; reason is a str or a per-row Series
        m = (reasons == "").to_numpy() & np.asarray(mask, dtype=bool)
        reasons[m] = reason[m] if isinstance(reason, pd.Series) else reason

    skip(job_id.str.contains(".", regex=False), "job_steps")
    skip(start_raw.str.upper().isin(NOT_STARTED) | (state == "PENDING"), "never_started")
    skip(~state.isin(keep_states), state.map(lambda s: f"state_{s.lower() or 'missing'}"))
    gpus, problems = _gpu_counts(df)
    problems = [p for p in problems if reasons.iloc[p.index] == ""]
    raise_first(problems, file=file, rows=rows_all)
    skip(gpus == 0, "zero_gpus")
    if "End" in df.columns:
        skip(df["End"].fillna("").str.strip().str.upper().isin(NOT_STARTED), "no_end")
    kept = np.flatnonzero((reasons == "").to_numpy())
    skipped = {r: int(n) for r, n in reasons[reasons != ""].value_counts().sort_index().items()}
    for r in ("job_steps", "never_started", "zero_gpus"):
        skipped.setdefault(r, 0)
    if len(kept) == 0:
        detail = ", ".join(f"{r} {n}" for r, n in skipped.items() if n)
        raise InputError(f"no jobs left in {len(df)} rows (skipped: {detail}); kept states: "
                         f"{', '.join(keep_states)}", file=file)
    sub = df.iloc[kept]
    submit, p1 = slurm_time_column(sub, "Submit", tz)
    start, p2 = slurm_time_column(sub, "Start", tz)
    if "End" in df.columns:
        end, p3 = slurm_time_column(sub, "End", tz)
        raise_first(shift_problems([*p1, *p2, *p3], kept), file=file, rows=rows_all)
        early = first(end < start, "End", "End precedes Start", sub["End"])
        raise_first(shift_problems([early], kept), file=file, rows=rows_all)
        duration = end - start
    else:
        duration, p3 = elapsed_seconds(sub, "Elapsed")
        raise_first(shift_problems([*p1, *p2, *p3], kept), file=file, rows=rows_all)
    tenant_col = next((c for c in ("Account", "Partition") if c in df.columns), None)
    attrs: dict = {}
    attr_col = next((c for c in ATTR_FIELDS if c in df.columns), None)
    if attr_col is not None:
        attrs, problems = comment_attrs(sub[attr_col], attr_col)
        raise_first(shift_problems(problems, kept), file=file, rows=rows_all)
    out = finish_frame(job_id=job_id.to_numpy(dtype=object)[kept], submit_s=submit, duration_s=duration,
                       num_gpus=gpus[kept].astype(np.int64), tenant=string_column(sub, tenant_col),
                       rows=rows_all[kept], file=file, fmt="slurm", skipped=skipped, attrs=attrs,
                       attr_columns={k: f"{attr_col}.{k}" for k in attrs})
    out.attrs.update(epoch_s=out.attrs["shift_s"], time_zone=tz)
    return out
