"""Policy registry: name -> (factory, config dataclass, one-line description).

A policy is any object with the attributes of :class:`Policy` (``tlora_sim.policies.api`` is the
public face of this module). Register with :func:`register`; build with :func:`make_policy`.
Policies come from three places, loaded in this order: the built-in modules of this package, the
entry-point group ``tlora_sim.policies`` of installed distributions (each entry point names a
module whose import registers policies), and modules named at run time with
:func:`load_policy_module` (``--policy-module PATH_OR_MODULE``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import Action, Snapshot


class Policy(Protocol):
    """A grouping/scheduling policy: a pure function of the snapshot.

    Attributes:
        name: the registered name (``make_policy`` sets it; ablations get ``<name>-nogroup``).
        plan: the execution plan of the groups it starts (``tlora_sim.sim.core.snapshot``).
        timer_s: seconds between timer decisions while any group runs (the engine also asks the
            policy to decide every ``timer_s`` seconds, even with an empty queue), or None for
            no timer.
        config: its config dataclass instance (recorded in ``config.json``).
    """

    name: str
    plan: str
    timer_s: float | None
    config: Any

    def decide(self, snap: Snapshot) -> Sequence[Action]:
        """Actions to apply now (may be empty)."""
        ...


@dataclass(frozen=True)
class Entry:
    """A registered policy: its factory, config dataclass and description."""

    name: str
    factory: Callable[[Any], Policy]
    config_cls: type
    description: str


_REGISTRY: dict[str, Entry] = {}


def register(name: str, config_cls: type, description: str) -> Callable:
    """Class decorator: register a policy class whose ``__init__`` takes one ``config_cls`` instance.

    ``config_cls`` is a dataclass whose fields (with defaults) are the policy's options, set with
    ``--option NAME.field=value``; ``description`` is the one line ``tlora-sim policies`` prints.

    Raises:
        InputError: ``name`` already registered by another class (a built-in name by anything but
            its own class, even one of the same ``__qualname__``), or ``config_cls`` not a dataclass.
    """

    def deco(cls):
        old = _REGISTRY.get(name)
        if old is not None and old.factory is not cls:
            same = (old.factory.__module__, old.factory.__qualname__) == (cls.__module__, cls.__qualname__)
            if _is_builtin(old) and not same:
                raise InputError(f"policy name {name!r} is already registered by the built-in "
                                 f"{old.factory.__module__}.{old.factory.__qualname__} and cannot be replaced; "
                                 f"register your policy under another name", field="policy")
            if not same:
                raise InputError(f"policy name {name!r} is already registered by {old.factory.__module__}."
                                 f"{old.factory.__qualname__}", field="policy")
        if not dataclasses.is_dataclass(config_cls):
            raise InputError(f"policy {name!r}: the config class must be a dataclass", field="policy")
        _REGISTRY[name] = Entry(name, cls, config_cls, description)
        return cls

    return deco


BUILTIN_PACKAGE = "tlora_sim.policies."


def _is_builtin(entry: Entry) -> bool:
    """True for a policy registered by one of this package's modules (its name is reserved: a
    module of the same (module, qualname) may re-register it, as a reload does, nothing else)."""
    return entry.factory.__module__.startswith(BUILTIN_PACKAGE)


def unregister(name: str) -> bool:
    """Forget the policy registered as ``name`` (one a test or a session registered for a while);
    returns whether it was registered. A module ``load_policy_module`` already loaded is not loaded
    again by a later call. Raises ValueError for a built-in policy (its name stays reserved)."""
    entry = _REGISTRY.get(name)
    if entry is not None and _is_builtin(entry):
        raise ValueError(f"policy {name!r} is a built-in and cannot be unregistered")
    return _REGISTRY.pop(name, None) is not None


def available() -> list[Entry]:
    """Registered policies in registration order."""
    _load_builtin()
    return list(_REGISTRY.values())


def make_policy(name: str, options: dict[str, Any] | None = None) -> Policy:
    """Build a policy by name with optional config overrides.

    Raises:
        InputError: unknown policy, unknown option, an option of the wrong type, or a policy
            whose constructor raises (any exception, ``SystemExit`` included).
    """
    _load_builtin()
    options = dict(options or {})
    ablation = name.endswith(ABLATION_SUFFIX) and name[: -len(ABLATION_SUFFIX)] in _REGISTRY
    base = name[: -len(ABLATION_SUFFIX)] if ablation else name
    if base not in _REGISTRY:
        known = ", ".join(list(_REGISTRY) + [e.name + ABLATION_SUFFIX for e in _REGISTRY.values()
                                             if _has_grouping(e)])
        raise InputError(f"unknown policy {name!r}; known: {known}{broken_entry_points_note()}", field="--policy")
    entry = _REGISTRY[base]
    if ablation:
        if not _has_grouping(entry):
            raise InputError(f"policy {base!r} has no grouping to turn off", field="--policy")
        options["grouping"] = False
    fields = {f.name: f for f in dataclasses.fields(entry.config_cls)}
    for key, val in options.items():
        if key not in fields:
            raise InputError(f"policy {name!r} has no option {key!r}; options: {', '.join(fields)}", field=key)
        default = getattr(entry.config_cls(), key)
        if isinstance(default, bool) and isinstance(val, str):
            if val.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise InputError(f"option {key!r} of policy {name!r} must be true or false, got {val!r}", field=key)
            options[key] = val.lower() in ("true", "1", "yes")
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            try:
                options[key] = type(default)(val)
            except (TypeError, ValueError, OverflowError):
                raise InputError(f"option {key!r} of policy {name!r} must be a number, got {val!r}", field=key) from None
            if not math.isfinite(options[key]):
                raise InputError(f"option {key!r} of policy {name!r} must be finite, got {val!r}", field=key)
    try:
        policy = entry.factory(entry.config_cls(**options))
    except (InputError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - a policy (often a plug-in) that cannot be built: one line
        raise InputError(f"policy {name!r} could not be built from its options: {_describe_failure(e)}",
                         field="--policy") from None
    policy.name = name
    return policy


ABLATION_SUFFIX = "-nogroup"
"""``<policy>-nogroup``: the policy's queue ordering with grouping turned off (``grouping=False``)."""


def _has_grouping(entry: Entry) -> bool:
    return any(f.name == "grouping" for f in dataclasses.fields(entry.config_cls))


def config_of(policy: Policy) -> dict:
    """The policy's config as a plain dict (for ``config.json``)."""
    cfg = getattr(policy, "config", None)
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}


BUILTIN_MODULES = ("independent", "mlora", "tlora", "lorafusion", "alto", "lookahead", "tlora.reference")
ENTRY_POINT_GROUP = "tlora_sim.policies"
_loaded = False


_BROKEN: dict[str, str] = {}
"""Entry points that failed to load: entry-point name -> one line naming it, its distribution
and the error. Their policies are missing; every other command works (``make_policy`` of an
unknown name and ``tlora-sim policies`` mention them)."""


def _describe_failure(e: BaseException) -> str:
    """``Type: message`` of an exception raised while importing user code, on one line."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _load_builtin() -> None:
    """Import the built-in policy modules, then every ``tlora_sim.policies`` entry point, once.

    An entry point that fails to load (any exception, ``SystemExit`` included; only
    ``KeyboardInterrupt`` propagates) is recorded in ``_BROKEN`` with its distribution, not raised:
    it cannot end the process nor break commands that do not need its policies.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(f"tlora_sim.policies.{module}")
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - a broken plug-in is the user's input, not our bug
            dist = getattr(ep, "dist", None)
            where = f"distribution {dist.name} {dist.version}" if dist is not None else "an unknown distribution"
            _BROKEN[ep.name] = (f"policy entry point {ep.name!r} ({ep.value}) of {where} failed to load: "
                                f"{_describe_failure(e)}")


def broken_entry_points() -> list[str]:
    """One line per ``tlora_sim.policies`` entry point that failed to load (see ``_BROKEN``)."""
    _load_builtin()
    return list(_BROKEN.values())


def broken_entry_points_note() -> str:
    """``"; " + `` the failed entry points' lines, or "" when every entry point loaded."""
    return "".join(f"; {line}" for line in _BROKEN.values())


def load_policy_module(spec: str) -> list[str]:
    """Import a policy module given as a ``.py`` file path or a dotted module name, so that its
    ``@register`` decorators run; returns the names it registered, in order.

    A file is imported under a unique module name derived from its resolved path, so two files
    with the same name do not collide; loading the same spec twice registers nothing new and
    returns the names it registered the first time.

    Raises:
        InputError: a missing file, an import that fails (any exception, ``SystemExit`` and
            ``GeneratorExit`` included: one line with the error's message; only
            ``KeyboardInterrupt`` propagates), a module that registers no policy, or one that
            registers a built-in name.
    """
    _load_builtin()
    as_file = _is_file_spec(spec)
    key = policy_module_spec(spec)
    if key in _MODULE_NAMES:
        return list(_MODULE_NAMES[key])
    before = set(_REGISTRY)
    try:
        if as_file:
            path = Path(key)
            if not path.is_file():
                raise InputError(f"no such policy module file", file=spec, field="--policy-module")
            name = "tlora_sim_user_policy_" + hashlib.sha1(key.encode()).hexdigest()[:12]
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            try:
                mod_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            importlib.import_module(spec)
    except KeyboardInterrupt:
        _forget(set(_REGISTRY) - before)
        raise
    except InputError as e:
        _forget(set(_REGISTRY) - before)
        if e.file is None:  # raised by the module's own code (a clashing register): name the module
            raise InputError(e.message, file=spec, row=e.row, field=e.field) from None
        raise
    except BaseException as e:  # noqa: BLE001 - the user's module (SystemExit too): report, do not end
        _forget(set(_REGISTRY) - before)
        raise InputError(f"cannot import policy module: {_describe_failure(e)}", file=spec,
                         field="--policy-module") from None
    new = [n for n in _REGISTRY if n not in before]
    if not new:
        raise InputError("the module registered no policy (decorate a class with "
                         "tlora_sim.policies.api.register)", file=spec, field="--policy-module")
    _MODULE_NAMES[key] = new
    return new


_MODULE_NAMES: dict[str, list[str]] = {}


def _forget(names: set[str]) -> None:
    """Drop the policies a module registered before its import failed (nothing half-loaded)."""
    for n in names:
        _REGISTRY.pop(n, None)


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or Path(spec).is_file()


def policy_module_spec(spec: str) -> str:
    """``spec`` as ``load_policy_module`` keys it: a file (a ``.py`` name, or any existing file) as
    its absolute resolved path, so worker processes that start elsewhere find it; a dotted module
    name as given."""
    return str(Path(spec).resolve()) if _is_file_spec(spec) else spec
