"""The machine's host speed through an executed run, and a step model that follows it
(``validate-run --host-speed``; issue 43).

Why: on the lent H200 hosts the host-bound floor of the eager training step drifts with time (the
smallest step's 10-s median ranged 106-200 ms within 270 s in one process;
``profiler/data/validation/README.md``, "Why workload A misses"), so a calibration taken minutes
before a run samples another speed than the run's. ``tlora-sim execute`` times a fixed host-bound
probe (``sim/executor/probe.py``) every ~2 s of the run into ``probes.csv`` (``t_s, probe_ms,
python_ms``; ``t_s`` on the run's clock, the clock of ``steps.csv`` and ``jobs.csv``), and
``costmodel calibrate`` records the probe's median during the calibration as
``calibration.probe.ref_ms`` of the calibrated artifact, whose host terms are those at that
reference speed. The host factor at time t is then probe(t) / ref, and the step model at t is the
artifact with every host term times that factor (:func:`speed_artifact`). It uses the run's probes,
never its steps: the steps are what the validation predicts.

* :func:`read_probes`: ``probes.csv``, checked.
* :func:`factor_series` -> :class:`HostSpeed`: the factor at probe k is the median ``probe_ms`` of
  the run's probes with ``|t_s - t_k| <= window_s``, over ``ref_ms``, quantised to ``QUANTUM``
  (0.5%: so the derived cost models repeat and a run needs a few dozen of them, not one per probe);
  piecewise constant in time: the first probe's value from the start to the first probe, then
  each probe's value from its ``t_s`` to the next probe's.
* :class:`HostSpeedCostModel`: a cost model whose step time is that of the model of the factor at
  the engine's clock (``clock``, a callable; ``validate`` binds it to ``engine.env.now``); one model
  per factor, built lazily. The engine re-times every running group at each probe's instant
  (``Engine(retime_at=HostSpeed.instants())``), so a group's step follows the factor.

* :func:`probe_pause`: what the probes themselves cost the run's steps. ``execute`` measures a
  probe between steps, so a probe taken while a group runs delays that group's next step by the
  probe's duration (about 20 ms on an H200 host, ~1% of a busy run); one taken while the devices
  idle delays nothing. ``validate-run`` stretches the engine's step times by the busy share.

The window (10 s) and the quantum are fixed choices (the drift study's 10-s medians; not tuned on
validation results).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from tlora_sim.sim.report.runcsv import check_finite, read_run_csv
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

#: the file ``tlora-sim execute`` writes in a run directory, and the columns read from it
#: (``sim/executor/probe.py``'s ``COLUMNS`` are ``t_s, probe_ms, python_ms``; ``python_ms`` is not used)
PROBES = RunDir.PROBES
NEED = ["t_s", "probe_ms"]
#: the factor's quantum (0.5%)
QUANTUM = 0.005
#: default half-width of the median window (s)
WINDOW_S = 10.0
#: the artifact field of the reference probe time (ms)
REF_FIELD = "calibration.probe.ref_ms"


def calibration_probe(art: dict) -> dict:
    """``art["calibration"]["probe"]`` (``costmodel calibrate``'s probe record: ``ref_ms``, ``what``,
    the readings) where it is a dict, else ``{}``."""
    cal = art.get("calibration") if isinstance(art, dict) else None
    probe = cal.get("probe") if isinstance(cal, dict) else None
    return probe if isinstance(probe, dict) else {}


def reference_ms(art: dict) -> float | None:
    """``art["calibration"]["probe"]["ref_ms"]`` (ms) when present, positive and finite, else None."""
    ref = calibration_probe(art).get("ref_ms")
    try:
        ref = float(ref)
    except (TypeError, ValueError):
        return None
    return ref if np.isfinite(ref) and ref > 0 else None


def read_probes(path: str | Path) -> pd.DataFrame:
    """A run's ``probes.csv`` as ``t_s, probe_ms`` (float; sorted by ``t_s``, stable); an empty
    table when the file has a header and no rows.

    Raises:
        InputError: unreadable, a missing column, or a value that is not a finite number
            (``probe_ms`` also > 0), naming the file, row and field.
    """
    path = Path(path)
    df = read_run_csv(path, "probes.csv", NEED)
    check_finite(df, NEED, path, positive=("probe_ms",))
    for c in NEED:
        df[c] = pd.to_numeric(df[c]).astype(float)
    return df[NEED].sort_values("t_s", kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class HostSpeed:
    """A piecewise-constant host factor: ``factors[k]`` from ``times[k]`` to ``times[k + 1]``, and
    ``factors[0]`` before ``times[0]``.

    Attributes:
        times: the probes' ``t_s`` (s, ascending).
        factors: the quantised factor of each probe (probe median over the reference; 1 = the
            calibration's host speed, > 1 = a slower host).
    """

    times: tuple[float, ...]
    factors: tuple[float, ...]

    def at(self, t: float) -> float:
        """The factor at time ``t`` (s)."""
        k = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.factors[max(k, 0)]

    def instants(self) -> list[float]:
        """Where the factor may change: every probe's ``t_s`` after the first one's and after 0 (s,
        ascending, distinct; the engine's clock starts at 0, where ``at`` is read anyway)."""
        return sorted(t for t in set(self.times[1:]) if t > 0 and t != self.times[0])

    def quantiles(self) -> tuple[float, float, float]:
        """(p10, median, p90) of the probes' factors (one value per probe, not weighted by time)."""
        p10, p50, p90 = np.quantile(np.asarray(self.factors, dtype=float), [0.1, 0.5, 0.9])
        return float(p10), float(p50), float(p90)


def quantise(x: np.ndarray | float) -> np.ndarray:
    """``x`` rounded to the nearest multiple of ``QUANTUM`` (ties to even), as ``k / 200``: the
    same factor is always the same float."""
    return np.rint(np.asarray(x, dtype=float) / QUANTUM) / (1 / QUANTUM)


def check_window(window_s: float) -> float:
    """``window_s`` as a float if it is a finite number >= 0 (s).

    Raises:
        InputError: otherwise (``--probe-window``).
    """
    try:
        w = float(window_s)
    except (TypeError, ValueError):
        w = float("nan")
    if not (np.isfinite(w) and w >= 0):
        raise InputError(f"--probe-window must be a finite number >= 0, got {window_s!r}", field="--probe-window")
    return w


def factor_series(probes: pd.DataFrame, ref_ms: float, window_s: float = WINDOW_S) -> HostSpeed:
    """The host factor through a run (see the module docstring).

    Args:
        probes: ``read_probes`` output (``t_s`` s, ``probe_ms`` ms; at least one row).
        ref_ms: the calibration's reference probe time (ms, > 0).
        window_s: half-width of the median window (s, >= 0).

    Raises:
        InputError: no probe, or a ``ref_ms`` / ``window_s`` out of range (``--probe-window``).
    """
    check_window(window_s)
    if not (np.isfinite(ref_ms) and ref_ms > 0):
        raise InputError(f"the reference probe time must be > 0, got {ref_ms!r}", field=REF_FIELD)
    if probes.empty:
        raise InputError("probes.csv has no probe", field="probes.csv")
    t = probes.t_s.to_numpy(dtype=float)
    p = probes.probe_ms.to_numpy(dtype=float)
    lo = np.searchsorted(t, t - window_s, side="left")
    hi = np.searchsorted(t, t + window_s, side="right")
    med = np.array([np.median(p[a:b]) for a, b in zip(lo, hi)])
    return HostSpeed(tuple(map(float, t)), tuple(map(float, quantise(med / ref_ms))))


def speed_artifact(art: dict, factor: float) -> dict:
    """``art`` with every host term times ``factor`` (its loop and fused host scales; GPU terms,
    memory and the rest unchanged): ``sim/costmodel/profiled/calibrated.py``'s ``with_host_speed``.

    Raises:
        ValueError: ``factor`` not finite and > 0.
    """
    from tlora_sim.sim.costmodel.profiled.calibrated import with_host_speed

    return with_host_speed(art, float(factor))


class HostSpeedCostModel:
    """A cost model whose step times follow a host factor through time.

    Args:
        build: factor -> the cost model at that host speed (called once per distinct factor, e.g.
            ``lambda f: ProfiledCostModel(speed_artifact(art, f), checkpointing=False)``).
        speed: the factor through time (:class:`HostSpeed`).
        base: the model of memory, FLOPs and ``describe`` (host speed changes neither memory nor FLOPs).
        clock: callable -> the current time (s) on the run's clock; the engine's
            (``lambda: engine.env.now``) once bound. Default: time 0.

    ``step_time_s`` is ``build(speed.at(clock()))``'s; everything else is ``base``'s. After a run
    the engine's clock stays at its end, so reads then (the engine's reference steps: the replay's
    ``jobs.csv`` ``run_slowdown``) are at the last factor.
    """

    name = "host-speed"

    def __init__(self, build: Callable[[float], object], speed: HostSpeed, base, clock: Callable[[], float] = None):
        self.build, self.speed, self.base = build, speed, base
        self.clock = clock or (lambda: 0.0)
        self._models: dict[float, object] = {}

    def model(self, factor: float):
        """The cost model at host factor ``factor`` (built on first use, then kept)."""
        m = self._models.get(factor)
        if m is None:
            m = self._models[factor] = self.build(factor)
        return m

    def at(self, t: float):
        """The cost model at time ``t`` (s)."""
        return self.model(self.speed.at(t))

    def step_time_s(self, *a, **k) -> float:
        """The step time (s) at the clock's time (``CostModel.step_time_s``' arguments)."""
        return self.at(self.clock()).step_time_s(*a, **k)

    def memory_bytes(self, *a, **k) -> float:
        return self.base.memory_bytes(*a, **k)

    def step_flops(self, *a, **k) -> float:
        return self.base.step_flops(*a, **k)

    def batch(self, *a, **k):
        return None

    def describe(self) -> dict:
        p10, p50, p90 = self.speed.quantiles()
        return {**self.base.describe(), "name": self.name, "host_factor_p10": p10, "host_factor_median": p50,
                "host_factor_p90": p90}



def probe_pause(steps: pd.DataFrame, probe_t_s, probe_s_each: float) -> tuple[float, int]:
    """The stretch of step times that a run's probes caused, and how many probes caused it.

    A group is busy from its ``start`` event's ``start_s`` to its last event's ``end_s``
    (``steps.csv``, s on the run's clock); the run is busy where any group is. A probe whose
    ``t_s`` falls in a busy stretch paused the running groups for ``probe_s_each`` (the run's
    ``perf.json``: ``probe_s / probes``, s); one in an idle stretch paused nothing. The stretch
    is busy / (busy - paused), so that step time x stretch adds the pauses back to the steps
    (``validate-run``). It assumes every busy probe paused a step (probes come between steps).

    Args:
        steps: ``steps.csv`` rows (``group_id``, ``start_s``, ``end_s``).
        probe_t_s: the probes' ``t_s`` (s).
        probe_s_each: seconds one probe took (>= 0).

    Returns:
        (stretch >= 1, busy probes); (1.0, 0) without steps or probes.
    """
    t = np.sort(np.asarray(probe_t_s, dtype=float))
    if steps.empty or not len(t) or not probe_s_each > 0:
        return 1.0, 0
    span = steps.groupby("group_id").agg(a=("start_s", "min"), b=("end_s", "max")).sort_values("a")
    merged: list[list[float]] = []
    for a, b in zip(span.a.to_numpy(dtype=float), span.b.to_numpy(dtype=float)):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    busy_s = sum(b - a for a, b in merged)
    starts = np.array([a for a, _ in merged])
    ends = np.array([b for _, b in merged])
    k = np.searchsorted(starts, t, side="right") - 1
    n = int(((k >= 0) & (t <= ends[np.maximum(k, 0)])).sum())
    paused = n * float(probe_s_each)
    if busy_s <= paused:
        return 1.0, n
    return busy_s / (busy_s - paused), n
