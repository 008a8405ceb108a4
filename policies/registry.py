"""Policy registry: name -> (factory, config dataclass, one-line description).

A policy is any object with ``name: str``, ``plan: str`` and ``decide(snapshot) -> list[Action]``
(``tlora_sim.sim.core.snapshot``). Register with :func:`register`; build with :func:`make_policy`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import Action, Snapshot


class Policy(Protocol):
    """A grouping/scheduling policy: a pure function of the snapshot."""

    name: str
    plan: str

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
    """Class decorator: register a policy class whose ``__init__`` takes one ``config_cls`` instance."""

    def deco(cls):
        _REGISTRY[name] = Entry(name, cls, config_cls, description)
        return cls

    return deco


def available() -> list[Entry]:
    """Registered policies in registration order."""
    _load_builtin()
    return list(_REGISTRY.values())


def make_policy(name: str, options: dict[str, Any] | None = None) -> Policy:
    """Build a policy by name with optional config overrides.

    Raises:
        InputError: unknown policy, unknown option or an option of the wrong type.
    """
    _load_builtin()
    options = dict(options or {})
    ablation = name.endswith(ABLATION_SUFFIX) and name[: -len(ABLATION_SUFFIX)] in _REGISTRY
    base = name[: -len(ABLATION_SUFFIX)] if ablation else name
    if base not in _REGISTRY:
        known = ", ".join(list(_REGISTRY) + [e.name + ABLATION_SUFFIX for e in _REGISTRY.values()
                                             if _has_grouping(e)])
        raise InputError(f"unknown policy {name!r}; known: {known}", field="--policy")
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
            except (TypeError, ValueError):
                raise InputError(f"option {key!r} of policy {name!r} must be a number, got {val!r}", field=key) from None
    policy = entry.factory(entry.config_cls(**options))
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


def _load_builtin() -> None:
    # Importing the modules runs their @register decorators.
    import importlib

    for module in ("independent", "mlora", "tlora", "lorafusion", "alto", "lookahead"):
        importlib.import_module(f"tlora_sim.policies.{module}")
