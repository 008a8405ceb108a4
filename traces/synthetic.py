"""Synthetic trace generator with parameters fitted to the Microsoft ITP traces (``traces/data/itp_fit.json``,
made by :mod:`tlora_sim.traces.fit_synthetic`; numbers only, no copied rows).

Model (draws in this fixed order from the given ``numpy.random.Generator``):

1. GPUs per job: the empirical ITP probabilities over {1, 2, 4, 8, 16, 32, 64}; sizes above ``max_gpus``
   are removed and the rest renormalised (a 64-GPU ITP job does not become a 16-GPU job of the same length).
2. Duration (s): lognormal fitted per GPU count (``exp(mu_g + sigma_g * z)``), times ``duration_scale``,
   clipped to ``[min_s * duration_scale, min(max_s * duration_scale, max_duration_s)]`` (ITP: 600 s ..
   1,573,360 s). mu = ln(median), sigma matched to the class's mean duration (see :mod:`tlora_sim.traces.fit_synthetic`).
3. Arrivals: a gamma renewal process (mean gap = 1 / rate, CV fitted to ITP after removing the diurnal
   cycle, CV ~3.7: bursty), run in operational time and mapped to real time through the fitted 24-hour rate
   profile (so arrivals follow the ITP day/night cycle; hour 0 = the first job). ``rate = fitted ITP
   rate (48.3 jobs/h, all clusters) * load_scale``.

Spec ``synthetic:OPTIONS`` where OPTIONS is ``default`` (or empty) or ``key=value,...`` overriding these
defaults (``synthetic:default`` is the demo workload used by ``make demo``):

==========  =======  ==============================================================================
key         default  meaning
==========  =======  ==============================================================================
jobs        600      number of jobs
seed        7        generator seed (separate from the simulator seed); see below
load        0.7      offered GPU demand as a fraction of a ``gpus``-GPU cluster: the arrival rate is
                     ``load * gpus / E[num_gpus * duration_s]``
gpus        32       reference cluster size in GPUs (32 = 4 nodes x 8 H100, the demo cluster)
max_gpus    16       largest GPU count per job
dur_scale   0.2      multiplies the fitted durations (LoRA fine-tunes are shorter than ITP's jobs)
max_dur_h   4        duration clip in hours
diurnal     1        1 = follow the fitted day/night arrival profile, 0 = stationary
==========  =======  ==============================================================================

Why these numbers: with ITP durations unscaled (GPUs capped at 16), 70 % of 32 GPUs is ~1.2 jobs/h and 600
jobs arrive over ~20 days; clipping alone would need a 1 h cap (every job longer than the 600 s minimum
squeezed into 10-60 min), which flattens the shape. Scaled by 0.2 and clipped at 4 h (median job ~34 min,
E[num_gpus * duration_s] ~8,100 GPU-s) the default arrives at ~9.9 jobs/h, so 600 jobs are expected to
arrive over ~2.5 days. The arrivals are bursty (CV ~3.7), so one seed's span and realised demand
(GPU-seconds / (32 GPUs x arrival span)) vary: over seeds 0-19, 1.8-3.2 days and 50-106 %. The default
seed 7 is picked as a typical draw: 600 jobs arrive over 2.36 days, the last finishes at 2.45 days (without
queueing), realised demand 73 %, GPU counts up to 16.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.distributions import HOUR_S, clipped_lognormal_mean, real_time
from tlora_sim.traces.frame import finish_frame

DEFAULT_OPTIONS: dict[str, Any] = {"jobs": 600, "seed": 7, "load": 0.7, "gpus": 32, "max_gpus": 16,
                                   "dur_scale": 0.2, "max_dur_h": 4.0, "diurnal": 1}
#: the largest synthetic workload accepted, checked before anything is allocated. The replay
#: benchmark's 1M-job case peaked at 1.9-2.6 GB RSS (``bench/results/replay_x86_64-2cpu.csv``,
#: about 2.4 kB per job), so 5M jobs need ~12 GB and more would exhaust a workstation.
MAX_JOBS = 5_000_000
_BYTES_PER_JOB = 2400

#: accepted ranges of the scale options (a load or duration scale outside them describes no
#: cluster: arrivals all at t=0, or jobs shorter than a microsecond).
_RANGES = {"load": (1e-6, 1e6), "dur_scale": (1e-6, 1e6)}

_TYPES = {"jobs": int, "seed": int, "gpus": int, "max_gpus": int, "diurnal": int,
          "load": float, "dur_scale": float, "max_dur_h": float}


@lru_cache(maxsize=1)
def _fit_text() -> str:
    return resources.files("tlora_sim.traces").joinpath("data/itp_fit.json").read_text()


def itp_params() -> dict:
    """The shipped ITP fit (``traces/data/itp_fit.json``) as a fresh dict."""
    return json.loads(_fit_text())


def _gpu_table(params: dict, max_gpus: int | None) -> tuple[np.ndarray, np.ndarray]:
    probs = {int(k): float(v) for k, v in params["gpus"]["probabilities"].items()}
    sizes = np.array(sorted(g for g in probs if max_gpus is None or g <= max_gpus), dtype=np.int64)
    if sizes.size == 0:
        raise InputError(f"max_gpus={max_gpus} is below every GPU count in the fit ({sorted(probs)})",
                         field="max_gpus")
    p = np.array([probs[g] for g in sizes])
    return sizes, p / p.sum()


def _clip_bounds(params: dict, duration_scale: float, max_duration_s: float | None) -> tuple[float, float]:
    lo = params["duration"]["min_s"] * duration_scale
    hi = params["duration"]["max_s"] * duration_scale
    if not (0 < lo < hi < math.inf):
        raise InputError(f"scales the fitted durations to [{lo:g}, {hi:g}] s, outside (0, inf)",
                         field="dur_scale")
    if max_duration_s is not None:
        hi = min(hi, max_duration_s)
    if not lo < hi:
        raise InputError(f"duration clip range [{lo:g}, {hi:g}] s is empty (the shortest fitted job is "
                         f"{lo / HOUR_S:g} h)", field="max_dur_h")
    return lo, hi


def expected_gpu_seconds(params: dict | None = None, *, max_gpus: int | None = None,
                         duration_scale: float = 1.0, max_duration_s: float | None = None) -> float:
    """E[num_gpus * duration_s] per generated job, in GPU-seconds (exact for the clipped lognormals)."""
    params = params or itp_params()
    sizes, p = _gpu_table(params, max_gpus)
    lo, hi = _clip_bounds(params, duration_scale, max_duration_s)
    by = params["duration"]["by_gpus"]
    return float(sum(pi * g * clipped_lognormal_mean(by[str(g)]["mu"] + math.log(duration_scale),
                                                      by[str(g)]["sigma"], lo, hi) for g, pi in zip(sizes, p)))


def generate_synthetic(n_jobs: int, rng: np.random.Generator, params: dict | None = None,
                       load_scale: float = 1.0, *, max_gpus: int | None = None, duration_scale: float = 1.0,
                       max_duration_s: float | None = None, diurnal: bool = True) -> pd.DataFrame:
    """Generate ``n_jobs`` jobs in the common trace schema (see the module docstring for the model).

    Args:
        n_jobs: number of jobs (>= 1).
        rng: the generator; draws happen in the order GPUs, durations, inter-arrival gaps.
        params: fitted parameters (default: the shipped ITP fit, :func:`itp_params`).
        load_scale: multiplies the fitted arrival rate (jobs/h).
        max_gpus: drop GPU counts above this and renormalise (None = keep all).
        duration_scale: multiplies the fitted durations.
        max_duration_s: upper duration clip in seconds (None = the fitted maximum only).
        diurnal: modulate arrivals by the fitted hour-of-day profile.

    Returns:
        DataFrame (``job_id`` ``syn000000``..., ``tenant`` ""), attrs format ``synthetic``.

    Raises:
        InputError: n_jobs < 1, load_scale or duration_scale <= 0, max_gpus below every size, empty clip range.
    """
    if int(n_jobs) < 1:
        raise InputError(f"need at least 1 job, got {n_jobs}", field="jobs")
    if not load_scale > 0 or not duration_scale > 0:
        raise InputError("load_scale and duration_scale must be > 0", field="load")
    params = params or itp_params()
    n = int(n_jobs)
    sizes, p = _gpu_table(params, max_gpus)
    lo, hi = _clip_bounds(params, duration_scale, max_duration_s)
    gpus = rng.choice(sizes, size=n, p=p)
    by = params["duration"]["by_gpus"]
    mu = np.array([by[str(g)]["mu"] for g in sizes])[np.searchsorted(sizes, gpus)]
    sigma = np.array([by[str(g)]["sigma"] for g in sizes])[np.searchsorted(sizes, gpus)]
    duration = np.clip(np.exp(mu + sigma * rng.standard_normal(n)) * duration_scale, lo, hi)
    arrival = params["arrival"]
    mean_gap = HOUR_S / (arrival["rate_per_h"] * load_scale)
    shape = 1.0 / arrival["interarrival_cv"] ** 2
    u = np.cumsum(rng.gamma(shape, mean_gap / shape, size=n))
    t = real_time(u, arrival["diurnal_hourly_factor"]) if diurnal else u
    df = finish_frame(job_id=np.char.add("syn", np.char.zfill(np.arange(n).astype(str), 6)), submit_s=t,
                      duration_s=duration, num_gpus=gpus, tenant=np.full(n, "", dtype=object),
                      rows=None, file="generated", fmt="synthetic", check_ids=False)
    df.attrs["skipped"] = {}
    return df


def parse_options(arg: str) -> dict[str, Any]:
    """Parse ``default`` / ``""`` / ``key=value,...`` into the full option dict (defaults filled in).

    Raises:
        InputError (field = the key): unknown key, bad syntax, value of the wrong type or out of range.
    """
    opts = dict(DEFAULT_OPTIONS)
    seen: set[str] = set()
    for item in (arg or "").split(","):
        item = item.strip()
        if not item or item == "default":
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise InputError(f"expected key=value, got {item!r}; keys: {', '.join(DEFAULT_OPTIONS)}", field=key)
        if key not in _TYPES:
            raise InputError(f"unknown synthetic option {key!r}; keys: {', '.join(DEFAULT_OPTIONS)}", field=key)
        if key in seen:
            raise InputError(f"given twice in {arg!r}", field=key)
        seen.add(key)
        try:
            opts[key] = _TYPES[key](value.strip())
        except ValueError:
            raise InputError(f"expected {_TYPES[key].__name__}, got {value.strip()!r}", field=key) from None
        if not math.isfinite(opts[key]):
            raise InputError(f"must be a finite number, got {value.strip()!r}", field=key)
    for key in ("jobs", "gpus", "max_gpus", "load", "dur_scale", "max_dur_h"):
        if not opts[key] > 0:
            raise InputError(f"must be > 0, got {opts[key]}", field=key)
    for key, (lo, hi) in _RANGES.items():
        if not lo <= opts[key] <= hi:
            raise InputError(f"must be in [{lo:g}, {hi:g}], got {opts[key]:g}", field=key)
    if opts["jobs"] > MAX_JOBS:
        raise InputError(f"{opts['jobs']:,} jobs is above the limit of {MAX_JOBS:,} (about {_BYTES_PER_JOB} "
                         f"bytes per job in the simulation: the run would exhaust memory)", field="jobs")
    if opts["seed"] < 0 or opts["diurnal"] not in (0, 1):
        bad = "seed" if opts["seed"] < 0 else "diurnal"
        raise InputError(f"invalid value {opts[bad]} (seed >= 0, diurnal 0 or 1)", field=bad)
    return opts


def read_synthetic(arg: str) -> pd.DataFrame:
    """Build the workload of spec ``synthetic:ARG`` (options in the module docstring).

    The arrival rate is chosen so that the offered GPU demand is ``load`` of a ``gpus``-GPU cluster.
    ``attrs["synthetic"]`` records the resolved options, the arrival rate (jobs/h) and the fit's date.

    Raises:
        InputError: bad options (field = the key).
    """
    o = parse_options(arg)
    params = itp_params()
    max_dur_s = o["max_dur_h"] * HOUR_S
    gpu_s = expected_gpu_seconds(params, max_gpus=o["max_gpus"], duration_scale=o["dur_scale"],
                                 max_duration_s=max_dur_s)
    rate_per_h = o["load"] * o["gpus"] / gpu_s * HOUR_S
    df = generate_synthetic(o["jobs"], np.random.default_rng(o["seed"]), params,
                            rate_per_h / params["arrival"]["rate_per_h"], max_gpus=o["max_gpus"],
                            duration_scale=o["dur_scale"], max_duration_s=max_dur_s, diurnal=bool(o["diurnal"]))
    df.attrs["path"] = arg or "default"
    df.attrs["synthetic"] = {"options": o, "rate_per_h": rate_per_h, "expected_gpu_seconds_per_job": gpu_s,
                             "fit": f"traces/data/itp_fit.json ({params['created']})"}
    return df
