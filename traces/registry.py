"""Trace formats by name, and the single entry point :func:`read_trace`.

Spec syntax: ``FORMAT:ARG``. For file formats ARG is a path (relative to the working directory or
absolute); for ``synthetic`` it is ``default`` or ``key=value,...`` options (see :mod:`tlora_sim.traces.synthetic`).

======== ================================================ ==================================
format   ARG                                              module
======== ================================================ ==================================
acme     Acme/Kalos extract directory or either CSV       :mod:`tlora_sim.traces.acme`
csv      any CSV; needs ``csv_columns`` (+ ``time_unit``,  :mod:`tlora_sim.traces.generic_csv`
         ``time_zone``)
itp      ITP ``clusterNN.csv[.gz]`` or their directory    :mod:`tlora_sim.traces.itp`
philly   Philly CSV (US/Pacific local timestamps)         :mod:`tlora_sim.traces.philly`
slurm    ``sacct --parsable2`` export (+ ``time_zone``,   :mod:`tlora_sim.traces.slurm`
         ``slurm_states``)
synthetic ``default`` or ``jobs=N,seed=S,load=L,...``     :mod:`tlora_sim.traces.synthetic`
======== ================================================ ==================================
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import validate_frame


OPTION_DEFAULTS: dict[str, Any] = {"csv_columns": None, "time_unit": "s", "time_zone": None, "slurm_states": None,
                                   "keep_states": None}
"""Reader options of :func:`read_trace` and the value that means "not given"."""


@dataclass(frozen=True)
class Reader:
    """A registered format: ``target`` is ``"module:function"`` (imported on first use) or a callable
    ``f(arg: str, **options) -> DataFrame``; ``options`` names the keyword options (keys of
    :data:`OPTION_DEFAULTS`) it takes. ``csv_options=True`` (older form) means csv_columns and time_unit,
    passed positionally."""

    target: str | Callable[..., pd.DataFrame]
    description: str
    csv_options: bool = False
    options: tuple[str, ...] = ()

    def load(self) -> Callable[..., pd.DataFrame]:
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


_READERS: dict[str, Reader] = {
    "acme": Reader("tlora_sim.traces.acme:read_acme", "Acme/Kalos 319-job extract (directory or CSV)"),
    "csv": Reader("tlora_sim.traces.generic_csv:read_csv_trace", "any CSV with a column mapping",
                  options=("csv_columns", "time_unit", "time_zone", "keep_states")),
    "itp": Reader("tlora_sim.traces.itp:read_itp", "Microsoft ITP clusterNN.csv[.gz] (file or directory)"),
    "philly": Reader("tlora_sim.traces.philly:read_philly", "Microsoft Philly CSV (US/Pacific timestamps)"),
    "slurm": Reader("tlora_sim.traces.slurm:read_slurm", "Slurm sacct --parsable2 export ('|' separated)",
                    options=("time_zone", "slurm_states")),
    "synthetic": Reader("tlora_sim.traces.synthetic:read_synthetic", "generator fitted to ITP statistics"),
}


def register_reader(name: str, reader: Reader) -> None:
    """Add or replace a format (name is lower-cased)."""
    _READERS[name.lower()] = reader


def format_descriptions() -> dict[str, str]:
    """Registered format name -> one-line description (what ``--trace`` help lists)."""
    return {k: _READERS[k].description for k in sorted(_READERS)}


def format_options(fmt: str) -> tuple[str, ...]:
    """The reader options (keys of :data:`OPTION_DEFAULTS`) format ``fmt`` takes; () for an unknown one."""
    r = _READERS.get(str(fmt).lower())
    if r is None:
        return ()
    return tuple(dict.fromkeys((*r.options, *(("csv_columns", "time_unit") if r.csv_options else ()))))


def known_formats() -> list[str]:
    """Registered format names, sorted."""
    return sorted(_READERS)


def split_spec(spec: str) -> tuple[str, str]:
    """Split ``FORMAT:ARG`` into (lower-case format, arg).

    Raises:
        InputError (field ``trace``): no ``:``, unknown format (the message lists the known ones), empty ARG.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise InputError(f"trace spec must be FORMAT:PATH, got {spec!r}; known formats: "
                         f"{', '.join(known_formats())}", field="trace")
    fmt, arg = spec.split(":", 1)
    fmt = fmt.strip().lower()
    if fmt not in _READERS:
        raise InputError(f"unknown trace format {fmt!r}; known formats: {', '.join(known_formats())}",
                         field="trace")
    if not arg.strip() and fmt != "synthetic":
        raise InputError(f"trace spec {spec!r} has no path after '{fmt}:'", field="trace")
    return fmt, arg.strip()


def read_trace(spec: str, *, csv_columns: Mapping[str, str] | None = None, time_unit: str = "s",
               time_zone: str | None = None, slurm_states: str | Sequence[str] | None = None,
               keep_states: str | Sequence[str] | None = None, window: str | None = None,
               first_jobs: int | None = None, arrival_scale: float | None = None) -> pd.DataFrame:
    """Read a trace given as ``FORMAT:PATH`` (or ``synthetic:OPTIONS``) into the common table.

    Args:
        spec: e.g. ``"itp:../shared/traces/msr-itp-elasticflow/cluster02.csv.gz"``, ``"slurm:sacct.txt"``.
        csv_columns: column mapping, only for the ``csv`` format (see :mod:`tlora_sim.traces.generic_csv`).
        time_unit: ``s``/``ms``/``min``/``h``, only for the ``csv`` format.
        time_zone: IANA zone of naive timestamps (default UTC), for the ``csv`` and ``slurm`` formats.
        slurm_states: job states kept, for the ``slurm`` format (``"COMPLETED,FAILED"`` or a list;
            default :data:`tlora_sim.traces.slurm.DEFAULT_STATES`).
        keep_states: states kept by the ``csv`` format's ``state`` column (default: all).
        window, first_jobs, arrival_scale: cut and scale the trace, every format
            (:mod:`tlora_sim.traces.window`: ``"START,END"`` in seconds or dates, the first N jobs,
            submit times divided by X).

    Returns:
        DataFrame with columns ``job_id, submit_time_s, duration_s, num_gpus, tenant`` and attrs
        ``source`` (= spec), ``format``, ``path``, ``skipped`` (see :mod:`tlora_sim.traces.frame`).

    Raises:
        InputError: bad spec, unknown format, an option given to a format that does not take it (field =
            the option), missing file, or any bad input found by the reader (file, row, field in the error).
    """
    fmt, arg = split_spec(spec)
    reader = _READERS[fmt]
    given = {"csv_columns": csv_columns, "time_unit": time_unit, "time_zone": time_zone,
             "slurm_states": slurm_states, "keep_states": keep_states}
    takes = set(reader.options) | ({"csv_columns", "time_unit"} if reader.csv_options else set())
    for name, value in given.items():
        if name not in takes and not _is_default(name, value):
            users = sorted(f for f, r in _READERS.items() if name in r.options or
                           (r.csv_options and name in ("csv_columns", "time_unit")))
            what = "a column mapping" if name == "csv_columns" else name
            raise InputError(f"{what} applies only to the {' and '.join(users)} format(s), not {fmt!r}",
                             field=name)
    if reader.csv_options:
        df = reader.load()(arg, csv_columns, time_unit)
    else:
        df = reader.load()(arg, **{k: given[k] for k in reader.options})
    df.attrs["source"] = spec
    df.attrs["format"] = fmt
    if window is not None or first_jobs is not None or arrival_scale is not None:
        from tlora_sim.traces.window import apply_window

        df = apply_window(df, window=window, first_jobs=first_jobs, arrival_scale=arrival_scale)
    validate_frame(df, df.attrs.get("path", arg))
    return df


def _is_default(name: str, value: Any) -> bool:
    """True when option ``name`` is not given (``None``/empty, or csv's default time unit ``s``)."""
    default = OPTION_DEFAULTS[name]
    return value == default or (default is None and not value)
