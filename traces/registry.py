"""Trace formats by name, and the single entry point :func:`read_trace`.

Spec syntax: ``FORMAT:ARG``. For file formats ARG is a path (relative to the working directory or
absolute); for ``synthetic`` it is ``default`` or ``key=value,...`` options (see :mod:`tlora_sim.traces.synthetic`).

======== ================================================ ==================================
format   ARG                                              module
======== ================================================ ==================================
acme     Acme/Kalos extract directory or either CSV       :mod:`tlora_sim.traces.acme`
csv      any CSV; needs ``csv_columns`` (+ ``time_unit``)   :mod:`tlora_sim.traces.generic_csv`
itp      ITP ``clusterNN.csv[.gz]`` or their directory    :mod:`tlora_sim.traces.itp`
philly   Philly CSV (US/Pacific local timestamps)         :mod:`tlora_sim.traces.philly`
synthetic ``default`` or ``jobs=N,seed=S,load=L,...``     :mod:`tlora_sim.traces.synthetic`
======== ================================================ ==================================
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Mapping

import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.frame import validate_frame


@dataclass(frozen=True)
class Reader:
    """A registered format: ``target`` is ``"module:function"`` (imported on first use) or a callable
    ``f(arg: str) -> DataFrame``; ``csv_options`` readers also take ``csv_columns`` and ``time_unit``."""

    target: str | Callable[..., pd.DataFrame]
    description: str
    csv_options: bool = False

    def load(self) -> Callable[..., pd.DataFrame]:
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


_READERS: dict[str, Reader] = {
    "acme": Reader("tlora_sim.traces.acme:read_acme", "Acme/Kalos 319-job extract (directory or CSV)"),
    "csv": Reader("tlora_sim.traces.generic_csv:read_csv_trace", "any CSV with a column mapping", csv_options=True),
    "itp": Reader("tlora_sim.traces.itp:read_itp", "Microsoft ITP clusterNN.csv[.gz] (file or directory)"),
    "philly": Reader("tlora_sim.traces.philly:read_philly", "Microsoft Philly CSV (US/Pacific timestamps)"),
    "synthetic": Reader("tlora_sim.traces.synthetic:read_synthetic", "generator fitted to ITP statistics"),
}


def register_reader(name: str, reader: Reader) -> None:
    """Add or replace a format (name is lower-cased)."""
    _READERS[name.lower()] = reader


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


def read_trace(spec: str, *, csv_columns: Mapping[str, str] | None = None, time_unit: str = "s") -> pd.DataFrame:
    """Read a trace given as ``FORMAT:PATH`` (or ``synthetic:OPTIONS``) into the common table.

    Args:
        spec: e.g. ``"itp:../shared/traces/msr-itp-elasticflow/cluster02.csv.gz"``, ``"synthetic:default"``.
        csv_columns: column mapping, only for the ``csv`` format (see :mod:`tlora_sim.traces.generic_csv`).
        time_unit: ``s``/``ms``/``min``/``h``, only for the ``csv`` format.

    Returns:
        DataFrame with columns ``job_id, submit_time_s, duration_s, num_gpus, tenant`` and attrs
        ``source`` (= spec), ``format``, ``path``, ``skipped`` (see :mod:`tlora_sim.traces.frame`).

    Raises:
        InputError: bad spec, unknown format, csv options given to another format, missing file,
            or any bad input found by the reader (file, row, field in the error).
    """
    fmt, arg = split_spec(spec)
    reader = _READERS[fmt]
    if reader.csv_options:
        df = reader.load()(arg, csv_columns, time_unit)
    else:
        if csv_columns:
            raise InputError(f"a column mapping applies only to the csv format, not {fmt!r}", field="csv_columns")
        if time_unit != "s":
            raise InputError(f"time_unit applies only to the csv format, not {fmt!r}", field="time_unit")
        df = reader.load()(arg)
    df.attrs["source"] = spec
    df.attrs["format"] = fmt
    validate_frame(df, df.attrs.get("path", arg))
    return df
