"""The sweep definition: SWEEP.toml's keys, their validation (every value checked before any
cell runs, one error naming the file and the key), and the cells (one per combination) with
their content-addressed ids."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tlora_sim.traces.errors import InputError



from tlora_sim.sim.experiments.spec import (ExperimentSpec, read_key, sweep_default,  # noqa: E402
                                            sweep_knobs)

#: SWEEP.toml's keys, from the experiment spec (``spec.sweep_knobs``): the axes (lists, one cell per
#: value), the keys one value holds for every cell, and the policy-options table.
LIST_KEYS = tuple(key for key, (_, k) in sweep_knobs().items() if k.axis)
TABLE_KEYS = ("policy_options",)
SCALAR_KEYS = tuple(key for key, (_, k) in sweep_knobs().items() if not k.axis and key not in TABLE_KEYS)
DEFAULTS: dict[str, list] = {key: sweep_default(name) for key, (name, k) in sweep_knobs().items()
                             if k.axis and key not in ("traces", "policies")}
#: Reader options (the one-value keys ``traces describe`` takes too), named as the formats' options
#: (``traces.registry.format_options``); a sweep passes each only to the traces whose format takes it.
READER_OPTIONS = tuple(key for key, (_, k) in sweep_knobs().items() if "describe" in k.commands and not k.axis)
REQUIRED = ("traces", "policies")

INPUT_COLUMNS = ["trace", "cluster", "policy", "seed", "lora_dist", "regroup_pause_s", "cost_model",
                 "policy_options", "discipline", "window", "first_jobs", "arrival_scale"]
FAILED_COLUMNS = ["cell_id", *INPUT_COLUMNS, "error", "message"]


# ---- the sweep definition ------------------------------------------------------------------------
IDENTITY_FIELDS = ("trace", "cluster", "policy", "seed", "lora_dist", "regroup_pause_s", "cost_model",
                   "policy_options", "csv_columns", "time_unit", "strict")
"""The spec fields every cell id hashes (the first sweeps' keys)."""
LATER_IDENTITY_FIELDS = ("time_zone", "slurm_states", "discipline", "artifact", "window", "first_jobs",
                         "arrival_scale")
"""Spec fields that sweep keys set since: they enter a cell's id only where not at their default, so the
cells of older sweeps keep their ids. ``policy_modules`` and ``reference`` never do (they say where a
policy comes from and what the speed-ups are against, not what is simulated)."""


@dataclass(frozen=True)
class Cell:
    """One combination of the sweep: the experiment spec as written in SWEEP.toml, and where its
    files are.

    Attributes:
        spec: the ``ExperimentSpec`` as written (paths as in the file, the policy's own options
            without the discipline's); its fields read as the cell's (``cell.trace``,
            ``cell.seed``, ...); ``policy_options`` and ``csv_columns`` read as sorted
            ``(key, value)`` pairs.
        trace_run: the trace spec with its path resolved (what the replay reads).
        lora_dist_run: the distribution name or resolved JSON path.
        artifact_run: the cost-model artifact resolved against the sweep file's folder, or None.
    """

    spec: ExperimentSpec
    trace_run: str = ""
    lora_dist_run: str = ""
    artifact_run: str | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "spec":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.spec, name)

    @property
    def policy_options(self) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted(self.spec.policy_options.items()))

    @property
    def csv_columns(self) -> tuple[tuple[str, str], ...] | None:
        cols = self.spec.csv_columns
        return tuple(sorted(cols.items())) if cols is not None else None

    def identity(self) -> dict:
        """The canonical inputs the id hashes (paths as written, not as resolved):
        ``IDENTITY_FIELDS``, and ``LATER_IDENTITY_FIELDS`` where set."""
        defaults = ExperimentSpec(trace="", policy="")
        out = {name: getattr(self.spec, name) for name in IDENTITY_FIELDS}
        out["regroup_pause_s"] = float(out["regroup_pause_s"])
        out["policy_options"] = dict(out["policy_options"])
        out["csv_columns"] = dict(out["csv_columns"]) if out["csv_columns"] is not None else None
        for name in LATER_IDENTITY_FIELDS:
            value = getattr(self.spec, name)
            if value is not None and value != "" and value != getattr(defaults, name):
                out[name] = value
        return out

    @property
    def cell_id(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON of :meth:`identity`."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def inputs_row(self) -> dict:
        """The ``INPUT_COLUMNS`` values (policy options as compact JSON)."""
        row = {name: getattr(self.spec, name) for name in INPUT_COLUMNS}
        row["regroup_pause_s"] = float(row["regroup_pause_s"])
        row["policy_options"] = json.dumps(dict(self.spec.policy_options), sort_keys=True, separators=(",", ":"))
        return row


@dataclass(frozen=True)
class Sweep:
    """A parsed SWEEP.toml: its path, the value lists and the cells (cross product, in list order)."""

    path: str
    lists: dict[str, list]
    policy_options: dict[str, dict]
    cells: list[Cell] = field(default_factory=list)

    def describe(self) -> dict:
        """What ``DIR/sweep.json`` records."""
        return {"sweep_file": self.path, **self.lists, "policy_options": self.policy_options,
                "cells": [{"cell_id": c.cell_id, **c.identity()} for c in self.cells]}


def load_sweep(path: str | Path) -> Sweep:
    """Read, validate and expand SWEEP.toml.

    Raises:
        InputError: unreadable file or bad TOML (file named), unknown key, a value of the wrong type,
            an empty or duplicated list, an unknown trace format / cluster / policy / policy option /
            LoRA distribution / cost model, a missing trace file (file and field named, with what
            was expected).
    """
    import tomllib

    path = Path(path)
    file = str(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read sweep file ({e.strerror or e})", file=file) from None
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"sweep file is not UTF-8 ({e.reason})", file=file) from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"invalid TOML: {e}", file=file) from None
    return parse_sweep(data, file=file, base_dir=path.resolve().parent)


def parse_sweep(data: dict, *, file: str = "<sweep>", base_dir: str | Path = ".") -> Sweep:
    """Validate a sweep given as a dict (what ``tomllib`` returns); see :func:`load_sweep`.

    Every key is read through the experiment spec (``spec.read_key``: the field's check, for an
    axis on each element); what is left here is what a sweep adds: paths resolved against the
    sweep file's directory, reader options only for the formats that take them, the reference
    added to the policies, and each policy's option sets checked by building the policy once.
    """
    base = Path(base_dir)

    def err(fld: str, message: str) -> InputError:
        return InputError(message, file=file, field=fld)

    known = (*LIST_KEYS, *SCALAR_KEYS, *TABLE_KEYS)
    for key in data:
        if key not in known:
            raise err(key, f"unknown key; expected one of: {', '.join(known)}")
    for key in REQUIRED:
        if key not in data:
            raise err(key, f"missing; expected a list, e.g. {key} = {sweep_knobs()[key][1].example}")
    one = {key: read_key(data, key, err) for key in SCALAR_KEYS}  # one value for every cell
    lists = {key: read_key(data, key, err) for key in LIST_KEYS}  # the axes
    csv_columns, reference, artifact = one["csv_columns"], one["reference"], one["artifact"]
    user_policies = list(lists["policies"])
    if reference not in lists["policies"]:  # the reference baseline is always run (first)
        lists["policies"] = [reference, *lists["policies"]]
    if artifact is not None:
        if not (isinstance(artifact, str) and artifact.strip()):
            raise err("artifact", f"expected the path of a cost-model artifact file, got {artifact!r}")
        from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

        try:
            load_artifact(base / artifact)
        except InputError as e:
            raise err("artifact", e.message) from None
    modules = one["policy_modules"]
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise err("policy_modules", 'expected a list of .py paths or module names, e.g. ["my_policy.py"]')
    modules = [str((base / m).resolve()) if m.endswith(".py") else m for m in modules]
    from tlora_sim.policies.registry import load_policy_module

    for i, m in enumerate(modules):
        try:
            load_policy_module(m)
        except InputError as e:
            raise err(f"policy_modules[{i}]", e.message) from None
    trace_run = {spec: _trace_run(spec, f"traces[{i}]", base, csv_columns, err)
                 for i, spec in enumerate(lists["traces"])}
    from tlora_sim.traces.registry import format_options, split_spec

    trace_formats = {t: split_spec(t)[0] for t in lists["traces"]}
    given = {k: one[k] for k in READER_OPTIONS} | {"time_unit": one["time_unit"] if one["time_unit"] != "s" else None}
    for key, val in given.items():
        if val is None:
            continue
        if not any(key in format_options(f) for f in trace_formats.values()):
            users = sorted({f for f in ("csv", "slurm", "itp", "philly", "acme", "synthetic") if key in format_options(f)})
            raise err(key, f"applies only to traces of the {' and '.join(users)} format(s); no trace of this sweep "
                           f"is one (traces: {', '.join(sorted(set(trace_formats.values())))})")
    dist_run = {name: _dist_run(name, f"lora_dists[{i}]", base, err) for i, name in enumerate(lists["lora_dists"])}
    options = _policy_options(data, lists["policies"], err)
    combos = {name: policy_option_combos(options.get(name, {})) for name in lists["policies"]}
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.experiments.replay import policy_options_with_discipline

    for name in lists["policies"]:  # each distinct option set built once, before any cell runs
        for combo in combos[name]:
            for d in lists["disciplines"]:
                try:
                    make_policy(name, policy_options_with_discipline(name, d, combo))
                except InputError as e:
                    fld = (f"policy_options.{name}.{e.field}" if name in options and e.field in options[name]
                           else f"policies[{user_policies.index(name)}]" if name in user_policies else "reference")
                    raise err(fld, e.message) from None

    def reader(t: str, key: str, value):
        """A reader option as the cell of trace ``t`` gets it: only where its format takes it."""
        return value if key in format_options(trace_formats[t]) else None

    def cell(t, c, p, combo, disc, s, d, r, m, w, n, x) -> Cell:
        fmt_opts = format_options(trace_formats[t])
        written = ExperimentSpec(
            trace=t, policy=p, cluster=c, seed=s, lora_dist=d, policy_options=dict(sorted(combo.items())),
            regroup_pause_s=r, cost_model=m, csv_columns=reader(t, "csv_columns", csv_columns),
            time_unit=one["time_unit"] if "time_unit" in fmt_opts else "s", strict=one["strict"],
            policy_modules=tuple(modules), time_zone=reader(t, "time_zone", one["time_zone"]),
            slurm_states=reader(t, "slurm_states", one["slurm_states"]), discipline=disc, reference=reference,
            artifact=artifact, window=w, first_jobs=n, arrival_scale=x)
        return Cell(written, trace_run[t], dist_run[d], str((base / artifact).resolve()) if artifact else None)

    cells = [cell(t, c, p, combo, disc, s, d, r, m, w, n, x)
             for t in lists["traces"] for c in lists["clusters"] for p in lists["policies"] for combo in combos[p]
             for disc in lists["disciplines"] for s in lists["seeds"]
             for d in lists["lora_dists"] for r in lists["regroup_pause_s"] for m in lists["cost_models"]
             for w in lists["windows"] for n in lists["first_jobs"] for x in lists["arrival_scales"]]
    return Sweep(file, {**lists, "reference": reference}, {k: dict(v) for k, v in options.items()}, cells)


def _trace_run(spec: Any, fld: str, base: Path, csv_columns: dict | None,
               err: Callable[[str, str], InputError]) -> str:
    """The trace spec a cell reads: ``FORMAT:PATH`` with its path resolved against the sweep file's
    directory (the file must exist), or a checked ``synthetic:OPTIONS``."""
    from tlora_sim.traces.registry import split_spec

    if not isinstance(spec, str):
        raise err(fld, f"expected a trace spec string FORMAT:PATH, got {spec!r}")
    try:
        fmt, arg = split_spec(spec)
    except InputError as e:
        raise err(fld, e.message) from None
    if fmt == "synthetic":
        from tlora_sim.traces.synthetic import parse_options

        try:
            parse_options(arg)
        except InputError as e:
            raise err(fld, f"synthetic option {e.field!r}: {e.message}" if e.field else e.message) from None
        return spec
    if fmt == "csv" and csv_columns is None:
        raise err(fld, "the csv format needs a [csv_columns] table (submit, duration, gpus)")
    p = Path(arg).expanduser()
    p = p if p.is_absolute() else base / p
    if not p.exists():
        raise err(fld, f"trace path {str(p)!r} does not exist (relative paths are resolved against "
                       f"the sweep file's directory {str(base)!r})")
    return f"{fmt}:{p}"


def _dist_run(name: Any, fld: str, base: Path, err: Callable[[str, str], InputError]) -> str:
    """A LoRA distribution as a cell loads it: a registered name, or a JSON path resolved against the
    sweep file's directory (loaded here: a bad file is refused before any cell runs)."""
    from tlora_sim.traces.lora import DISTRIBUTIONS, load_distribution

    if not isinstance(name, str):
        raise err(fld, f"expected a distribution name ({', '.join(sorted(DISTRIBUTIONS))}) or a JSON path, "
                       f"got {name!r}")
    run = name
    if name not in DISTRIBUTIONS:
        p = Path(name).expanduser()
        run = str(p if p.is_absolute() else base / p)
    try:
        load_distribution(run)
    except InputError as e:
        raise err(fld, f"{e.file}: {e.message}" if e.file else e.message) from None
    return run


def _policy_options(data: dict, policies: list, err: Callable[[str, str], InputError]) -> dict[str, dict]:
    """The ``[policy_options.POLICY]`` tables, checked: listed policies, scalar values or non-empty
    lists of them (an axis) without duplicates."""
    options = data.get("policy_options", {})
    if not isinstance(options, dict):
        raise err("policy_options", "expected tables [policy_options.POLICY] of option = value")
    for pol, table in options.items():
        if pol not in policies:
            raise err(f"policy_options.{pol}", f"policy {pol!r} is not in policies = {policies}")
        if not isinstance(table, dict):
            raise err(f"policy_options.{pol}", "expected a table of option = value")
        for key, val in table.items():
            fld = f"policy_options.{pol}.{key}"
            if isinstance(val, dict) or (isinstance(val, list) and (
                    not val or any(isinstance(v, (dict, list)) for v in val))):
                raise err(fld, f"expected a number, string or boolean, or a non-empty list of them (an axis), "
                               f"got {val!r}")
            if isinstance(val, list):
                _no_duplicates({fld: val}, fld, err)
    return options


def policy_option_combos(table: dict) -> list[dict]:
    """The option sets of one ``[policy_options.POLICY]`` table: a list value is an axis (one cell per
    value, the cross product over every list), a scalar the same in every cell. Order: the lists'
    order, first key slowest."""
    import itertools

    axes = [(k, v if isinstance(v, list) else [v]) for k, v in table.items()]
    if not axes:
        return [{}]
    keys = [k for k, _ in axes]
    return [dict(zip(keys, vals)) for vals in itertools.product(*(v for _, v in axes))]


def _no_duplicates(lists: dict, key: str, err: Callable[[str, str], InputError]) -> None:
    seen: dict = {}
    for i, v in enumerate(lists[key]):
        k = json.dumps(v, sort_keys=True, default=str)
        if k in seen:
            raise err(f"{key}[{i}]", f"duplicate of {key}[{seen[k]}] ({v!r}); each value once")
        seen[k] = i
