"""A profiled artifact with calibration parameters applied, on a host of another speed, and how
much of a step follows the host (issue 43).

``tlora-sim costmodel calibrate`` (``profiler/calibrate.py``) measures a machine and fits a few
numbers over the shipped artifact; this module is what those numbers mean for the cost model, so the
simulator (``sim/experiments/fidelity.py``), the executor's validation
(``sim/executor/host_speed.py``) and the calibration share one definition:

* :func:`derive`: the artifact with calibration parameters applied (host scales per plan family
  and base model, ``host_scale``; a GPU scale; a per-step constant; the nano-batch host factor);
* :func:`with_host_speed`: the artifact on a host ``factor`` times as slow (every host term);
* :func:`host_share`: the share of a step's time that follows the host, from the step predicted at
  host speed 1 and 1 + ``HOST_STEP``; ``HOST_BOUND_SHARE`` is where a step counts as host-bound.

Host terms (``HOST_FIELDS``) are the eager step's launch-bound parts of a plan family's layer model
(``formula.layer_formula``: ``cpu0 + cpu_n x adapters + cpu_g x groups``, less the harness's
per-call overhead ``call_ms`` / ``call_ms_alone``). Times are milliseconds. Nothing here needs
torch or a GPU.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math

import numpy as np

#: host-scale groups: plan family -> scale name
HOST_GROUP = {"loop": "loop", "fused": "fused", "lorafusion": "fused", "grouped": "fused"}
HOST_FIELDS = ("cpu0", "cpu_n", "cpu_g", "call_ms", "call_ms_alone")
#: a step is host-bound where its time moves at least this share of a change in host speed
#: (``host_share``): half of it or more is host time
HOST_BOUND_SHARE = 0.5
#: the host-speed step ``host_share`` differentiates over (+10%)
HOST_STEP = 0.1


def host_scale(params: dict, group: str, model: str) -> float:
    """The host scale of ``group`` (``loop`` / ``fused``) for ``model``: its own
    (``host_<group>:<model>``) where it was measured, else ``host_<group>`` (the geometric mean
    of the measured models', or 1)."""
    own = params.get(f"host_{group}:{model}")
    if own is not None:
        return float(own)
    got = [float(v) for k, v in params.items() if k.startswith(f"host_{group}:")]
    if got:
        return float(math.exp(np.mean(np.log(got))))
    return float(params.get(f"host_{group}", 1.0))


def derive(art: dict, params: dict) -> dict:
    """The artifact ``art`` with calibration ``params`` applied to its fields (see the module
    docstring; host scales per base model, ``host_scale``); ``art`` is not changed. The result
    keeps ``art``'s ``id`` (``build`` sets the calibrated one) and gets a ``_sha256`` unique to
    ``params`` (the cost model's cache key), so it can be passed to ``ProfiledCostModel``."""
    g = float(params.get("gpu_scale", 1.0))
    out = {k: v for k, v in art.items() if not k.startswith("_")}
    out["optimizer"] = copy.deepcopy(art["optimizer"])
    out["optimizer"]["coef"]["const"] = out["optimizer"]["coef"].get("const", 0.0) + float(params.get("step_ms", 0.0))
    out["models"] = {}
    for name, e in art["models"].items():
        e2 = dict(e)
        e2["l0"] = {**e["l0"], "ms": [g * v for v in e["l0"]["ms"]]}
        e2["head"] = {**e["head"], "ms": [g * v for v in e["head"]["ms"]]}
        e2["attn"] = {s: {**v, "ms": [g * x for x in v["ms"]]} for s, v in e["attn"].items()}
        plans = {}
        for fam, pe in e["plans"].items():
            h = host_scale(params, HOST_GROUP.get(fam, "fused"), name)
            pe2 = dict(pe)
            pe2["coef"] = {k: g * v for k, v in pe["coef"].items()}
            hn = host_scale(params, HOST_GROUP.get(fam, "fused") + "_n", name)  # the "split host" form; 1 otherwise
            for f in HOST_FIELDS:
                if f in pe:
                    pe2[f] = h * pe[f] * (hn if f == "cpu_n" else 1.0)
            if fam != "loop":  # nano-batches run with the fused kernels only
                pe2["nano_host"] = float(params.get("nano_host", 1.0)) * pe.get("nano_host", 1.0)
            plans[fam] = pe2
        e2["plans"] = plans
        out["models"][name] = e2
    out["_sha256"] = hashlib.sha256((str(art.get("_sha256", art["id"])) + json.dumps(
        {k: float(v) for k, v in params.items()}, sort_keys=True)).encode()).hexdigest()
    return out


IDENTITY = {"host_loop": 1.0, "host_fused": 1.0, "nano_host": 1.0, "gpu_scale": 1.0, "step_ms": 0.0}


def with_host_speed(art: dict, factor: float) -> dict:
    """``art`` (shipped or calibrated) on a host ``factor`` times as slow as its reference: every
    host term (``HOST_FIELDS`` of every plan family and model) times ``factor``, nothing else
    changed (GPU tables and terms, ``nano_host``, the optimizer). ``factor`` = probe_ms /
    ``calibration.probe.ref_ms`` (``sim/executor/probe.py``). It is ``derive(art, {"host_loop":
    factor, "host_fused": factor})``, so the result has its own ``_sha256`` and can be passed to
    ``ProfiledCostModel``; ``factor`` = 1 predicts what ``art`` does.

    Raises:
        ValueError: ``factor`` not finite and > 0.
    """
    factor = float(factor)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"host speed factor must be finite and > 0, got {factor}")
    return derive(art, {"host_loop": factor, "host_fused": factor})


def host_share(base_ms, slow_ms):
    """The share of a step that follows the host: ``(slow_ms / base_ms - 1) / HOST_STEP``, where
    ``slow_ms`` is the step predicted by ``with_host_speed(art, 1 + HOST_STEP)`` and ``base_ms`` by
    ``art`` (floats or arrays of one shape, ms or s alike). 0: GPU-bound (no host term on the
    critical path); 1: the whole step is host terms; a step counts as host-bound from
    ``HOST_BOUND_SHARE``. Where ``base_ms`` is not > 0 the share is 0."""
    base = np.asarray(base_ms, dtype=float)
    slow = np.asarray(slow_ms, dtype=float)
    out = np.where(base > 0, (slow / np.where(base > 0, base, 1.0) - 1) / HOST_STEP, 0.0)
    return float(out) if out.ndim == 0 else out
