"""The sweep definition: SWEEP.toml's keys, their validation (every value checked before any
cell runs, one error naming the file and the key), and the cells (one per combination) with
their content-addressed ids."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tlora_sim.traces.errors import InputError



from tlora_sim.sim.costmodel.factory import COST_MODELS  # noqa: E402 - the one list of names

LIST_KEYS = ("traces", "clusters", "policies", "seeds", "lora_dists", "regroup_pause_s", "cost_models", "disciplines",
             "windows", "first_jobs", "arrival_scales")
SCALAR_KEYS = ("strict", "time_unit", "csv_columns", "policy_modules", "time_zone", "slurm_states", "reference",
               "artifact")
TABLE_KEYS = ("policy_options",)
DEFAULTS: dict[str, list] = {"clusters": ["16x8xH100"], "seeds": [0], "lora_dists": ["tlora"],
                             "regroup_pause_s": [30.0], "cost_models": ["auto"], "disciplines": ["default"],
                             # trace cuts (``--window``, ``--first-jobs``, ``--arrival-scale``); [None] = uncut
                             "windows": [None], "first_jobs": [None], "arrival_scales": [None]}
#: Reader options and the formats' option names (``traces.registry.format_options``); a sweep passes
#: each only to the traces whose format takes it.
READER_OPTIONS = ("csv_columns", "time_unit", "time_zone", "slurm_states")
REQUIRED = ("traces", "policies")
TIME_UNITS = ("s", "ms", "min", "h")

INPUT_COLUMNS = ["trace", "cluster", "policy", "seed", "lora_dist", "regroup_pause_s", "cost_model",
                 "policy_options", "discipline", "window", "first_jobs", "arrival_scale"]
FAILED_COLUMNS = ["cell_id", *INPUT_COLUMNS, "error", "message"]


# ---- the sweep definition ------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One combination of the sweep.

    Attributes:
        trace, cluster, policy, seed, lora_dist, regroup_pause_s, cost_model: the inputs as written.
        policy_options: the policy's option overrides (sorted ``(key, value)`` pairs).
        trace_run: the trace spec with its path resolved (what the replay reads).
        lora_dist_run: the distribution name or resolved JSON path.
        csv_columns, time_unit, strict: sweep-wide reader options.
        policy_modules: sweep-wide policy modules (resolved paths or dotted names), loaded in
            every worker before the policy is built; not part of the cell's identity (they say
            where a policy comes from, not what is simulated).
    """

    trace: str
    cluster: str
    policy: str
    seed: int
    lora_dist: str
    regroup_pause_s: float
    cost_model: str
    policy_options: tuple[tuple[str, Any], ...] = ()
    trace_run: str = ""
    lora_dist_run: str = ""
    csv_columns: tuple[tuple[str, str], ...] | None = None
    time_unit: str = "s"
    strict: bool = False
    policy_modules: tuple[str, ...] = ()
    time_zone: str | None = None
    slurm_states: str | None = None
    discipline: str = "default"
    reference: str | None = None
    artifact: str | None = None  # a profiled artifact file, as written (``--artifact``)
    artifact_run: str | None = None  # ... resolved against the sweep file's folder
    window: str | None = None  # trace cuts, as --window / --first-jobs / --arrival-scale
    first_jobs: int | None = None
    arrival_scale: float | None = None

    def identity(self) -> dict:
        """The canonical inputs the id hashes (paths as written, not as resolved)."""
        return {"trace": self.trace, "cluster": self.cluster, "policy": self.policy, "seed": self.seed,
                "lora_dist": self.lora_dist, "regroup_pause_s": float(self.regroup_pause_s),
                "cost_model": self.cost_model, "policy_options": dict(self.policy_options),
                "csv_columns": dict(self.csv_columns) if self.csv_columns is not None else None,
                "time_unit": self.time_unit, "strict": self.strict,
                # reader options enter the id only when set, so older sweeps keep their cell ids
                **({"time_zone": self.time_zone} if self.time_zone else {}),
                **({"slurm_states": self.slurm_states} if self.slurm_states else {}),
                **({"discipline": self.discipline} if self.discipline != "default" else {}),
                **({"artifact": self.artifact} if self.artifact else {}),
                **({"window": self.window} if self.window else {}),
                **({"first_jobs": self.first_jobs} if self.first_jobs is not None else {}),
                **({"arrival_scale": self.arrival_scale} if self.arrival_scale is not None else {})}

    @property
    def cell_id(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON of :meth:`identity`."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def inputs_row(self) -> dict:
        """The ``INPUT_COLUMNS`` values (policy options as compact JSON)."""
        return {"trace": self.trace, "cluster": self.cluster, "policy": self.policy, "seed": self.seed,
                "lora_dist": self.lora_dist, "regroup_pause_s": float(self.regroup_pause_s),
                "cost_model": self.cost_model,
                "policy_options": json.dumps(dict(self.policy_options), sort_keys=True, separators=(",", ":")),
                "discipline": self.discipline, "window": self.window, "first_jobs": self.first_jobs,
                "arrival_scale": self.arrival_scale}


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
    """Validate a sweep given as a dict (what ``tomllib`` returns); see :func:`load_sweep`."""
    base = Path(base_dir)

    def err(fld: str, message: str) -> InputError:
        return InputError(message, file=file, field=fld)

    known = (*LIST_KEYS, *SCALAR_KEYS, *TABLE_KEYS)
    for key in data:
        if key not in known:
            raise err(key, f"unknown key; expected one of: {', '.join(known)}")
    for key in REQUIRED:
        if key not in data:
            raise err(key, f"missing; expected a list, e.g. {key} = {_EXAMPLES[key]}")

    strict = data.get("strict", False)
    if not isinstance(strict, bool):
        raise err("strict", f"expected true or false, got {strict!r}")
    time_unit = data.get("time_unit", "s")
    if time_unit not in TIME_UNITS:
        raise err("time_unit", f"expected one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    csv_columns = data.get("csv_columns")
    if csv_columns is not None:
        if not isinstance(csv_columns, dict) or not all(isinstance(v, str) for v in csv_columns.values()):
            raise err("csv_columns", 'expected a table of strings, e.g. [csv_columns] submit = "ts", '
                                     'duration = "dur", gpus = "n_gpu"')
        csv_columns = {str(k): v for k, v in csv_columns.items()}

    lists = {key: _list(data, key, err) for key in LIST_KEYS}
    from tlora_sim.sim.report.rundata import REFERENCE_POLICY
    from tlora_sim.policies.discipline import DISCIPLINES

    reference = data.get("reference", REFERENCE_POLICY)
    if not (isinstance(reference, str) and reference.strip()):
        raise err("reference", f"expected a policy name (the reference baseline, default {REFERENCE_POLICY!r}), "
                               f"got {reference!r}")
    user_policies = list(lists["policies"])
    if reference not in lists["policies"]:  # the reference baseline is always run (first)
        lists["policies"] = [reference, *lists["policies"]]
    for i, d in enumerate(lists["disciplines"]):
        if d not in DISCIPLINES:
            raise err(f"disciplines[{i}]", f"unknown discipline {d!r}; expected one of: {', '.join(DISCIPLINES)}")
    reader_opts = {}
    for key in ("time_zone", "slurm_states"):
        v = data.get(key)
        if v is not None and not (isinstance(v, str) and v.strip()):
            raise err(key, f"expected a non-empty string, got {v!r}")
        reader_opts[key] = v
    artifact = data.get("artifact")
    if artifact is not None:
        if not (isinstance(artifact, str) and artifact.strip()):
            raise err("artifact", f"expected the path of a cost-model artifact file, got {artifact!r}")
        from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

        try:
            load_artifact(base / artifact)
        except InputError as e:
            raise err("artifact", e.message) from None
    modules = data.get("policy_modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise err("policy_modules", 'expected a list of .py paths or module names, e.g. ["my_policy.py"]')
    modules = [str((base / m).resolve()) if m.endswith(".py") else m for m in modules]
    from tlora_sim.policies.registry import load_policy_module

    for i, m in enumerate(modules):
        try:
            load_policy_module(m)
        except InputError as e:
            raise err(f"policy_modules[{i}]", e.message) from None

    # traces: FORMAT:PATH (file formats: the path must exist) or synthetic:OPTIONS
    from tlora_sim.traces.registry import split_spec

    trace_run = {}
    for i, spec in enumerate(lists["traces"]):
        fld = f"traces[{i}]"
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
            trace_run[spec] = spec
            continue
        if fmt == "csv" and csv_columns is None:
            raise err(fld, "the csv format needs a [csv_columns] table (submit, duration, gpus)")
        p = Path(arg).expanduser()
        p = p if p.is_absolute() else base / p
        if not p.exists():
            raise err(fld, f"trace path {str(p)!r} does not exist (relative paths are resolved against "
                           f"the sweep file's directory {str(base)!r})")
        trace_run[spec] = f"{fmt}:{p}"
    from tlora_sim.traces.registry import format_options

    trace_formats = {t: split_spec(t)[0] for t in lists["traces"]}
    given = {"csv_columns": csv_columns, "time_unit": time_unit if time_unit != "s" else None, **reader_opts}
    for key, val in given.items():
        if val is None:
            continue
        if not any(key in format_options(f) for f in trace_formats.values()):
            users = sorted({f for f in ("csv", "slurm", "itp", "philly", "acme", "synthetic") if key in format_options(f)})
            raise err(key, f"applies only to traces of the {' and '.join(users)} format(s); no trace of this sweep "
                           f"is one (traces: {', '.join(sorted(set(trace_formats.values())))})")
    if csv_columns is not None:
        from tlora_sim.traces.generic_csv import parse_column_mapping

        try:
            parse_column_mapping(",".join(f"{k}={v}" for k, v in csv_columns.items()))
        except InputError as e:
            raise err("csv_columns", e.message) from None

    from tlora_sim.sim.core.cluster import parse_cluster

    for i, spec in enumerate(lists["clusters"]):
        if not isinstance(spec, str):
            raise err(f"clusters[{i}]", f"expected a string NODESxGPUSxTYPE (e.g. 16x8xH100), got {spec!r}")
        try:
            parse_cluster(spec)
        except InputError as e:
            raise err(f"clusters[{i}]", e.message) from None

    for i, s in enumerate(lists["seeds"]):
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise err(f"seeds[{i}]", f"expected an integer >= 0, got {s!r}")

    for i, v in enumerate(lists["regroup_pause_s"]):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise err(f"regroup_pause_s[{i}]", f"expected a finite number of seconds >= 0, got {v!r}")
    lists["regroup_pause_s"] = [float(v) for v in lists["regroup_pause_s"]]
    _no_duplicates(lists, "regroup_pause_s", err)

    from tlora_sim.traces.window import parse_window

    for i, w in enumerate(lists["windows"]):  # trace cuts: every reader takes them (traces/window.py)
        if w is None:
            continue
        if not isinstance(w, str):
            raise err(f"windows[{i}]", f'expected "START,END" (seconds or dates), got {w!r}')
        try:
            parse_window(w)
        except InputError as e:
            raise err(f"windows[{i}]", e.message) from None
    for i, n in enumerate(lists["first_jobs"]):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise err(f"first_jobs[{i}]", f"expected an integer >= 1, got {n!r}")
    for i, x in enumerate(lists["arrival_scales"]):
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0)):
            raise err(f"arrival_scales[{i}]", f"expected a finite number > 0, got {x!r}")
    lists["arrival_scales"] = [None if x is None else float(x) for x in lists["arrival_scales"]]

    for i, name in enumerate(lists["cost_models"]):
        if name not in COST_MODELS:
            raise err(f"cost_models[{i}]", f"unknown cost model {name!r}; expected one of: "
                                           f"{', '.join(COST_MODELS)}")

    from tlora_sim.traces.lora import DISTRIBUTIONS, load_distribution

    dist_run = {}
    for i, name in enumerate(lists["lora_dists"]):
        fld = f"lora_dists[{i}]"
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
        dist_run[name] = run

    from tlora_sim.policies.registry import make_policy

    for i, name in enumerate(user_policies):
        if not isinstance(name, str):
            raise err(f"policies[{i}]", f"expected a policy name, got {name!r}")
    options = data.get("policy_options", {})
    if not isinstance(options, dict):
        raise err("policy_options", "expected tables [policy_options.POLICY] of option = value")
    for pol, table in options.items():
        if pol not in lists["policies"]:
            raise err(f"policy_options.{pol}", f"policy {pol!r} is not in policies = {lists['policies']}")
        if not isinstance(table, dict):
            raise err(f"policy_options.{pol}", "expected a table of option = value")
        for key, val in table.items():
            if isinstance(val, dict) or (isinstance(val, list) and (
                    not val or any(isinstance(v, (dict, list)) for v in val))):
                raise err(f"policy_options.{pol}.{key}", f"expected a number, string or boolean, or a non-empty "
                                                         f"list of them (an axis), got {val!r}")
            if isinstance(val, list):
                _no_duplicates({f"policy_options.{pol}.{key}": val}, f"policy_options.{pol}.{key}", err)
    combos = {name: policy_option_combos(options.get(name, {})) for name in lists["policies"]}
    from tlora_sim.sim.experiments.replay import policy_options_with_discipline

    for i, name in enumerate(lists["policies"]):
        for combo in combos[name]:
            for d in lists["disciplines"]:
                try:
                    make_policy(name, policy_options_with_discipline(name, d, combo))
                except InputError as e:
                    fld = (f"policy_options.{name}.{e.field}" if name in options and e.field in options[name]
                           else f"policies[{user_policies.index(name)}]" if name in user_policies else "reference")
                    raise err(fld, e.message) from None

    csv_items = tuple(sorted(csv_columns.items())) if csv_columns is not None else None

    def reader(t: str, key: str, value):
        """A reader option as the cell of trace ``t`` gets it: only where its format takes it."""
        return value if key in format_options(trace_formats[t]) else None

    cells = [Cell(t, c, p, s, d, r, m, tuple(sorted(combo.items())), trace_run[t], dist_run[d],
                  reader(t, "csv_columns", csv_items), time_unit if "time_unit" in format_options(trace_formats[t])
                  else "s", strict, tuple(modules), reader(t, "time_zone", reader_opts["time_zone"]),
                  reader(t, "slurm_states", reader_opts["slurm_states"]), disc, reference,
                  artifact, str((base / artifact).resolve()) if artifact else None, w, n, x)
             for t in lists["traces"] for c in lists["clusters"] for p in lists["policies"] for combo in combos[p]
             for disc in lists["disciplines"] for s in lists["seeds"]
             for d in lists["lora_dists"] for r in lists["regroup_pause_s"] for m in lists["cost_models"]
             for w in lists["windows"] for n in lists["first_jobs"] for x in lists["arrival_scales"]]
    return Sweep(file, {**lists, "reference": reference}, {k: dict(v) for k, v in options.items()}, cells)


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


_EXAMPLES = {"traces": '["synthetic:jobs=2000,seed=1"]', "policies": '["independent", "tlora"]'}


def _list(data: dict, key: str, err: Callable[[str, str], InputError]) -> list:
    value = data.get(key, DEFAULTS.get(key))
    if not isinstance(value, list):
        raise err(key, f"expected a list (e.g. {key} = {_EXAMPLES.get(key, DEFAULTS.get(key))}), got {value!r}")
    if not value:
        raise err(key, "expected a non-empty list")
    lists = {key: value}
    _no_duplicates(lists, key, err)
    return list(value)


def _no_duplicates(lists: dict, key: str, err: Callable[[str, str], InputError]) -> None:
    seen: dict = {}
    for i, v in enumerate(lists[key]):
        k = json.dumps(v, sort_keys=True, default=str)
        if k in seen:
            raise err(f"{key}[{i}]", f"duplicate of {key}[{seen[k]}] ({v!r}); each value once")
        seen[k] = i
