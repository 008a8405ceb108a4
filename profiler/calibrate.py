"""``tlora-sim costmodel calibrate``: a few-minute calibration of the profiled step model to the
machine at hand (issue 43).

The shipped artifact (``profiler/data/costmodel_<gpu>.json``) was profiled on one machine; the
host-bound floor of the eager training step (kernel launches, Python) depends on the host CPU and
the software stack, and GPUs of one kind differ by a few percent. Calibration keeps every table
and fitted shape of the shipped artifact and fits four numbers on this machine:

* ``host_scale.loop``: multiplies the host terms (``cpu0``, ``cpu_n``, ``cpu_g``, ``call_ms``,
  ``call_ms_alone``) of the ``loop`` family (plans ``alone`` and ``loop``: the eager per-adapter
  loop);
* ``host_scale.fused``: the same for ``fused`` (and ``lorafusion`` / ``grouped``, which the
  executor runs with the fused kernel too: ``sim/executor/trainer.py``'s ``IMPL``);
* ``gpu_scale``: multiplies every GPU table and term (``l0``, ``attn``, ``head`` ms, every plan's
  ``coef``);
* ``step_ms``: a constant added to every optimizer step (``optimizer.coef.const``): per-step work
  of the executed step that the layer profile does not see (``zero_grad``, the loss, the sync).

They are fitted by least squares on log(predicted / measured) over the *fit* points of a designed
set of full-model training steps (``design``), measured (``sim/executor/calibration.py``'s
``measure``) through the same ``GroupTrainer.step`` that ``tlora-sim execute`` runs: per base
model (22 configurations, 44 points; ``_DESIGN``), 5 jobs ``alone`` of 512 to 8,192 tokens (the
host-bound floor and the GPU-bound curve), 6 ``loop`` mixes (1-, 2- and 4-member loops of
512-2,048-token jobs, host-bound, and a GPU-bound 6,144-token loop), 8 ``fused`` mixes (1-4 small
members of 512-3,072 tokens in all, host-bound to the crossover, and 5,632-8,192-token mixes) and
3 fused mixes in 2 and 4 nano-batches. Every third point of each plan group is held out (``role``
= ``heldout``; 12 points, 1,024 to 6,144 tokens): its error under the shipped and under the
calibrated artifact is printed and stored. Each point: 2 warm-up steps, 3-16 timed steps (1.5 s
of them), 3-5 probe readings (``WARMUP_STEPS`` ... ``PROBE_EVERY_S``).

Wall time (``point_wall_s``: the protocol, with per-point costs fitted to the probe timestamps of
the first design's two H200 calibrations of 2026-12-02, which it reproduces: every ``reps``, and
123.1 s against 141.1 - 17.3 s of compilation = 123.8 s, and 119.1 s against 117.8 s): at the
step times the first of them predicts (``calibrated_h200.json``), this design's points take
124.1 s against 125.7 s for the first design's 42 (119.9 s against 119.7 s at the second's); with
the 7.0 s before the first point and 17.3 s of kernel compilation of a cold cache that the first
measured, about 149 s of ``measure`` (it took 149.1 s; 159 s the whole command), within the
default ``--budget-s`` of 150.

The derived artifact (``derive``, in ``sim/costmodel/profiled/calibrated.py`` with
``with_host_speed`` and ``host_share``, which the simulator uses too) is the shipped one with those
numbers applied to its fields (so
every code path of the cost model, scalar, vectorised and multi-GPU, reads them), a new ``id``
and a ``calibration`` section: the base artifact's id and sha256, the parameters, the machine
(GPU, CPU model, driver, versions, date, commit), every measured point with its predictions and
the fit's residuals.

Host scales are per base model (``host_loop:<model>``, ``host_fused:<model>``; a model not
measured takes the geometric mean of the measured ones), and ``nano_host`` scales the host time of
one nano-batch (``formula.layer_ms``). Times are milliseconds unless a name ends in
``_s``. Nothing here needs torch or a GPU.

The host-speed probe (``sim/executor/probe.py``; ``profiler/data/validation/README.md``: the lent
H200 hosts' single-thread speed drifts 14% between 10-s windows). Every point's timed steps are
bracketed by probe readings and interleaved with more (``probe_due``: 3-5 per point); its
``probe_ms`` is their mean. When every point has one, the fit reads each point's
host terms at its own speed: ``ref_ms`` = the median of the points' ``probe_ms``, and point
*i*'s prediction is that of ``with_host_speed(derive(art, params), probe_ms_i / ref_ms)``, so the
fitted host scales are those of a host running the probe in ``ref_ms``. A run that records its
own probes (``execute``'s ``probes.csv``) then predicts with ``with_host_speed(cal, probe(t) /
ref_ms)``; without probes (replay, compare) the calibrated artifact is the reference speed's.
Points without ``probe_ms`` (earlier CSVs and artifacts) fit exactly as before the probe.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import platform
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
from tlora_sim.sim.costmodel.profiled.calibrated import HOST_BOUND_SHARE, HOST_STEP, IDENTITY, derive, with_host_speed
from tlora_sim.sim.costmodel.profiled.calibrated import host_share as share_of
from tlora_sim.traces.errors import InputError

#: base models calibrated by default (the families the shipped ``tlora`` LoRA distribution uses)
MODELS = ("llama3-8b", "qwen3-8b")
PARAMS = ("host_loop", "host_fused", "nano_host", "gpu_scale", "step_ms")
#: bounds of the fitted parameters (scales are multiplicative; step_ms in ms)
BOUNDS = {"host_loop": (0.25, 4.0), "host_fused": (0.25, 4.0), "host_loop_n": (0.25, 4.0), "host_fused_n": (0.25, 4.0), "nano_host": (0.1, 2.0), "gpu_scale": (0.5, 2.0),
          "step_ms": (0.0, 100.0)}
POINT_COLUMNS = ["model", "plan", "nano", "members", "adapters", "tokens", "role", "reps", "measured_ms",
                 "p10_ms", "p90_ms", "probe_ms"]
#: point columns that earlier points files may lack (filled with NaN: fitted without the probe)
OPTIONAL_COLUMNS = ("probe_ms",)
#: one probe measurement of a calibration (``calibration.probe.probes``): seconds since the
#: calibration started, the probe's ms, the pure-Python loop's ms, the point (row) it brackets
PROBE_COLUMNS = ["t_s", "probe_ms", "python_ms", "point"]

# The designed set, per model: (plan, nano, members as (rank, sequences, seq_len)), 512 to 8,192
# tokens per step (the executor keeps every layer's activations: on one H200 with both 8B bases
# resident, a 12,288-token step ran out of memory). Held out: every third point of each plan group
# (in this order), so each group has fit and held-out points. Second design (2026-12-02): the
# first one's 42 points had 9 alone per model, mostly GPU-bound (they agreed across calibrations
# to 2-3%), one host-bound loop point and one host-bound fused point; the host scales moved
# between two calibrations 15 minutes apart (loop 1.44 -> 1.19, fused 1.00 -> 0.65). This one
# drops seven configurations (alone 1,024 / 2,048 / 4,096 / 8,192 tokens, a 2-member 6,144-token
# loop, 3- and 6-member 8,192-token fused mixes) for eight host-bound ones of the shapes the
# validation workloads run (``profiler/data/validation/h200_2026-12-02/{A,B}/*/steps.csv``:
# mLoRA's 1- and 2-member loops of 512-2,048-token jobs, tLoRA's fused groups of 1-4 such jobs),
# keeping a GPU-bound point of every family (alone 4,096 and 8,192, loop 6,144, fused 5,632 and
# 8,192, nano-batched 8,192).
_DESIGN = (
    # alone: the host-bound floor (512-2,048 tokens) and the GPU-bound curve to 8,192
    ("alone", 1, ((8, 1, 512),)), ("alone", 1, ((4, 4, 2048),)), ("alone", 1, ((16, 1, 1024),)),
    ("alone", 1, ((8, 2, 1024),)), ("alone", 1, ((2, 4, 1024),)),
    # loop: 2-member loops of 512-2,048-token jobs, a 1-member loop, a small 4-member loop (all
    # host-bound or at the crossover), one GPU-bound 6,144-token loop
    ("loop", 1, ((8, 1, 512), (16, 1, 1024))), ("loop", 1, ((16, 1, 512),)),
    ("loop", 1, ((16, 1, 1024), (4, 2, 1024))),
    ("loop", 1, ((2, 1, 512), (4, 1, 512), (8, 2, 512), (16, 1, 1024))),
    ("loop", 1, ((4, 2, 1024), (8, 1, 2048), (16, 4, 512))),
    ("loop", 1, ((16, 2, 512), (4, 2, 512))),
    # fused: 1-4 small members of 512-2,048 tokens (host-bound to the crossover near 2,048-3,072
    # tokens), GPU-bound 5,632 and 8,192
    ("fused", 1, ((16, 1, 512),)), ("fused", 1, ((4, 1, 512), (8, 2, 1024))),
    ("fused", 1, ((2, 1, 512), (4, 2, 1024), (8, 1, 2048), (16, 2, 512))),
    ("fused", 1, ((8, 2, 2048), (16, 4, 1024))),
    ("fused", 1, ((2, 1, 512), (4, 1, 512), (8, 1, 512), (16, 1, 512))),
    ("fused", 1, ((16, 1, 512), (4, 1, 512))),
    ("fused", 1, ((16, 1, 1024), (4, 2, 512), (8, 1, 1024))),
    ("fused", 1, ((4, 2, 1024),)),
    # fused in 2 and 4 nano-batches
    ("fused", 2, ((4, 2, 1024), (8, 2, 512), (16, 1, 2048))),
    ("fused", 2, ((8, 2, 2048), (2, 4, 1024))),
    ("fused", 4, ((2, 4, 512), (4, 2, 1024), (16, 1, 2048))),
)


def design(models=MODELS) -> list[dict]:
    """The designed configurations: one dict per point (``model``, ``plan``, ``nano``,
    ``members``: tuple of (rank, sequences, seq_len), ``role``: ``fit`` or ``heldout``), in
    measurement order: round-robin over the plan groups (alone, loop, fused, nano-batched fused)
    and the models, so that a budget cut short leaves every plan and model some points."""
    groups: dict[str, list] = {}
    for plan, nano, members in _DESIGN:
        key = plan if nano == 1 else "nano"
        g = groups.setdefault(key, [])
        g.append({"plan": plan, "nano": nano, "members": members, "role": "heldout" if len(g) % 3 == 2 else "fit"})
    out = []
    for k in range(max(len(g) for g in groups.values())):
        for g in groups.values():
            if k < len(g):
                out.extend({"model": m, **g[k]} for m in models)
    return out


def members_str(members) -> str:
    """``r:b:s`` per member, ``,``-separated (the ``costmodel predict --members`` syntax)."""
    return ",".join(f"{r}:{b}:{s}" for r, b, s in members)


def parse_members(text: str) -> tuple:
    """Inverse of ``members_str``."""
    return tuple(tuple(int(x) for x in part.split(":")) for part in str(text).split(","))


# ----------------------------------------------------------------------------------- measuring protocol
#: every point's protocol (``sim/executor/calibration.py``'s ``measure`` runs it, ``point_wall_s``
#: costs it): WARMUP_STEPS untimed steps (the first carries the group's one-off costs), then timed
#: steps while ``more_reps``: until MIN_REPS of them and TIMED_S seconds of them, at most MAX_REPS
#: (16 since the second design: 1.5 s of steps down to 94-ms steps; it was 8, which gave the
#: host-bound points of 110-190 ms 0.9-1.5 s)
WARMUP_STEPS, MIN_REPS, MAX_REPS, TIMED_S = 2, 3, 16, 1.5
#: host-speed probe readings of a point: one before its timed steps, one after them, and one after
#: every second timed step that is not the last once PROBE_EVERY_S seconds of timed steps have
#: passed since the previous reading (after the second always; ``probe_due``): 3-5 readings per
#: point at any steady step time (4-5 for steps of 74-373 ms, the host-bound ones; 3 for slower
#: steps and for steps under 36 ms), against 2 (before and after) until the second design; the
#: host's speed drifts within seconds (steps of one job varied 85-157 ms)
PROBE_EVERY_S = 0.45
#: the wall cost of a point (s; ``point_wall_s``), least squares over the probe timestamps of the
#: two H200 calibrations of 2026-12-02 (``profiler/data/validation/h200_2026-12-02/
#: calibrated_h200{,_end}_points_probes.csv``, 42 points each): from one point's last reading to
#: the next one's first (release, group build, the warm-up steps, a reading) BUILD_S + WARMUP_X x
#: the step (0.27 s + 2.21 x and 0.22 s + 2.17 x, residual SD 0.10 / 0.11 s, without the first
#: calibration's three cold-kernel-cache compilations, 17.3 s together); a timed step STEP_GAP_S
#: beyond the ms it reports; a probe reading PROBE_S (0.028 / 0.023 s)
BUILD_S, WARMUP_X, STEP_GAP_S, PROBE_S = 0.245, 2.19, 0.0016, 0.026


def more_reps(reps: int, timed_s: float, max_reps: int = MAX_REPS) -> bool:
    """Whether a point times another step after ``reps`` timed steps that took ``timed_s`` seconds
    (probe readings not counted): fewer than ``MIN_REPS``, or fewer than ``TIMED_S`` seconds, and
    fewer than ``max_reps``."""
    return reps < max_reps and (reps < MIN_REPS or timed_s < TIMED_S)


def probe_due(k: int, since_s: float) -> bool:
    """Whether a probe reading follows the ``k``-th timed step (1-based; not the point's last)
    that ends ``since_s`` seconds of timed steps after the previous reading: ``k`` even and
    ``k == 2`` or ``since_s >= PROBE_EVERY_S``."""
    return k % 2 == 0 and (k == 2 or since_s >= PROBE_EVERY_S)


def point_wall_s(step_ms: float, max_reps: int = MAX_REPS, mid_readings: bool = True) -> dict:
    """The wall time one point of steady steps of ``step_ms`` ms costs ``measure`` on a warm kernel
    cache, by the protocol (``more_reps``, ``probe_due``) and the costs ``BUILD_S``, ``WARMUP_X``,
    ``STEP_GAP_S``, ``PROBE_S``: ``{"wall_s", "reps", "readings"}``. ``max_reps=8,
    mid_readings=False`` is the first design's protocol (it reproduces every ``reps`` of its two
    calibrations). Not counted: the calibration's start (CUDA, the first base model and its
    first steps: 3.9 s and 7.0 s before the first point's build in the two) and first-time kernel
    compilation on a cold cache (17.3 s in the first)."""
    s = float(step_ms) / 1e3
    reps, readings, last = 0, 1, 0.0
    while more_reps(reps, reps * (s + STEP_GAP_S), max_reps):
        reps += 1
        if mid_readings and more_reps(reps, reps * (s + STEP_GAP_S), max_reps) and probe_due(
                reps, (reps - last) * (s + STEP_GAP_S)):
            readings, last = readings + 1, reps
    readings += 1
    return {"wall_s": BUILD_S + WARMUP_X * s + reps * (s + STEP_GAP_S) + PROBE_S * (readings - 1), "reps": reps,
            "readings": readings}


# ----------------------------------------------------------------------------------- fitting
def probe_factors(pts: pd.DataFrame) -> tuple[float | None, np.ndarray]:
    """(``ref_ms``, per-row factor ``probe_ms / ref_ms``) of calibration points: ``ref_ms`` is the
    median of the rows' ``probe_ms``. Where any row lacks a finite, positive ``probe_ms`` (or the
    column is absent): (None, ones), the fit without the probe."""
    ones = np.ones(len(pts))
    if "probe_ms" not in pts.columns or not len(pts):
        return None, ones
    pr = pd.to_numeric(pts.probe_ms, errors="coerce").to_numpy(dtype=float)
    if not (np.isfinite(pr).all() and (pr > 0).all()):
        return None, ones
    ref = float(np.median(pr))
    return ref, pr / ref


def predict_at_speed(art: dict, pts: pd.DataFrame, factors) -> np.ndarray:
    """``predict_ms`` with row *i* at host speed ``factors[i]`` (``with_host_speed``; rows of one
    factor share one derived model; a factor of exactly 1 uses ``art`` itself)."""
    factors = np.asarray(factors, dtype=float)
    out = np.empty(len(pts))
    for f in np.unique(factors):
        rows = factors == f
        out[rows] = predict_ms(art if f == 1.0 else with_host_speed(art, f), pts[rows])
    return out


def predict_ms(art: dict, pts: pd.DataFrame, gpu: str | None = None) -> np.ndarray:
    """The step time (ms) ``art`` predicts for every row of ``pts`` (one GPU, the executor's
    no-checkpointing convention; memory does not enter step times)."""
    from tlora_sim.sim.costmodel.interface import Member
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    cm = ProfiledCostModel(art, checkpointing=False)
    gpu = gpu or art["gpu"]
    return np.array([1e3 * cm.step_time_s(m, gpu, tuple(Member(*x) for x in parse_members(mem)), 1, plan, int(nano))
                     for m, mem, plan, nano in zip(pts.model, pts.members, pts.plan, pts.nano)], dtype=float)


def fit(art: dict, pts: pd.DataFrame, split_host: bool = False) -> tuple[dict, dict]:
    """Fit ``PARAMS`` to the ``role == "fit"`` rows of ``pts`` (least squares on log(predicted /
    measured), bounded by ``BOUNDS``; scipy's ``least_squares``, trust-region reflective). Where
    every row of ``pts`` has a ``probe_ms`` (``probe_factors``), each row is predicted at its own
    host speed (``predict_at_speed``): the parameters are the reference speed's.

    ``split_host``: the "split host" form under evaluation (not the default; the second
    2026-12-02 validation's ``PLAN.md``): the per-adapter host term ``cpu_n`` of each family gets
    a scale of its own per model (``host_loop_n:<model>``, ``host_fused_n:<model>``, on top of
    ``host_loop:<model>`` / ``host_fused:<model>``), so the fit can tell a machine's per-adapter
    launch cost from its fixed one (jobs alone and loops share ``host_loop`` otherwise).

    Returns:
        (params, info): the fitted parameters and ``{"cost": ..., "nfev": ..., "status": ...}``.

    Raises:
        InputError: no fit points.
    """
    from scipy.optimize import least_squares

    fp = pts[pts.role == "fit"]
    if fp.empty:
        raise InputError("no calibration points to fit (budget too small?)", field="--budget-s")
    meas = fp.measured_ms.to_numpy(dtype=float)
    _, factors = probe_factors(pts)
    factors = factors[(pts.role == "fit").to_numpy()]  # all 1 without probes: predict_ms of the artifact itself
    free = []
    for m in sorted(set(fp.model)):
        d = fp[fp.model == m]
        if d.plan.isin(["alone", "loop"]).any():
            free.append(f"host_loop:{m}")
            if split_host and (d.plan == "loop").any():
                free.append(f"host_loop_n:{m}")
        if (~d.plan.isin(["alone", "loop"])).any():
            free.append(f"host_fused:{m}")
            if split_host and (d[~d.plan.isin(["alone", "loop"])].adapters > 1).any():
                free.append(f"host_fused_n:{m}")
    free += (["nano_host"] if (fp.nano > 1).any() else []) + ["gpu_scale", "step_ms"]

    def unpack(x):
        params = {k: v for k, v in IDENTITY.items() if not k.startswith("host_")}
        for name, v in zip(free, x):
            params[name] = float(math.exp(v)) if name != "step_ms" else float(v)
        return params

    def resid(x):
        return np.log(predict_at_speed(derive(art, unpack(x)), fp, factors) / meas)

    lo = [math.log(BOUNDS[p.split(":")[0]][0]) if p != "step_ms" else BOUNDS[p][0] for p in free]
    hi = [math.log(BOUNDS[p.split(":")[0]][1]) if p != "step_ms" else BOUNDS[p][1] for p in free]
    x0 = np.array([0.0 if p != "step_ms" else 1.0 for p in free])
    r = least_squares(resid, x0, bounds=(lo, hi), x_scale=[0.1 if p != "step_ms" else 5.0 for p in free],
                      diff_step=1e-2, max_nfev=400, loss="soft_l1", f_scale=0.05)
    return unpack(r.x), {"cost": float(r.cost), "nfev": int(r.nfev), "status": int(r.status), "free": free}


# ----------------------------------------------------------------------------------- provenance
def machine_info(device: str) -> dict:
    """GPU, CPU model, driver and software versions of this machine (what is known)."""
    info = {"python": platform.python_version(), "machine": platform.machine(), "cpu": _cpu_model(),
            "cpu_count": _cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu_name"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "none"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        info["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        info["driver"] = "unknown"
    from tlora_sim.profiler.provenance import git_commit

    info["git_commit"], info["git_dirty"] = git_commit()
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_count() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def host_share(art: dict, pts: pd.DataFrame) -> np.ndarray:
    """Per row of ``pts``, the share of its step time that follows the host under ``art``
    (``sim/costmodel/profiled/calibrated.py`` ``host_share``: the step at host speed 1 +
    ``HOST_STEP`` against 1). 0: GPU-bound; 1: the whole step is host terms. Rows with
    ``host_share >= HOST_BOUND_SHARE`` are the host-bound points of ``summarize``'s
    ``heldout_host_bound``."""
    return share_of(predict_ms(art, pts), predict_ms(with_host_speed(art, 1 + HOST_STEP), pts))


def summarize(pts: pd.DataFrame, col: str) -> dict:
    """Median / p90 / max of |``col`` / measured - 1| (and how many points) over all, fit and
    held-out rows, and, where ``pts`` has a ``host_share`` column (``host_share``), over the
    held-out rows split at ``HOST_BOUND_SHARE``: ``heldout_host_bound`` and ``heldout_gpu_bound``.
    (On the lent H200 hosts one host-bound point measured twice on one machine 15 minutes apart
    differed by a median 10.6%, GPU-bound ones by 0.5%: ``profiler/data/validation/README.md``,
    "How repeatable a point is".)"""
    out = {}
    roles = ("all", "fit", "heldout") + (("heldout_host_bound", "heldout_gpu_bound") if "host_share" in pts else ())
    for role in roles:
        if role == "all":
            d = pts
        elif role.startswith("heldout_"):
            hb = pts.host_share >= HOST_BOUND_SHARE
            d = pts[(pts.role == "heldout") & (hb if role == "heldout_host_bound" else ~hb)]
        else:
            d = pts[pts.role == role]
        e = (d[col] / d.measured_ms - 1).abs()
        out[role] = {"points": len(d), "median_ape": float(e.median()) if len(d) else float("nan"),
                     "p90_ape": float(e.quantile(0.9)) if len(d) else float("nan"),
                     "max_ape": float(e.max()) if len(d) else float("nan")}
    return out


def build(art: dict, pts: pd.DataFrame, machine: dict, measured_s: float | None = None,
          created: str | None = None, probes: pd.DataFrame | None = None,
          probe_what: str | None = None, split_host: bool = False) -> tuple[dict, pd.DataFrame]:
    """Fit ``pts`` over ``art`` and return (calibrated artifact, points with ``probe_factor``,
    ``shipped_ms``, ``calibrated_ms`` (at the point's own probe factor), ``calibrated_no_probe_ms``
    (factor 1) and their ``*_error`` columns). The artifact's ``id`` is ``<gpu>-cal-<date>-<8 hex>``
    (the hash of the base id, the parameters and ``ref_ms``); its ``calibration.probe`` is ``{"ref_ms",
    "points" (how many points had a probe), "probes" (every measurement: ``PROBE_COLUMNS``
    records of ``probes``), "what" (``probe_what``)}``, or None where the points have no probes.
    ``calibration.error`` summarises ``shipped``, ``calibrated`` and ``calibrated_no_probe``
    (``summarize``; the held-out points also split into host- and GPU-bound by ``host_share``
    under the calibrated artifact, a column of the points).
    ``split_host``: ``fit``'s."""
    params, info = fit(art, pts, split_host=split_host)
    cal = derive(art, params)
    pts = pts.copy()
    if "probe_ms" not in pts.columns:
        pts["probe_ms"] = np.nan
    ref_ms, factors = probe_factors(pts)
    pts["probe_factor"] = factors
    pts["shipped_ms"] = predict_ms(art, pts)
    pts["calibrated_ms"] = predict_at_speed(cal, pts, factors)
    pts["calibrated_no_probe_ms"] = predict_ms(cal, pts)
    pts["host_share"] = share_of(pts.calibrated_no_probe_ms, predict_ms(with_host_speed(cal, 1 + HOST_STEP), pts))
    for name in ("shipped", "calibrated", "calibrated_no_probe"):
        pts[f"{name}_error"] = pts[f"{name}_ms"] / pts.measured_ms - 1
    probe = None
    if ref_ms is not None:
        pr = pd.DataFrame(probes if probes is not None else [], columns=PROBE_COLUMNS)
        probe = {"ref_ms": ref_ms, "points": int(len(pts)),
                 "probes": json.loads(pr.to_json(orient="records", double_precision=6)),
                 "what": probe_what or "sim/executor/probe.py"}
    created = created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    key = art["id"] + json.dumps(params, sort_keys=True) + (f"|ref_ms {ref_ms!r}" if probe else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    cal.pop("_sha256", None)
    cal["id"] = f"{str(art['gpu']).lower()}-cal-{created[:10]}-{digest}"
    cal["created"] = created
    cal["calibration"] = {
        "base_artifact": art["id"], "base_sha256": art.get("_sha256"), "params": params, "fit": info,
        "form": "host terms x host_scale[family] (loop: alone, loop; fused: fused, lorafusion, grouped); "
                "GPU tables and terms x gpu_scale; optimizer const + step_ms"
                + ("; host scales at the probe's reference speed (ref_ms); on a host whose probe takes p ms: "
                   "host terms x p / ref_ms (with_host_speed)" if probe else ""),
        "machine": machine, "measured_s": measured_s, "probe": probe,
        "error": {name: summarize(pts, f"{name}_ms") for name in ("shipped", "calibrated", "calibrated_no_probe")},
        "points": json.loads(pts.to_json(orient="records", double_precision=6)),
        "tool": "tlora-sim costmodel calibrate (profiler/calibrate.py)"}
    return cal, pts


#: what each error line of ``error_table`` means
ERROR_MEANING = {"shipped": "the shipped artifact",
                 "calibrated": "the calibrated one at each point's own probe factor (validate-run with probes.csv)",
                 "calibrated_no_probe": "the calibrated one at factor 1, the reference speed (replay, compare)"}


def error_table(pts: pd.DataFrame) -> str:
    """The held-out points' shipped, calibrated (at their probe factor) and calibrated without
    the probe (factor 1) errors, then one summary line each (``build``'s points), with the
    held-out median of the host-bound and the GPU-bound points (``host_share``) and their counts."""
    h = pts[pts.role == "heldout"]
    cols = ["model", "plan", "nano", "members", "tokens", "host_share", "measured_ms", "probe_factor", "shipped_ms",
            "calibrated_ms", "calibrated_no_probe_ms", "shipped_error", "calibrated_error",
            "calibrated_no_probe_error"]
    lines = ["held-out points (measured, not fitted):",
             h[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}") if len(h) else "  (none)"]
    lines.append("errors: " + "; ".join(f"{k}: {v}" for k, v in ERROR_MEANING.items()))
    for name in ("shipped", "calibrated", "calibrated_no_probe"):
        s = summarize(pts, f"{name}_ms")
        lines.append(f"{name:19s} held-out median |error| {s['heldout']['median_ape']:.2%} p90 "
                     f"{s['heldout']['p90_ape']:.2%} max {s['heldout']['max_ape']:.2%} ({s['heldout']['points']} "
                     f"points); fit points median {s['fit']['median_ape']:.2%}"
                     + ("".join(f"; {lab} {s[k]['median_ape']:.2%} ({s[k]['points']})" for k, lab in (
                         ("heldout_host_bound", "host-bound"), ("heldout_gpu_bound", "GPU-bound")))
                        if "heldout_host_bound" in s else ""))
    return "\n".join(lines)


def write_artifact(cal: dict, path: Path) -> None:
    """Write ``cal`` to ``path`` (JSON) atomically: a temporary file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cal, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
