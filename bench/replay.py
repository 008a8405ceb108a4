#!/usr/bin/env python3
"""Replay benchmark: wall time, jobs/s, events/s, policy decision time and peak memory per
(case, policy), written to ``bench/results/replay_<tag>.csv`` with the machine and commit.

Each (case, policy) runs ``tlora_sim.sim.experiments.replay.replay`` (trace read, LoRA assignment, job building, engine,
metrics, run-directory files; no figures, no progress bar) in a fresh child process, so the peak
RSS (``resource.getrusage``) is that run's alone and nothing is cached between runs.

Columns (times in s unless named otherwise):

* ``wall_s``: the whole ``replay()`` call (what a user waits for, minus interpreter start-up);
  ``engine_s``: the engine alone (``perf.json``); ``cpu_s``: the child's user + system CPU time
  over the call (compare this one on a busy machine: other processes inflate wall time, not CPU time);
* ``jobs_per_s`` = jobs / wall_s; ``us_per_job`` = 1e6 x wall_s / jobs (the scaling column);
* ``events``, ``events_per_s`` = events / engine_s, ``decisions``, ``decision_ms`` per policy call,
  ``decision_share`` = decision time / engine_s;
* ``peak_rss_mb``: the child's peak resident memory (MiB, includes the ~100 MiB of imports;
  ``base_rss_mb`` is the peak before the replay started);
* ``status``: ``ok``, ``timeout after N s``, ``error: ...`` (then no timing is recorded: measured numbers
  only) or ``skipped: ...`` (case philly without its file; nothing ran, exit status unaffected);
* provenance: ``tag``, ``host``, ``cpu_model``, ``cpus``, ``python``, ``commit`` (HEAD),
  ``dirty`` (uncommitted changes under sim/, policies/, traces/), ``src_sha`` (SHA-256 prefix of
  every ``*.py`` under sim/, policies/, traces/ as the child imported them), ``date`` (UTC),
  ``invariants`` (whether ``tlora_sim.sim.core.invariants`` was checked; off by default, as ``replay()``
  recommends for benchmarks);
* ``out_sha``: SHA-256 prefix of the run's ``summary.json`` + ``jobs.csv`` + ``timeline.csv``: equal
  values mean identical results, so a speed-up can be checked to change nothing.

* ``cost_model``: the cost model the run used (``config.json``; ``--cost-model``, default
  ``ReplayConfig``'s, ``auto`` = the profiled model where ``profiler/data`` has one for the GPU).
* queue length (issue 20; read from the run directory after the timed call):
  ``queue_mean``: time-weighted mean of ``timeline.csv``'s ``queued_jobs`` (each row's value holds
  until the next row); ``queue_max``: its maximum; ``decision_ms_by_queue``: ``perf.json``'s
  ``decision_ms_by_queue`` as compact JSON, per queue-length decade (``"0"``, ``"1-9"``, ``"10-99"``,
  ...) ``{decisions, mean_queue, ms_per_call}`` (the queue length seen by each decision);
  ``decision_ms_q_flat`` = ms per call in the largest decade with >= 20 decisions / ms per call in
  decade ``"10-99"`` (issue 20's target: per-decision time flat within 2x from queue length 10 to
  10,000, i.e. <= 2); empty when ``"10-99"`` has fewer than 20 decisions or no larger decade has 20
  (the queue never got past 99: nothing to compare). These columns come last, after ``date``.
* ``decision_cpu_ms_q_flat`` (printed as ``q_cpu``): the same ratio from each decade's
  ``cpu_ms_per_call`` (CPU time of the engine's thread per decision, estimated since session 15
  from the ``cpu_timed`` decisions: the first 64 of each decade, then every 8th; in ``decision_ms_by_queue``
  too): on a shared machine other processes inflate the wall times of whole stretches of a run
  (so of some decades more than others), not its CPU times. Empty in rows from before it.
* ``decision_idle_ms_q_flat`` and ``placed_ms_q_flat`` (after it; printed as ``q_idle`` and
  ``q_place``): a decision costs a look at the queue plus work per job it places, and a decade's
  mean mixes the two in whatever proportion its decisions had (``mlora`` at load 0.7: idle
  decisions ~0.01 ms at every queue length, one decision at queue 100-999 placed 95 jobs in ~5 ms,
  so its ``q_cpu`` read 5x). The same ratio of the decades' ``idle_ms_per_call`` (decisions that
  placed no job; >= 20 of them in both decades) and of their ``ms_per_placed_job`` (>= 20 jobs
  placed in both): each flat within 2x means neither part grows with the queue. Wall times, which
  the engine takes of every decision: the sampled CPU times (``idle_cpu_ms_per_call``,
  ``cpu_ms_per_placed_job`` in ``decision_ms_by_queue``) leave too few placing decisions in some
  decades, so run these on a quiet machine.

Rows of the same (case, policy, cost_model) are replaced, others kept; a ``skipped`` row (nothing ran)
never replaces a row of its (case, policy) and is replaced by any; the file is rewritten after every
run.

Cases (``--cases``, comma-separated cases or groups; default: itp02, itp04, itp-all, synthetic-10k,
synthetic-100k). Uncontended cases, sized so that queues stay short and the run measures the
simulator:

=============== ============================================ ============ ===================================
case            trace                                        cluster      why this cluster
=============== ============================================ ============ ===================================
itp02           ITP cluster02 (5,778 jobs)                   16x8xH100    issue 2's reference replay
itp04           ITP cluster04 (15,802 jobs)                  96x8xH100    768 GPUs: mean demand 491 GPUs
                                                                          (64 %), p90 672 fits
itp-all         the ten ITP clusters merged (69,351 jobs)    216x8xH100   1,728 GPUs: mean demand 1,134
                                                                          (66 %), p90 1,485 fits
synthetic-10k   ``synthetic:jobs=10000,seed=1,gpus=128``     16x8xH100    offered load 0.7 of the cluster
synthetic-100k  same, 100,000 jobs                           16x8xH100    same load, 10x longer span
synthetic-1M    same, 1,000,000 jobs                         16x8xH100    same load, 100x longer span
=============== ============================================ ============ ===================================

The ITP clusters are sized to the same mean load as the issue-2 reference (cluster02's mean
concurrent demand, 86 GPUs, is 67 % of 16x8xH100), rounded to whole racks, so that the run measures
the simulator and not an ever-growing queue: on 64x8xH100 (512 GPUs) the merged trace (mean demand
1,134 GPUs if every job started on arrival) is overloaded 2.2x all through its 60 days. The synthetic
cases keep cluster and load fixed and grow the span with the job count, so ``us_per_job`` across them
is the simulator's scaling with trace length at constant concurrency.

Contended cases (issue 20; group ``--cases contended`` = all ten, not in the default list): clusters
where queues form, so that decision time is measured at long queues (``decision_ms_by_queue``,
``decision_ms_q_flat``) and the queue length is recorded (``queue_mean``, ``queue_max``):

=============== ============================================ ============ ===================================
case            trace                                        cluster      why this cluster
=============== ============================================ ============ ===================================
itp-all-sized   the ten ITP clusters merged (69,351 jobs)    142x8xH100   1,136 GPUs = the mean demand
                                                                          (1,134.3 GPUs, load 1.00): queues
                                                                          form at every busy spell
philly          ``philly:PATH`` (``--philly``), Microsoft    48x8xH100    384 GPUs, issue 20's contended
                Philly 2017 (not shipped, see below)                      Philly cluster
load-0.5 ...    ``synthetic:jobs=20000,seed=1,gpus=128,``    16x8xH100    offered load 0.5, 0.7, 0.9, 1.0,
load-2.0        ``load=L``                                                1.1, 1.2, 1.5, 2.0 of the 128
                                                                          GPUs: from short queues to
                                                                          thousands waiting (1.5 and 2.0
                                                                          reach the 1,000-10,000 decade
                                                                          that issue 20's flatness
                                                                          target names; up to 1.2 the
                                                                          longest queue is ~250)
=============== ============================================ ============ ===================================

itp-all-sized's mean demand, measured (``tlora_sim.traces.read_trace`` of the ITP directory): sum over
jobs of num_gpus x duration_s = 5,877,791,065 GPU-s over 5,181,880 s from the first arrival to the
last end if every job started on arrival = 1,134.3 GPUs (1,136.2 over the arrival span alone;
``tlora-sim traces describe`` reports the 1,632,720 GPU-hours and the 59.88-day arrival span);
time-weighted p50 1,141, p90 1,485, peak 2,859. The synthetic ``load`` is the offered GPU demand as a
fraction of ``gpus`` (``traces/synthetic.py``): arrival rate = load x 128 / E[num_gpus x duration_s].

Philly: the CSV is not in this repository. Get the public trace from the ``msr-fiddle/philly-traces``
GitHub repository and convert its ``cluster_job_log`` (JSON) into a CSV with columns ``timestamp``
(submission, US/Pacific ``YYYY-MM-DD HH:MM:SS``), ``duration`` (s), ``num_gpus`` and optionally
``cluster`` (the virtual cluster) and ``job_id`` (the ``philly`` reader, ``traces/philly.py``). Pass
it with ``--philly PATH`` or the environment variable ``TLORA_PHILLY``; without a file the case runs
nothing, prints why, and writes rows with status ``skipped: no Philly trace (--philly PATH or
TLORA_PHILLY)`` (not a failure: the exit status is unaffected).

``--quick``: one tiny synthetic case (300 jobs, 4x8xH100) for a CI smoke test, written to
``runs/bench/replay_quick.csv`` unless ``--out-dir`` is given.

Usage (from the repository root)::

    .venv/bin/python bench/replay.py                                   # default cases, every policy
    .venv/bin/python bench/replay.py --cases itp02 --policies tlora    # issue 2's record
    .venv/bin/python bench/replay.py --cases synthetic-1M --timeout 900
    .venv/bin/python bench/replay.py --cases itp-all --policies tlora --profile   # cProfile text
    .venv/bin/python bench/replay.py --cases contended --philly philly.csv       # issue 20's contended cases
    .venv/bin/python bench/replay.py --cases load-1.2 --policies independent     # one load, seconds
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITP_DIR = ROOT.parent / "shared" / "traces" / "msr-itp-elasticflow"
POLICIES = ("independent", "mlora", "lorafusion", "alto", "tlora", "lookahead")  # every policy but the ablations
SYN = "synthetic:jobs={n},seed=1,gpus=128,load=0.7"


@dataclass(frozen=True)
class Case:
    """A benchmark trace: spec (``{itp}`` = the ITP directory), cluster and a note."""

    trace: str
    cluster: str
    note: str


CASES: dict[str, Case] = {
    "itp02": Case("itp:{itp}/cluster02.csv.gz", "16x8xH100", "ITP cluster02, issue 2 reference"),
    "itp04": Case("itp:{itp}/cluster04.csv.gz", "96x8xH100", "ITP cluster04, mean load 64%"),
    "itp-all": Case("itp:{itp}", "216x8xH100", "ten ITP clusters merged, mean load 66%"),
    "synthetic-10k": Case(SYN.format(n=10_000), "16x8xH100", "ITP-fitted generator, load 0.7"),
    "synthetic-100k": Case(SYN.format(n=100_000), "16x8xH100", "ITP-fitted generator, load 0.7"),
    "synthetic-1M": Case(SYN.format(n=1_000_000), "16x8xH100", "ITP-fitted generator, load 0.7"),
}
#: issue 20's contended cases: queues form, so decision time is measured at long queues
SYN_LOAD = "synthetic:jobs=20000,seed=1,gpus=128,load={load}"
LOADS = ("0.5", "0.7", "0.9", "1.0", "1.1", "1.2", "1.5", "2.0")
CASES.update({
    "itp-all-sized": Case("itp:{itp}", "142x8xH100", "ten ITP clusters merged, cluster = mean demand (load 1.0)"),
    "philly": Case("philly:{philly}", "48x8xH100", "Microsoft Philly trace (--philly PATH), contended"),
    **{f"load-{x}": Case(SYN_LOAD.format(load=x), "16x8xH100", f"ITP-fitted generator, offered load {x}")
       for x in LOADS},
})
QUICK = {"quick": Case("synthetic:jobs=300,seed=1,gpus=32,load=0.7", "4x8xH100", "CI smoke test")}
DEFAULT_CASES = ("itp02", "itp04", "itp-all", "synthetic-10k", "synthetic-100k")
#: named groups of cases for ``--cases``
GROUPS: dict[str, tuple[str, ...]] = {"contended": ("itp-all-sized", "philly", *(f"load-{x}" for x in LOADS))}
#: environment variable naming the Philly CSV when ``--philly`` is not given
PHILLY_ENV = "TLORA_PHILLY"
PHILLY_SKIPPED = f"skipped: no Philly trace (--philly PATH or {PHILLY_ENV})"
#: decisions a queue-length decade needs to count in ``decision_ms_q_flat``
FLAT_MIN_DECISIONS = 20

COLUMNS = ["case", "policy", "cost_model", "jobs", "wall_s", "engine_s", "cpu_s", "jobs_per_s", "us_per_job", "events",
           "events_per_s", "decisions", "decision_ms", "decision_share", "peak_rss_mb", "base_rss_mb", "status",
           "trace", "cluster", "invariants", "tag", "host", "cpu_model", "cpus", "python", "commit", "dirty",
           "src_sha", "out_sha", "date", "queue_mean", "queue_max", "decision_ms_q_flat", "decision_ms_by_queue",
           "decision_cpu_ms_q_flat", "decision_idle_ms_q_flat", "placed_ms_q_flat"]


# ---- child: one replay ---------------------------------------------------------------------------
def src_sha() -> str:
    """The first 12 hex digits of the SHA-256 of the simulator's source (every ``.py`` under sim/,
    policies/, traces/, by path then bytes): the ``src_sha`` of a result row."""
    h = hashlib.sha256()
    for d in ("sim", "policies", "traces"):
        for p in sorted((ROOT / d).rglob("*.py")):
            h.update(p.relative_to(ROOT).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


#: summary.json keys left out of ``out_sha``: ``extrapolated_share`` counts the questions the policy
#: asked the cost model, not the simulated schedule (a scripted replay of the same decisions asks
#: fewer); the fairness figures (issue 44, ``sim/core/fairness.py``) are functions of ``jobs.csv`` and
#: ``timeline.csv``, which are hashed, so rows from before they existed keep comparable hashes; so is
#: ``host_bound_gpu_time_share`` (of ``jobs.csv`` and the cost model: ``sim/experiments/fidelity.py``).
NOT_HASHED = ("extrapolated_share", "tenants", "jain_slowdown", "jain_tenant_slowdown", "ftf_rho_mean",
              "ftf_rho_max", "ftf_share_rho_le_1", "host_bound_gpu_time_share")


def output_sha(run_dir: Path) -> str:
    """The ``out_sha`` column: SHA-256 prefix (12 hex digits) of a run directory's
    ``summary.json`` (without ``NOT_HASHED``) + ``jobs.csv`` + ``timeline.csv`` (equal values:
    identical results)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    for k in NOT_HASHED:
        summary.pop(k, None)
    head = json.dumps(summary, indent=2, sort_keys=True).encode() + b"\n"
    return hashlib.sha256(head + b"".join((run_dir / f).read_bytes()
                                          for f in ("jobs.csv", "timeline.csv"))).hexdigest()[:12]


def queue_stats(timeline_csv: Path) -> dict:
    """``queue_mean`` (time-weighted mean of ``queued_jobs``: each row's value holds until the next
    row's ``time_s``; the plain mean if the timeline spans no time) and ``queue_max`` of a run's
    ``timeline.csv``."""
    import numpy as np
    import pandas as pd

    tl = pd.read_csv(timeline_csv, usecols=["time_s", "queued_jobs"])
    if tl.empty:
        return {"queue_mean": 0.0, "queue_max": 0}
    t = tl["time_s"].to_numpy(dtype=np.float64)
    q = tl["queued_jobs"].to_numpy(dtype=np.float64)
    dt = np.diff(t)
    span = float(dt.sum())
    mean = float((q[:-1] * dt).sum() / span) if span > 0 else float(q.mean())
    return {"queue_mean": mean, "queue_max": int(q.max())}


def _decade_low(key: str) -> int:
    """Lower bound of a ``decision_ms_by_queue`` key (``"0"``, ``"1-9"``, ``"10-99"``, ...)."""
    return int(key.split("-")[0])


def decision_flatness(by_queue: dict, time: str = "ms_per_call", count: str = "decisions") -> float | None:
    """The ``decision_ms_q_flat`` column (``time="cpu_ms_per_call"``: ``decision_cpu_ms_q_flat``;
    ``"idle_ms_per_call"`` counted by ``"idle_decisions"``: ``decision_idle_ms_q_flat``;
    ``"ms_per_placed_job"`` counted by ``"placed_jobs"``: ``placed_ms_q_flat``): ms per
    decision in the largest queue-length decade with at least ``FLAT_MIN_DECISIONS`` of ``count``
    over ms per decision in decade ``"10-99"`` (issue 20: flat within 2x from queue length 10 to
    10,000). None (an empty cell) when ``"10-99"`` has fewer, when no larger decade has enough
    (queues never got past 99: nothing to compare), or when the reference time is 0 or missing
    (``perf.json`` files from before the CPU times or the idle/placed split)."""
    ref = by_queue.get("10-99")
    if not ref or ref.get(count, 0) < FLAT_MIN_DECISIONS or not ref.get(time):
        return None
    big = [k for k, v in by_queue.items() if _decade_low(k) > 10 and v.get(count, 0) >= FLAT_MIN_DECISIONS]
    if not big or time not in by_queue[max(big, key=_decade_low)]:
        return None
    return by_queue[max(big, key=_decade_low)][time] / ref[time]


def compact_by_queue(by_queue: dict) -> str:
    """``decision_ms_by_queue`` as compact JSON (4 significant digits for the times and means)."""
    out = {k: {"decisions": int(v.get("decisions", 0)), "mean_queue": float(f"{v.get('mean_queue', 0.0):.4g}"),
               "ms_per_call": float(f"{v.get('ms_per_call', 0.0):.4g}"),
               **({"cpu_ms_per_call": float(f"{v['cpu_ms_per_call']:.4g}")} if "cpu_ms_per_call" in v else {}),
               **({"cpu_timed": int(v["cpu_timed"])} if "cpu_timed" in v else {}),
               **{k: int(v[k]) for k in ("idle_decisions", "placed_jobs") if k in v},
               **{k: float(f"{v[k]:.4g}") for k in ("idle_ms_per_call", "ms_per_placed_job", "idle_cpu_ms_per_call",
                                                    "cpu_ms_per_placed_job") if k in v}}
           for k, v in by_queue.items()}
    return json.dumps(out, separators=(",", ":"))


def _child(spec: dict) -> dict:
    """Run one replay in this process; returns the measurements."""
    import resource

    src = src_sha()
    from tlora_sim.sim.experiments.replay import ReplayConfig, replay

    kw = {"cost_model": spec["cost_model"]} if spec.get("cost_model") else {}
    cfg = ReplayConfig(trace=spec["trace"], policy=spec["policy"], cluster=spec["cluster"], seed=0, **kw)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory(prefix="tlora-bench-") as tmp:
        prof = None
        if spec.get("profile"):
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        replay(cfg, tmp, progress=False, plots=False, check_invariants=spec["invariants"])
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if prof is not None:
            prof.disable()
            _write_profile(prof, Path(spec["profile"]))
        perf = json.loads((Path(tmp) / "perf.json").read_text())
        cm = json.loads((Path(tmp) / "config.json").read_text()).get("cost_model", {})
        out_sha = output_sha(Path(tmp))
        queue = queue_stats(Path(tmp) / "timeline.csv")
    by_queue = perf.get("decision_ms_by_queue") or {}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"jobs": perf["jobs"], "wall_s": wall, "engine_s": perf["wall_s"], "cpu_s": cpu,
            "events": perf["events"], "decisions": perf["decisions"], "decision_ms": perf["decision_ms_per_call"],
            "peak_rss_mb": peak, "base_rss_mb": base_rss, "src_sha": src, "out_sha": out_sha,
            "cost_model": cm.get("name", "?") if isinstance(cm, dict) else str(cm), **queue,
            "decision_ms_q_flat": decision_flatness(by_queue), "decision_ms_by_queue": compact_by_queue(by_queue),
            "decision_cpu_ms_q_flat": decision_flatness(by_queue, "cpu_ms_per_call"),
            "decision_idle_ms_q_flat": decision_flatness(by_queue, "idle_ms_per_call", "idle_decisions"),
            "placed_ms_q_flat": decision_flatness(by_queue, "ms_per_placed_job", "placed_jobs")}


def _write_profile(prof, path: Path) -> None:
    import io
    import pstats

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(40)
    path.write_text(buf.getvalue().replace(str(ROOT) + "/", ""))


# ---- parent --------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": platform.node(), "cpu_model": cpu, "cpus": n, "python": platform.python_version(),
            "commit": _git("rev-parse", "--short=12", "HEAD") or "unknown",
            "dirty": bool(_git("status", "--porcelain", "--", "sim", "policies", "traces"))}


def run_child(script: Path, spec: dict, timeout: float) -> dict:
    """Run ``script --_child SPEC`` (spec as JSON) in a fresh interpreter and return the JSON
    object on the last line of its output.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout`` s (it is killed).
        RuntimeError: it exited non-zero; the message is the last line of its stderr (200 chars).
    """
    proc = subprocess.run([sys.executable, str(Path(script).resolve()), "--_child", json.dumps(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(tail[0][:200])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def philly_path(arg: Path | None) -> Path | None:
    """The Philly CSV: ``--philly`` if given, else ``$TLORA_PHILLY``; None when neither names a file."""
    raw = arg if arg is not None else os.environ.get(PHILLY_ENV) or None
    return Path(raw).resolve() if raw is not None and Path(raw).is_file() else None  # the child runs in ROOT


def run_one(case: str, c: Case, policy: str, *, itp_dir: Path, invariants: bool, timeout: float,
            profile: Path | None, cost_model: str | None = None, philly: Path | None = None) -> dict:
    """Run one (case, policy) in a child process; returns its result row (without provenance).

    A case on the Philly trace (``{philly}`` in its spec) without a ``philly`` file runs nothing:
    its row has status ``PHILLY_SKIPPED``."""
    row = {"case": case, "policy": policy, "cluster": c.cluster, "invariants": invariants,
           "cost_model": cost_model or "default",
           "trace": c.trace.replace("{itp}", "ITP").replace("{philly}", philly.name if philly else "PHILLY")}
    if "{philly}" in c.trace and philly is None:
        return {**row, "status": PHILLY_SKIPPED}
    trace = c.trace.format(itp=itp_dir, philly=philly)
    spec = {"trace": trace, "cluster": c.cluster, "policy": policy, "invariants": invariants,
            "profile": str(profile) if profile else None, "cost_model": cost_model}
    try:
        res = run_child(Path(__file__), spec, timeout)
    except subprocess.TimeoutExpired:
        return {**row, "status": f"timeout after {timeout:g} s"}
    except RuntimeError as e:
        return {**row, "status": f"error: {e}"}
    jobs, wall, eng = res["jobs"], res["wall_s"], res["engine_s"]
    return {**row, **res, "status": "ok", "jobs_per_s": jobs / wall if wall > 0 else 0.0,
            "us_per_job": 1e6 * wall / jobs if jobs else 0.0,
            "events_per_s": res["events"] / eng if eng > 0 else 0.0,
            "decision_share": res["decisions"] * res["decision_ms"] / 1e3 / eng if eng > 0 else 0.0}


def save(path: Path, rows: list[dict], order: list[str], columns: list[str] = COLUMNS) -> None:
    """Merge ``rows`` into the CSV at ``path`` (same case + policy + cost model replaced), rewrite it atomically.

    ``columns``: the file's leading columns (``bench/engine_floor.py`` passes its own)."""
    import pandas as pd

    from tlora_sim.sim.report.rundir import write_csv

    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=columns)
    if "cost_model" not in old.columns:  # files written before the column existed
        old["cost_model"] = "?"
    new = pd.DataFrame(rows, columns=columns)
    # a skipped row (nothing ran) neither replaces nor joins rows of its case + policy already in
    # the file; any row of a case + policy replaces that case + policy's skipped rows
    pairs = set(zip(old["case"], old["policy"]))
    new = new[[not (str(st).startswith("skipped") and k in pairs)
               for st, k in zip(new["status"], zip(new["case"], new["policy"]))]]
    keys = set(zip(new["case"], new["policy"], new["cost_model"]))
    newpairs = set(zip(new["case"], new["policy"]))
    old = old[[k not in keys and not (str(st).startswith("skipped") and k[:2] in newpairs)
               for k, st in zip(zip(old["case"], old["policy"], old["cost_model"]),
                                old["status"] if "status" in old.columns else [""] * len(old))]]
    df = pd.concat([x for x in (old, new) if len(x)], ignore_index=True)
    rank = {c: i for i, c in enumerate(order)}
    prank = {p: i for i, p in enumerate(POLICIES)}
    df = df.iloc[sorted(range(len(df)), key=lambda i: (rank.get(df["case"].iat[i], len(rank)), df["case"].iat[i],
                                                       prank.get(df["policy"].iat[i], 99), df["policy"].iat[i],
                                                       str(df["cost_model"].iat[i])))]
    extra = [c for c in df.columns if c not in columns]
    write_csv(path, df[columns + extra])


def _fmt(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r['case']:>15} {r['policy']:>12}  {r.get('status')}"
    return (f"{r['case']:>15} {r['policy']:>12} {str(r.get('cost_model'))[:9]:>9} {r['jobs']:>8} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} "
            f"{r['jobs_per_s']:9.0f} {r['us_per_job']:8.0f} {r['events_per_s']:9.0f} {r['decision_ms']:8.3f} "
            f"{r['peak_rss_mb']:7.0f} {r.get('queue_mean', 0):8.1f} {r.get('queue_max', 0):7d} "
            f"{_opt(r.get('decision_ms_q_flat')):>6} {_opt(r.get('decision_cpu_ms_q_flat')):>6} "
            f"{_opt(r.get('decision_idle_ms_q_flat')):>6} {_opt(r.get('placed_ms_q_flat')):>7}")


def _opt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def plan_runs(ap: argparse.ArgumentParser, args: argparse.Namespace, stem: str,
              default_cases: tuple[str, ...]) -> tuple[dict, list[str], list[str], dict, str, Path]:
    """The runs a benchmark command asked for: (case table, case names, policies, machine
    provenance, results tag, results path ``OUT_DIR/<stem>_<tag>.csv``) from the options
    ``--cases``, ``--policies``, ``--quick``, ``--tag``, ``--out-dir`` and ``--itp-dir``. Exits
    through ``ap.error`` on an unknown case or a missing ITP directory."""
    table = QUICK if args.quick else CASES
    names = list(QUICK) if args.quick and not args.cases else (args.cases.split(",") if args.cases else list(default_cases))
    names = [n.strip() for n in names if n.strip()]
    groups = {} if args.quick else GROUPS
    names = list(dict.fromkeys(m for n in names for m in groups.get(n, (n,))))  # groups expanded, each case once
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(table)}"
                 + (f"; groups: {', '.join(groups)}" if groups else ""))
    if not hasattr(args, "philly") and any("{philly}" in table[n].trace for n in names):
        ap.error("case philly needs a --philly option, which this command does not have (leave it out of --cases)")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if any(table[n].trace.startswith("itp:") for n in names) and not args.itp_dir.is_dir():
        ap.error(f"ITP traces not found at {args.itp_dir} (--itp-dir)")
    machine = _machine()
    tag = args.tag or ("quick" if args.quick else f"{platform.machine()}-{machine['cpus']}cpu")
    out_dir = args.out_dir or (ROOT / "runs" / "bench" if args.quick else ROOT / "bench" / "results")
    return table, names, policies, machine, tag, out_dir / f"{stem}_{tag}.csv"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 if any run failed or timed out)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(f"{k} ({v.note}, {v.cluster})" for k, v in CASES.items())
                                 + "; groups: " + ", ".join(f"{k} = {','.join(v)}" for k, v in GROUPS.items()))
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated cases or groups (default: {','.join(DEFAULT_CASES)}; all: {','.join(CASES)}; "
                         f"groups: {', '.join(GROUPS)})")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="one tiny synthetic case (CI smoke test)")
    ap.add_argument("--tag", default=None, help="results file suffix (default: ARCH-Ncpu, or 'quick')")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="results directory (default: bench/results, or runs/bench with --quick)")
    ap.add_argument("--itp-dir", type=Path, default=ITP_DIR, help="directory of the ITP clusterNN.csv.gz files")
    ap.add_argument("--philly", type=Path, default=None, metavar="PATH",
                    help=f"the Philly job CSV for case philly (default: ${PHILLY_ENV}; without a file the case "
                         "is skipped, not failed)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="limit per run, s (default: %(default)s)")
    ap.add_argument("--cost-model", default=None, metavar="NAME",
                    help="ReplayConfig.cost_model (auto, profiled, roofline); default: ReplayConfig's default "
                         "(auto: the profiled model where profiler/data has one for the GPU); the column "
                         "cost_model records the model actually used")
    ap.add_argument("--check-invariants", action="store_true", help="check sim.invariants while simulating")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile each run into OUT_DIR/profiles/ (timings not recorded: profiling slows runs)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(_child(json.loads(args._child))))
        return 0
    sys.path.insert(0, str(ROOT))

    table, names, policies, machine, tag, path = plan_runs(ap, args, "replay", DEFAULT_CASES)
    print(f"{'case':>15} {'policy':>12} {'cost_mod':>9} {'jobs':>8} {'wall_s':>8} {'cpu_s':>8} {'jobs/s':>9} {'us/job':>8} "
          f"{'events/s':>9} {'dec_ms':>8} {'peak_MB':>7} {'q_mean':>8} {'q_max':>7} {'q_flat':>6} {'q_cpu':>6} "
          f"{'q_idle':>6} {'q_place':>7}", flush=True)
    philly = philly_path(args.philly)
    failed = 0
    for name in names:
        if "{philly}" in table[name].trace and philly is None:
            given = args.philly if args.philly is not None else os.environ.get(PHILLY_ENV) or None
            why = f"{given} is not a file" if given else f"neither --philly nor ${PHILLY_ENV} is set"
            print(f"case {name}: skipped, {why}; the Philly CSV is not shipped (see bench/README.md)", flush=True)
        for pol in policies:
            prof = path.parent / "profiles" / f"{tag}_{name}_{pol}.txt" if args.profile else None
            row = run_one(name, table[name], pol, itp_dir=args.itp_dir, invariants=args.check_invariants,
                          timeout=args.timeout, profile=prof, cost_model=args.cost_model, philly=philly)
            row.update(tag=tag, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       **machine)
            print(_fmt(row) + (f"   profile -> {prof}" if prof else ""), flush=True)
            failed += row["status"] != "ok" and not row["status"].startswith("skipped")
            if not args.profile:
                save(path, [row], list(table))
    if not args.profile:
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
