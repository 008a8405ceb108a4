"""tlora-sim's Python API: ``import tlora_sim as ts``.

This file is the package ``tlora_sim`` itself (``pyproject.toml`` maps ``tlora_sim`` to ``sim/api``;
``tlora_sim.sim``, ``tlora_sim.policies``, ``tlora_sim.traces`` and ``tlora_sim.profiler`` are the four
top-level folders). Names are imported on first use, so ``import tlora_sim`` loads neither pandas' readers
nor the simulator, and never torch.

- ``ts.read_trace(spec | DataFrame, **options)`` -> the common trace table (a DataFrame);
- ``ts.replay(trace, policy, cluster, seed, **options)`` -> :class:`Run` (``.jobs``, ``.timeline``,
  ``.tenants`` DataFrames, ``.summary``, ``.config`` dicts, ``.save(dir)``, ``.plot()``);
- ``ts.compare(trace, policies, cluster, seed, **options)`` -> :class:`Comparison` (``.summary`` DataFrame with
  the speed-up columns, ``.runs``, ``.save(dir)``, ``.plot()``);
- ``ts.costmodel(gpu, kind)`` -> ``.predict(model, members, gpus)``;
- ``ts.InputError``: every bad input.

Nothing is written unless ``.save`` is called. Reference: README.md, "Python API";
``tlora_sim.sim.experiments.api``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "read_trace": "tlora_sim.sim.experiments.api",
    "replay": "tlora_sim.sim.experiments.api",
    "compare": "tlora_sim.sim.experiments.api",
    "costmodel": "tlora_sim.sim.experiments.api",
    "Run": "tlora_sim.sim.experiments.api",
    "Comparison": "tlora_sim.sim.experiments.api",
    "CostModel": "tlora_sim.sim.experiments.api",
    "InputError": "tlora_sim.traces.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tlora_sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
