"""The measuring half of ``tlora-sim costmodel calibrate`` (the fitting half, torch-free, is
``profiler/calibrate.py``): full-model training steps of the designed points timed through the
executor's own ``GroupTrainer.step`` (``trainer.py``), so the calibration sees what ``execute``
runs, with host-speed probe readings (``probe.py``) before, between and after each point's timed
steps (the fit reads the host terms relative to the probe's speed). The protocol (warm-up and
timed steps, when a reading is due) and its wall-time estimate are ``profiler/calibrate.py``'s
(``more_reps``, ``probe_due``, ``point_wall_s``). Needs torch (a GPU, or the CPU with ``tiny``
for a dry run)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from tlora_sim.profiler.calibrate import (MAX_REPS, POINT_COLUMNS, PROBE_COLUMNS, WARMUP_STEPS, members_str, more_reps,
                                          probe_due)


def measure(points: list[dict], device: str = "cuda", tiny: bool = False, budget_s: float = 150.0,
            log=print, max_reps: int = MAX_REPS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time full-model training steps of ``points`` (``design`` dicts) on ``device``.

    Each point builds a group with ``sim/executor/trainer.py``'s ``GroupTrainer`` (what
    ``tlora-sim execute`` trains), runs ``WARMUP_STEPS`` (2) warm-up steps (the first carries the
    build's one-off costs), then times steps while ``more_reps``: until 3 of them and 1.5 s of them
    have passed, at most ``max_reps`` (default ``MAX_REPS``, 16: steps from 94 ms up get their
    1.5 s); ``measured_ms`` is their mean (what a run's clock adds up), ``p10_ms``/``p90_ms`` their
    spread. One ``HostProbe`` (``probe.py``) on ``device`` is read right before the timed steps,
    after a timed step when ``probe_due`` (the second, then every second once 0.45 s of steps have
    passed since the last reading) and right after the last one: 3-5 readings per point (4-5 for
    the host-bound points of 74-373 ms; at least 3 anywhere, since at least 3 steps are timed); the
    point's ``probe_ms`` is their mean (the host speed it ran at). A reading costs ~25 ms on an
    H200 host (~165 readings, ~4 s of a calibration) and is not counted in the 1.5 s. Points are
    measured in order until ``budget_s`` seconds of wall time (base-model builds and probes
    included) are spent; the rest are left out (logged). ``profiler/calibrate.py``'s
    ``point_wall_s`` estimates a point's wall time (the design: ~124 s of points on one H200, ~149 s
    of ``measure`` with its start and a cold kernel cache).

    Returns:
        (points, probes): one row per measured point (``POINT_COLUMNS``), and every probe
        measurement of the kept points (``PROBE_COLUMNS``: ``t_s`` seconds since the calibration
        started, ``probe_ms``, ``python_ms``, ``point`` the row of ``points`` it belongs to).
    """
    from tlora_sim.sim.executor.probe import HostProbe  # torch
    from tlora_sim.sim.executor.trainer import DeviceTrainer

    t_start = time.perf_counter()
    trainer = DeviceTrainer(device, tiny=tiny)
    host_probe = HostProbe(device)
    host_probe.measure()  # discarded: the probe's first passes carry one-off costs (allocator, library init)
    rows, probes, job = [], [], 0

    def probe_now() -> dict:
        m = host_probe.measure()
        return {"t_s": time.perf_counter() - t_start, "probe_ms": float(m["probe_ms"]),
                "python_ms": float(m["python_ms"]), "point": len(rows)}

    for k, p in enumerate(points):
        if time.perf_counter() - t_start > budget_s:
            log(f"calibrate: budget of {budget_s:.0f} s spent; {len(points) - k} of {len(points)} points left out")
            break
        trainer.base(p["model"])
        members = [(-1 - job - i, r, b, s) for i, (r, b, s) in enumerate(p["members"])]
        job += len(members)
        times, g, around = [], None, []
        try:
            g = trainer.group(p["model"], p["plan"], members)
            for _ in range(WARMUP_STEPS):
                g.step(p["nano"])
            around.append(probe_now())
            t0, probe_s, last = time.perf_counter(), 0.0, 0.0  # probe_s: readings' seconds, not timed
            while more_reps(len(times), time.perf_counter() - t0 - probe_s, max_reps):
                times.append(g.step(p["nano"]))
                timed = time.perf_counter() - t0 - probe_s
                if more_reps(len(times), timed, max_reps) and probe_due(len(times), timed - last):
                    t1 = time.perf_counter()
                    around.append(probe_now())
                    probe_s += time.perf_counter() - t1
                    last = timed
            around.append(probe_now())
        except RuntimeError as e:  # torch.OutOfMemoryError is one: the point is left out
            if "out of memory" not in str(e).lower():
                raise
            log(f"  {p['model']} {p['plan']} {members_str(p['members'])}: out of memory, left out")
            times = []
        del g
        trainer.states.clear()
        trainer.release()
        if not times or len(around) < 2:
            continue
        probes.extend(around)
        t = np.asarray(times)
        rows.append({"model": p["model"], "plan": p["plan"], "nano": int(p["nano"]),
                     "members": members_str(p["members"]), "adapters": len(p["members"]),
                     "tokens": int(sum(b * s for _, b, s in p["members"])), "role": p["role"], "reps": len(t),
                     "measured_ms": float(t.mean()), "p10_ms": float(np.quantile(t, 0.1)),
                     "p90_ms": float(np.quantile(t, 0.9)),
                     "probe_ms": float(np.mean([a["probe_ms"] for a in around]))})
        log(f"  {p['model']:10s} {p['plan']:6s} nano {p['nano']} {rows[-1]['members']:40s} "
            f"{rows[-1]['measured_ms']:9.2f} ms x {len(t)}, probe {rows[-1]['probe_ms']:.2f} ms x {len(around)} "
            f"({p['role']})")
    return pd.DataFrame(rows, columns=POINT_COLUMNS), pd.DataFrame(probes, columns=PROBE_COLUMNS)
