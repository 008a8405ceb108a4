"""What a run records about where its numbers come from: the share of its input it covers and the
software that computed it. A replay (``sim/experiments/replay.py``) and an executed run
(``sim/executor/execute.py``) write both the same way (``summary.json``, ``config.json``).
"""

from __future__ import annotations

import importlib.metadata as md
import platform

VERSIONED = ("tlora-sim", "simpy", "numpy", "pandas")
"""The distributions whose versions shape results (``config.json`` ``versions``)."""


def coverage(kept: int, skipped: dict, cost_model: dict) -> dict:
    """What a run covers: ``kept_jobs`` of ``input_jobs`` (the trace's rows, or sweep configurations,
    before skips), and ``extrapolated_share`` of the cost model's distinct predictions that left
    its measured grid (0 for a model that does not count them).

    Args:
        kept: jobs simulated (or executed).
        skipped: reason -> rows skipped (``traces/README.md``'s documented rules).
        cost_model: the cost model's ``describe()`` (``predictions``, ``extrapolated``, ``kind``).

    Returns:
        ``{"input_jobs": int, "kept_jobs": int, "extrapolated_share": float in [0, 1]}``; a model
        that measured nothing and counts nothing (the roofline) has share 1.0.
    """
    preds = int(cost_model.get("predictions", 0) or 0)
    extra = int(cost_model.get("extrapolated", 0) or 0)
    share = extra / preds if preds else 0.0
    if cost_model.get("kind") != "profiled" and "predictions" not in cost_model:
        share = 1.0  # a model that measured nothing and counts nothing (the roofline): every prediction
    return {"input_jobs": kept + sum(int(v) for v in skipped.values()), "kept_jobs": kept,
            "extrapolated_share": share}


def versions() -> dict[str, str]:
    """Versions of the interpreter and the libraries that shape results: ``{"python": "3.x.y",
    <distribution>: version or "unknown"}`` for each of :data:`VERSIONED`."""
    out = {"python": platform.python_version()}
    for pkg in VERSIONED:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "unknown"
    return out
