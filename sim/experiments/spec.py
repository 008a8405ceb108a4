"""One experiment's inputs, declared once: :class:`ExperimentSpec` (issue 42, item 3).

Every field of ``ExperimentSpec`` carries a :class:`Knob` (its ``dataclasses.field`` metadata):
the help text, the command-line flag and the sub-commands that take it, the SWEEP.toml key
(an *axis* is a list there: one cell per value) and the check of a value. From them come:

* the flags of ``tlora-sim replay`` / ``compare`` / ``traces describe`` (:func:`add_flags`; the
  run options that are no input of the experiment, ``--out``, ``--force``, ..., are the knobs of
  :class:`RunOptions`) and the spec of a parsed command line (:func:`spec_from_args`);
* the keys of SWEEP.toml (:func:`sweep_knobs`, :func:`read_key`; ``sweep_file.parse_sweep``
  reads every key through them, errors naming the file and the key, ``traces[2]``);
* the run directory's ``config.json``: ``inputs`` (:meth:`ExperimentSpec.to_json`, every field)
  and ``axes`` (:func:`axes`: the values a sweep varies, with the offered load derived once here,
  so that the report reads them instead of parsing trace specs);
* the policy of a run, built once (:func:`build_policy`, with :func:`run_policy_options`).

``ReplayConfig`` (``replay.py``) is this class under its older name.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tlora_sim.traces.errors import InputError

MAX_SEED = 2**63 - 1
"""The largest seed: seeds are written as int64 columns (``jobs.csv``, ``summary_by_seed.csv``)."""

TIME_UNITS = ("s", "ms", "min", "h")
"""Units of a ``csv`` trace's submit and duration columns (``traces/generic_csv.py``)."""

DEFAULT_CLUSTER = "16x8xH100"


@dataclass(frozen=True)
class Knob:
    """What one input is, for every place that names it.

    Attributes:
        help: the help text (``--help``, docs/experiments.md); a callable is called when the parser
            is built (texts listing registries: trace formats, cost models).
        flag: the command-line flag (``--cluster``), or None (no flag).
        commands: the sub-commands whose parser has ``flag``.
        key: the SWEEP.toml key (``clusters``), or None (not a sweep key).
        axis: the key holds a list, one cell per value (else one value for every cell).
        metavar, choices, action, type, required: as ``argparse.add_argument`` takes them
            (``choices`` may be a callable returning the names).
        cli_default: the flag's default where it differs from the field's (``--option``: ``[]``; None: the
            field's).
        from_cli: turns the parsed flag's value into the field's (``--columns`` MAP -> dict).
        check: checks one value (a flag's, after ``from_cli``, or one element of a sweep key)
            and returns it normalised; raises ``InputError`` with the message only (the caller
            names the flag or key).
        example: an example value for the sweep key's error messages.
    """

    help: str | Callable[[], str]
    flag: str | None = None
    commands: tuple[str, ...] = ("replay", "compare")
    key: str | None = None
    axis: bool = False
    metavar: str | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    action: str | None = None
    type: Callable[[str], Any] | None = None
    required: bool = False
    cli_default: Any = None
    from_cli: Callable[[Any], Any] | None = None
    check: Callable[[Any], Any] | None = None
    example: str | None = None

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help

    def choice_names(self) -> list[str] | None:
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    @property
    def dest(self) -> str:
        """The ``argparse`` attribute of ``flag`` (``--regroup-pause`` -> ``regroup_pause``)."""
        return (self.flag or "").lstrip("-").replace("-", "_")


def knob(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, **meta: Any):
    """A dataclass field with its :class:`Knob` as metadata."""
    k = Knob(**meta)
    if factory is not None:
        return field(default_factory=factory, metadata={"knob": k})
    return field(default=default, metadata={"knob": k})


# ---- value checks (one per kind of value; the message says what was expected) ---------------------
def _int_at_least(low: int, high: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
            raise InputError(f"expected an integer >= {low}, got {v!r}")
        if high is not None and v > high:
            raise InputError(f"expected an integer in {low}..2^63-1, got {v!r}")
        return int(v)
    return check


def check_pause(v: Any) -> float:
    """A regroup pause: a finite number of seconds >= 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise InputError(f"expected a finite number of seconds >= 0, got {v!r}")
    return float(v)


def check_arrival_scale(v: Any) -> float:
    """``--arrival-scale``: a finite number > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise InputError(f"expected a finite number > 0, got {v!r}")
    return float(v)


def check_cluster(v: Any) -> str:
    """``NODESxGPUSxTYPE`` (``sim.core.cluster.parse_cluster``)."""
    from tlora_sim.sim.core.cluster import parse_cluster

    if not isinstance(v, str):
        raise InputError(f"expected a string NODESxGPUSxTYPE (e.g. 16x8xH100), got {v!r}")
    parse_cluster(v)
    return v


def check_window(v: Any) -> str:
    """``START,END`` in seconds or dates (``traces.window.parse_window``)."""
    from tlora_sim.traces.window import parse_window

    if not isinstance(v, str):
        raise InputError(f'expected "START,END" (seconds or dates), got {v!r}')
    parse_window(v)
    return v


def _one_of(names: Callable[[], Sequence[str]], what: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        known = list(names())
        if v not in known:
            raise InputError(f"unknown {what} {v!r}; expected one of: {', '.join(known)}")
        return v
    return check


def check_time_unit(v: Any) -> str:
    if v not in TIME_UNITS:
        raise InputError(f"expected one of {', '.join(TIME_UNITS)}, got {v!r}")
    return v


def check_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise InputError(f"expected true or false, got {v!r}")
    return v


def check_text(v: Any) -> str:
    if not (isinstance(v, str) and v.strip()):
        raise InputError(f"expected a non-empty string, got {v!r}")
    return v


def check_policy_name(v: Any) -> str:
    if not isinstance(v, str):
        raise InputError(f"expected a policy name, got {v!r}")
    return v


def check_reference(v: Any) -> str:
    from tlora_sim.sim.report.rundata import REFERENCE_POLICY

    if not (isinstance(v, str) and v.strip()):
        raise InputError(f"expected a policy name (the reference baseline, default {REFERENCE_POLICY!r}), got {v!r}")
    return v


def check_columns(v: Any) -> dict[str, str]:
    """A ``csv`` column mapping: a table of strings (``traces.generic_csv.parse_column_mapping``)."""
    from tlora_sim.traces.generic_csv import parse_column_mapping

    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise InputError('expected a table of strings, e.g. [csv_columns] submit = "ts", duration = "dur", '
                         'gpus = "n_gpu"')
    v = {str(k): x for k, x in v.items()}
    parse_column_mapping(",".join(f"{k}={x}" for k, x in v.items()))
    return v


def _columns_from_cli(text: str | None) -> dict[str, str] | None:
    from tlora_sim.traces.generic_csv import parse_column_mapping

    return parse_column_mapping(text) if text else None


def _modules_from_cli(specs: Sequence[str]) -> tuple[str, ...]:
    """``--policy-module`` values with file paths made absolute (worker processes may run elsewhere)."""
    from tlora_sim.policies.registry import policy_module_spec

    return tuple(policy_module_spec(m) for m in specs)


def trace_help() -> str:
    """The help text of a trace spec: the formats the reader registry knows, each with its description."""
    from tlora_sim.traces.registry import format_descriptions

    return "trace spec FORMAT:PATH; formats: " + "; ".join(f"{k} ({d})" for k, d in format_descriptions().items())


def _lora_help() -> str:
    from tlora_sim.traces.lora import DISTRIBUTIONS

    return ("LoRA attribute distribution: a registered name (" + ", ".join(sorted(DISTRIBUTIONS)) +
            ") or a JSON file like docs/examples/lora_70b.json (default: %(default)s)")


def _cost_models() -> list[str]:
    from tlora_sim.sim.costmodel.factory import COST_MODELS

    return list(COST_MODELS)


def _cost_model_help() -> str:
    from tlora_sim.sim.costmodel.factory import COST_MODELS

    return "; ".join(f"{k}: {v}" for k, v in COST_MODELS.items()) + " (default: %(default)s)"


def _disciplines() -> tuple[str, ...]:
    from tlora_sim.policies.discipline import DISCIPLINES

    return DISCIPLINES


READERS = ("replay", "compare", "describe")
"""The commands that read a trace with the reader options and cuts (``traces describe`` too)."""

COLUMNS_HELP = ("csv format only: submit=COL,gpus=COL and duration=COL or end=COL[,start=COL] [,job_id=COL]"
                "[,tenant=COL][,state=COL] and LoRA attributes [,model=COL][,rank=COL][,seq_len=COL]"
                "[,batch_size=COL][,max_slowdown=COL][,steps=COL]")


@dataclass(frozen=True)
class ExperimentSpec:
    """All inputs of one replay: one trace, cluster, policy and seed (``config.json``'s ``inputs``).

    Each field's meaning, flag, SWEEP.toml key and check are its :class:`Knob`
    (``fields_table()`` lists them; docs/experiments.md is that table). Values are as the
    replay reads them: ``csv_columns`` a dict, ``policy_modules`` resolved paths or dotted names,
    ``policy_options`` the policy's config overrides (a comparison merges its discipline's
    ``order``/``backfill`` into them).
    """

    trace: str = knob(help=trace_help, flag="--trace", commands=("replay", "compare"), metavar="SPEC",
                      required=True, key="traces", axis=True, example='["synthetic:jobs=2000,seed=1"]')
    policy: str = knob(help="policy name (see `tlora-sim policies`)", flag="--policy", commands=("replay",),
                       required=True, key="policies", axis=True, check=check_policy_name,
                       example='["independent", "tlora"]')
    cluster: str = knob(DEFAULT_CLUSTER, help="cluster shape, GPU type H100, H200 or A100 (default: %(default)s)",
                        flag="--cluster", metavar="NODESxGPUSxTYPE", key="clusters", axis=True, check=check_cluster)
    seed: int = knob(0, help="seed of the LoRA attribute assignment (default: %(default)s)", flag="--seed", type=int,
                     key="seeds", axis=True, check=_int_at_least(0, MAX_SEED))
    lora_dist: str = knob("tlora", help=_lora_help, flag="--lora-dist", metavar="NAME|JSON", key="lora_dists",
                          axis=True)
    policy_options: dict[str, Any] = knob(
        factory=dict, help="policy config override, e.g. tlora.max_group_size=8 (repeatable)", flag="--option",
        action="append", cli_default=[], metavar="[POLICY.]KEY=VALUE", key="policy_options")
    regroup_pause_s: float = knob(30.0, help="pause of a group when members join or are preempted, s "
                                             "(default: %(default)s)", flag="--regroup-pause", type=float,
                                  metavar="S", key="regroup_pause_s", axis=True, check=check_pause)
    csv_columns: dict[str, str] | None = knob(None, help=COLUMNS_HELP, flag="--columns", commands=READERS,
                                              metavar="MAP", from_cli=_columns_from_cli, key="csv_columns",
                                              check=check_columns)
    time_unit: str = knob("s", help="csv format only: unit of the submit and duration columns (default: "
                                    "%(default)s)", flag="--time-unit", commands=READERS, choices=TIME_UNITS,
                          key="time_unit", check=check_time_unit)
    strict: bool = knob(False, help="turn documented skips into errors: jobs larger than the cluster or its GPU "
                                    "memory, rows a trace reader drops (zero duration, Philly exact duplicates)",
                        flag="--strict", action="store_true", key="strict", check=check_bool)
    sweeps: str | None = knob(None, help="expand this fraction of jobs into hyper-parameter sweeps of K "
                                         "configurations (ALTO workloads), e.g. 0.3:4,8; applies to every policy "
                                         "alike", flag="--sweeps", metavar="FRACTION:K1,K2")
    cost_model: str = knob("auto", help=_cost_model_help, flag="--cost-model", choices=_cost_models,
                           key="cost_models", axis=True, check=_one_of(_cost_models, "cost model"))
    policy_modules: tuple[str, ...] = knob(
        (), help="import a policy module (a .py file or a dotted module name) before resolving policy names, so "
                 "policies written outside the repo can run (repeatable; docs/writing-a-policy.md)",
        flag="--policy-module", action="append", cli_default=[], metavar="PATH_OR_MODULE",
        from_cli=_modules_from_cli, key="policy_modules")
    early_exit: bool = knob(False, help="stop weak configurations of sweep families early (ALTO's rule, given to "
                                        "every policy run; stopped configurations are reported apart, never as "
                                        "completed jobs)", flag="--early-exit", action="store_true")
    time_zone: str | None = knob(None, help="IANA time zone of naive timestamps in csv and slurm traces (default: "
                                            "UTC), e.g. America/Los_Angeles", flag="--time-zone", commands=READERS,
                                 metavar="TZ", key="time_zone", check=check_text)
    slurm_states: str | None = knob(None, help="slurm format: job states kept, comma-separated (default: "
                                               "COMPLETED,FAILED,TIMEOUT,CANCELLED,OUT_OF_MEMORY,NODE_FAIL)",
                                    flag="--slurm-states", commands=READERS, metavar="LIST", key="slurm_states",
                                    check=check_text)
    keep_states: str | None = knob(None, help="csv format with a state=COL mapping: states kept, comma-separated, "
                                              "e.g. Succeeded,Failed (default: all)", flag="--keep-states",
                                   commands=READERS, metavar="LIST")
    window: str | None = knob(None, help="keep jobs submitted in [START, END): seconds from the trace start or "
                                         "dates (2017-10-01,2017-11-01); any format", flag="--window",
                              commands=READERS, metavar="START,END", key="windows", axis=True, check=check_window)
    first_jobs: int | None = knob(None, help="keep the first N jobs (after --window)", flag="--first-jobs", type=int,
                                  commands=READERS, metavar="N", key="first_jobs", axis=True,
                                  check=_int_at_least(1))
    arrival_scale: float | None = knob(None, help="divide submit times by X (2 = twice the arrival rate); durations "
                                                  "kept", flag="--arrival-scale", type=float, commands=READERS,
                                       metavar="X", key="arrival_scales", axis=True, check=check_arrival_scale)
    discipline: str = knob("default", help="queue discipline of every policy: default (each policy's own priority "
                                           "order with the reference's EASY backfilling), shared (also the "
                                           "reference's FIFO order), native (each system's published discipline) "
                                           "(default: %(default)s)", flag="--discipline", commands=("compare",),
                           choices=_disciplines, key="disciplines", axis=True,
                           check=_one_of(_disciplines, "discipline"))
    reference: str | None = knob(None, help="the reference baseline speed-ups are taken against, run when not "
                                            "among --policies (default: independent-backfill: every job alone, "
                                            "FIFO with EASY backfilling)", flag="--baseline", commands=("compare",),
                                 metavar="NAME", key="reference", check=check_reference)
    artifact: str | None = knob(None, help="profiled cost-model artifact to use instead of the shipped one of the "
                                           "GPU type (e.g. from `tlora-sim costmodel calibrate`); recorded in "
                                           "config.json's cost_model", flag="--artifact", type=Path,
                                metavar="FILE", from_cli=lambda p: str(p) if p else None, key="artifact")

    def to_json(self) -> dict:
        """``config.json``'s ``inputs``: every field (``dataclasses.asdict``)."""
        return dataclasses.asdict(self)


def knob_of(f: dataclasses.Field) -> Knob | None:
    """The :class:`Knob` of a dataclass field (None where it has none)."""
    return f.metadata.get("knob")


@dataclass(frozen=True)
class RunOptions:
    """How a command runs, not what it simulates (never in ``config.json``): the flags of replay
    and compare that are no input of the experiment."""

    policies: str = knob("", help="comma-separated policy names, e.g. independent,mlora,tlora", flag="--policies",
                         commands=("compare",), required=True)
    seeds: str | None = knob(None, help="run every policy under several seeds, e.g. 0-4 or 0,3,7: OUT/seed-<s>/ "
                                        "per seed, OUT/summary.csv with each metric's mean and 95%% confidence "
                                        "half-width (<metric>_ci95)", flag="--seeds", commands=("compare",),
                             metavar="LIST")
    workers: int = knob(min(2, os.cpu_count() or 1), help="policies simulated in parallel processes",
                        flag="--workers", type=int, commands=("compare",))  # default: the CPUs, at most 2
    decompose: bool = knob(False, help="run each grouping policy's ladder eager-alone (independent-backfill) -> "
                                       "fused-alone (independent-fused) -> + its order (POLICY-nogroup) -> + "
                                       "grouping (POLICY); summary.csv and decompose.csv give each step's "
                                       "speed-up", flag="--decompose", commands=("compare",), action="store_true")
    out: Path | None = knob(None, help="output directory", flag="--out", type=Path, metavar="DIR", required=True)
    no_invariants: bool = knob(False, help="do not check simulation invariants while running (for benchmarks; "
                                           "results are identical)", flag="--no-invariants", action="store_true")
    no_progress: bool = knob(False, help="no progress bar", flag="--no-progress", action="store_true")
    no_plots: bool = knob(False, help="draw no figures (no figures/ directory); `tlora-sim plot DIR` draws them "
                                      "later", flag="--no-plots", action="store_true")
    force: bool = knob(False, help="replace an --out directory that already holds files (without it such a "
                                   "directory is refused; the new directory replaces it only once complete)",
                       flag="--force", action="store_true")


@dataclass(frozen=True)
class SweepOptions:
    """How ``tlora-sim sweep`` runs (its experiment is SWEEP.toml's): its flags."""

    out: Path | None = knob(None, help="output directory (required to run a sweep)", flag="--out", type=Path,
                            metavar="DIR", commands=("sweep",))
    backend: str = knob("local", help="local worker processes, or Ray tasks", flag="--backend",
                        choices=("local", "ray"), commands=("sweep",))
    address: str | None = knob(None, help="Ray cluster address (ray backend; default: start a local Ray)",
                               flag="--address", metavar="ADDR", commands=("sweep",))
    workers: int | None = knob(None, help="local worker processes, or CPUs of a local Ray (default: CPU count; "
                                          "1 = in-process)", flag="--workers", type=int, metavar="N",
                               commands=("sweep",))
    no_progress: bool = knob(False, help="no progress bar", flag="--no-progress", action="store_true",
                             commands=("sweep",))
    dry_run: bool = knob(False, help="list the cells (id, finished, inputs) and exit", flag="--dry-run",
                         action="store_true", commands=("sweep",))
    no_plots: bool = knob(False, help="`sweep report DIR`: write report.csv only, no figures/", flag="--no-plots",
                          action="store_true", commands=("sweep",))


OPTION_CLASSES = (ExperimentSpec, RunOptions, SweepOptions)
"""Every class whose fields are flags: the experiment's inputs, then how replay/compare and sweep run."""

#: The flags of each command, in ``--help`` order: names of fields of ``OPTION_CLASSES``.
COMMON_FLAGS = ("trace", "cluster", "seed", "out", "lora_dist", "csv_columns", "time_zone", "slurm_states",
                "time_unit", "keep_states", "window", "first_jobs", "arrival_scale", "regroup_pause_s",
                "policy_modules", "policy_options", "cost_model", "artifact", "sweeps", "early_exit", "strict",
                "no_invariants", "no_progress", "no_plots", "force")
FLAG_ORDER: dict[str, tuple[str, ...]] = {
    "replay": ("policy", *COMMON_FLAGS),
    "compare": ("policies", "seeds", "workers", "reference", "discipline", "decompose", *COMMON_FLAGS),
    "describe": ("csv_columns", "time_unit", "time_zone", "slurm_states", "keep_states", "window", "first_jobs",
                 "arrival_scale"),
    "sweep": ("out", "backend", "address", "workers", "no_progress", "dry_run", "no_plots"),
}


def _command_fields(command: str) -> dict[str, tuple[dataclasses.Field, Knob]]:
    """The fields whose flag ``command`` takes: name -> (field, knob)."""
    out = {}
    for cls in OPTION_CLASSES:
        for f in dataclasses.fields(cls):
            k = knob_of(f)
            if k is not None and k.flag and command in k.commands:
                assert f.name not in out, (command, f.name)
                out[f.name] = (f, k)
    return out


def _spec_knob(name: str) -> Knob:
    return next(knob_of(f) for f in dataclasses.fields(ExperimentSpec) if f.name == name)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_flags(parser, command: str, *, defaults: Mapping[str, Any] | None = None) -> None:
    """Add ``command``'s flags (``FLAG_ORDER``) to an ``argparse`` parser, from the knobs.

    Args:
        parser: the sub-command's ``argparse.ArgumentParser``.
        command: ``replay``, ``compare`` or ``describe``.
        defaults: field -> flag default overriding the field's (``--workers``: the CPUs).
    """
    fields = _command_fields(command)
    assert sorted(fields) == sorted(FLAG_ORDER[command]), command
    for name in FLAG_ORDER[command]:
        f, k = fields[name]
        kw: dict[str, Any] = {"help": k.help_text(), "dest": name}
        if k.action:
            kw["action"] = k.action
        if k.metavar:
            kw["metavar"] = k.metavar
        if k.type is not None:
            kw["type"] = k.type
        if k.choices is not None:
            kw["choices"] = k.choice_names()
        if k.required:
            kw["required"] = True
        elif k.action != "store_true":
            default = k.cli_default if k.cli_default is not None else _default(f)
            if defaults and name in defaults:
                default = defaults[name]
            if k.action == "append":
                default = list(default)
            kw["default"] = default
        parser.add_argument(k.flag, **kw)


def flag_of(name: str) -> str:
    """The command-line flag of field ``name`` (``regroup_pause_s`` -> ``--regroup-pause``)."""
    return _spec_knob(name).flag or name


def checked(name: str, value: Any, *, where: Callable[[str], InputError] | None = None) -> Any:
    """``value`` of field ``name`` through its knob's ``check`` (unchanged where it has none).

    Raises:
        InputError: the check's message, naming the flag (``where``: a function of the message
            making the error, e.g. one naming the sweep file and key).
    """
    k = _spec_knob(name)
    if k.check is None:
        return value
    try:
        return k.check(value)
    except InputError as e:
        raise (where(e.message) if where else InputError(e.message, field=k.flag)) from None


def spec_from_args(args, command: str, policy: str, policy_options: Mapping[str, Any] | None = None
                   ) -> ExperimentSpec:
    """The :class:`ExperimentSpec` of a parsed ``replay``/``compare`` command line, for ``policy``.

    Each flag's value goes through its knob (``from_cli``, then ``check`` for a flag given, except an
    empty text, which the readers take as their default: ``--time-zone ''`` is UTC);
    ``--option`` items are the caller's (they name policies: ``policy_options`` gives this
    policy's); ``--baseline`` unset leaves ``reference`` None.

    Raises:
        InputError: a value its check refuses, naming the flag.
    """
    kw: dict[str, Any] = {"policy": policy, "policy_options": dict(policy_options or {})}
    for f in dataclasses.fields(ExperimentSpec):
        k = knob_of(f)
        if f.name in kw or k is None or k.flag is None or command not in k.commands:
            continue
        value = getattr(args, f.name)
        if k.from_cli is not None:
            value = k.from_cli(value)
        if value is not None and value != "" and k.action != "store_true":  # "" is the reader's default
            value = checked(f.name, value)
        kw[f.name] = value
    return ExperimentSpec(**kw)


# ---- SWEEP.toml --------------------------------------------------------------------------------------
def sweep_knobs() -> dict[str, tuple[str, Knob]]:
    """SWEEP.toml key -> (``ExperimentSpec`` field, its knob), in field order."""
    return {k.key: (f.name, k) for f in dataclasses.fields(ExperimentSpec) if (k := knob_of(f)) and k.key}


def sweep_default(name: str) -> Any:
    """A sweep key's value when absent: ``[default]`` for an axis, the default for the others; the
    reference baseline defaults to ``independent-backfill`` (a sweep always runs one)."""
    from tlora_sim.sim.report.rundata import REFERENCE_POLICY

    f = next(f for f in dataclasses.fields(ExperimentSpec) if f.name == name)
    k = knob_of(f)
    if name == "reference":
        return REFERENCE_POLICY
    d = _default(f)
    if name == "policy_modules":
        return []
    return [d] if k.axis else d


def read_key(data: Mapping[str, Any], key: str, err: Callable[[str, str], InputError]) -> Any:
    """One SWEEP.toml key read through the spec: an axis as a non-empty list without duplicates
    whose every element passed the field's check (``key[i]`` named in the error), another key's
    value checked (None stays None).

    Args:
        data: the parsed TOML.
        key: a key of :func:`sweep_knobs`.
        err: ``err(field, message)`` makes the error (naming the sweep file).

    Raises:
        InputError: from ``err``.
    """
    import json

    name, k = sweep_knobs()[key]
    value = data.get(key, sweep_default(name))
    if not k.axis:
        return value if value is None else checked(name, value, where=lambda m: err(key, m))
    if not isinstance(value, list):
        raise err(key, f"expected a list (e.g. {key} = {k.example or sweep_default(name)}), got {value!r}")
    if not value:
        raise err(key, "expected a non-empty list")
    out, seen = [], {}
    for i, v in enumerate(value):
        if v is not None:
            v = checked(name, v, where=lambda m, i=i: err(f"{key}[{i}]", m))
        text = json.dumps(v, sort_keys=True, default=str)
        if text in seen:
            raise err(f"{key}[{i}]", f"duplicate of {key}[{seen[text]}] ({value[i]!r}); each value once")
        seen[text] = i
        out.append(v)
    return out


# ---- the run directory's axes ------------------------------------------------------------------------
AXES = tuple(k.key for k in (knob_of(f) for f in dataclasses.fields(ExperimentSpec)) if k and k.axis)
"""The sweep axes (SWEEP.toml list keys)."""


def trace_load(spec: str) -> tuple[float, int] | None:
    """Offered load of a trace spec: ``(load, reference GPUs)``, or None when the spec has none.

    Only ``synthetic:`` specs carry a load: their ``load=`` option (default 0.7) is the offered GPU
    demand as a fraction of a ``gpus=``-GPU cluster (default 32), see :mod:`tlora_sim.traces.synthetic`.
    Real traces (``itp:``, ``philly:`` ...) return None: their load is whatever they hold.

    Raises:
        InputError: a synthetic spec with a malformed option (field = the option).
    """
    fmt, _, arg = str(spec).partition(":")
    if fmt.strip().lower() != "synthetic":
        return None
    from tlora_sim.traces.synthetic import parse_options

    opts = parse_options(arg)
    return float(opts["load"]), int(opts["gpus"])


def trace_family(spec: str) -> str:
    """A canonical form of ``spec`` with its load left out (what a load sweep keeps fixed): a
    synthetic spec's options sorted, with every default spelt out; other specs as given."""
    fmt, _, arg = str(spec).partition(":")
    if fmt.strip().lower() != "synthetic":
        return str(spec)
    from tlora_sim.traces.synthetic import parse_options

    opts = {k: v for k, v in parse_options(arg).items() if k != "load"}
    return "synthetic:" + ",".join(f"{k}={opts[k]}" for k in sorted(opts))


def axes(spec: ExperimentSpec, cluster_gpus: int) -> dict:
    """``config.json``'s ``axes``: the values of the sweep axes (``AXES``, by field name) and the
    offered load they imply, for the report to read (``sim/report/load_sweep.py``).

    Args:
        spec: the run's inputs.
        cluster_gpus: the cluster's GPUs (``Cluster.total_gpus``).

    Returns:
        the axis fields (``trace``, ``cluster``, ``policy``, ``seed``, ..., and ``policy_options``:
        a sweep's option lists are axes), ``cluster_gpus``,
        ``trace_load`` and ``trace_gpus`` (a synthetic spec's ``load=``/``gpus=``; None for other
        traces), ``trace_family`` (:func:`trace_family`) and ``load``: the offered GPU demand as
        a fraction of the cluster's GPUs, ``trace_load x trace_gpus / cluster_gpus x
        arrival_scale`` (dividing submit times by X multiplies the demand by X), None without a
        ``trace_load``.

    Raises:
        InputError: a synthetic spec with a malformed option.
    """
    out = {f.name: getattr(spec, f.name) for f in dataclasses.fields(ExperimentSpec)
           if (k := knob_of(f)) and (k.axis or f.name == "policy_options")}  # option lists are axes too
    tl = trace_load(spec.trace)
    load = None
    if tl is not None:
        load = tl[0] * tl[1] / cluster_gpus if cluster_gpus > 0 else tl[0]
        if spec.arrival_scale is not None:
            load *= float(spec.arrival_scale)
    out.update({"cluster_gpus": int(cluster_gpus), "trace_load": tl[0] if tl else None,
                "trace_gpus": tl[1] if tl else None, "trace_family": trace_family(spec.trace), "load": load})
    return out


# ---- the policy of a run, built once -------------------------------------------------------------------
def policy_fields(name: str) -> dict[str, Any] | None:
    """The option names and defaults of policy ``name``'s config (``-nogroup`` names: their base
    policy's), read from the registry without building the policy; None for an unknown name."""
    from tlora_sim.policies.registry import ABLATION_SUFFIX, available

    entries = {e.name: e for e in available()}
    base = name[: -len(ABLATION_SUFFIX)] if name.endswith(ABLATION_SUFFIX) and name not in entries else name
    entry = entries.get(base)
    if entry is None:
        return None
    cfg = entry.config_cls()
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(entry.config_cls)}


def run_policy_options(spec: ExperimentSpec) -> dict[str, Any]:
    """The options ``spec``'s policy is built with: ``spec.policy_options``, plus the engine's
    regroup pause (``spec.regroup_pause_s``) where the policy's config prices one
    (``regroup_pause_s``) and the options do not set it (the join test prices the pause the engine
    applies)."""
    opts = dict(spec.policy_options or {})
    fields = policy_fields(spec.policy)
    if fields is not None and "regroup_pause_s" in fields and "regroup_pause_s" not in opts:
        opts["regroup_pause_s"] = spec.regroup_pause_s
    return opts


def build_policy(spec: ExperimentSpec):
    """``spec``'s policy, built once (``policies.registry.make_policy``) after its policy modules
    are loaded; a failure to build is the check of its name and options.

    Raises:
        InputError: unknown policy, unknown option, a bad option value, a policy that cannot be built.
    """
    from tlora_sim.policies.registry import load_policy_module, make_policy

    for module in spec.policy_modules:
        load_policy_module(module)
    return make_policy(spec.policy, run_policy_options(spec))


def fields_table() -> list[dict]:
    """One row per field of ``OPTION_CLASSES``: ``group`` (the class), ``field``, ``flag``,
    ``commands``, ``sweep_key`` (with ``[]`` for an axis), ``default``, ``help`` (what
    docs/experiments.md tabulates)."""
    rows = []
    for cls in OPTION_CLASSES:
        for f in dataclasses.fields(cls):
            k = knob_of(f)
            rows.append({"group": cls.__name__, "field": f.name, "flag": k.flag, "commands": k.commands,
                         "sweep_key": (f"{k.key}[]" if k.axis else k.key) if k.key else None,
                         "default": _default(f), "help": k.help_text()})
    return rows
