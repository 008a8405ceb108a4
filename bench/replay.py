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
* ``status``: ``ok`` or ``timeout after N s`` (then no timing is recorded: measured numbers only);
* provenance: ``tag``, ``host``, ``cpu_model``, ``cpus``, ``python``, ``commit`` (HEAD),
  ``dirty`` (uncommitted changes under sim/, policies/, traces/), ``src_sha`` (SHA-256 prefix of
  every ``*.py`` under sim/, policies/, traces/ as the child imported them), ``date`` (UTC),
  ``invariants`` (whether ``tlora_sim.sim.core.invariants`` was checked; off by default, as ``replay()``
  recommends for benchmarks);
* ``out_sha``: SHA-256 prefix of the run's ``summary.json`` + ``jobs.csv`` + ``timeline.csv``: equal
  values mean identical results, so a speed-up can be checked to change nothing.

* ``cost_model``: the cost model the run used (``config.json``; ``--cost-model``, default
  ``ReplayConfig``'s, ``auto`` = the profiled model where ``profiler/data`` has one for the GPU).

Rows of the same (case, policy, cost_model) are replaced, others kept; the file is rewritten after
every run.

Cases (``--cases``, comma-separated; default: every case but synthetic-1M):

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

``--quick``: one tiny synthetic case (300 jobs, 4x8xH100) for a CI smoke test, written to
``runs/bench/replay_quick.csv`` unless ``--out-dir`` is given.

Usage (from the repository root)::

    .venv/bin/python bench/replay.py                                   # default cases, every policy
    .venv/bin/python bench/replay.py --cases itp02 --policies tlora    # issue 2's record
    .venv/bin/python bench/replay.py --cases synthetic-1M --timeout 900
    .venv/bin/python bench/replay.py --cases itp-all --policies tlora --profile   # cProfile text
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
QUICK = {"quick": Case("synthetic:jobs=300,seed=1,gpus=32,load=0.7", "4x8xH100", "CI smoke test")}
DEFAULT_CASES = ("itp02", "itp04", "itp-all", "synthetic-10k", "synthetic-100k")

COLUMNS = ["case", "policy", "cost_model", "jobs", "wall_s", "engine_s", "cpu_s", "jobs_per_s", "us_per_job", "events",
           "events_per_s", "decisions", "decision_ms", "decision_share", "peak_rss_mb", "base_rss_mb", "status",
           "trace", "cluster", "invariants", "tag", "host", "cpu_model", "cpus", "python", "commit", "dirty",
           "src_sha", "out_sha", "date"]


# ---- child: one replay ---------------------------------------------------------------------------
def _src_sha() -> str:
    h = hashlib.sha256()
    for d in ("sim", "policies", "traces"):
        for p in sorted((ROOT / d).rglob("*.py")):
            h.update(p.relative_to(ROOT).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


#: summary.json keys left out of ``out_sha``: they count the questions the policy asked the cost
#: model, not the simulated schedule (a scripted replay of the same decisions asks fewer).
NOT_HASHED = ("extrapolated_share",)


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


def _child(spec: dict) -> dict:
    """Run one replay in this process; returns the measurements."""
    import resource

    src = _src_sha()
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
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"jobs": perf["jobs"], "wall_s": wall, "engine_s": perf["wall_s"], "cpu_s": cpu,
            "events": perf["events"], "decisions": perf["decisions"], "decision_ms": perf["decision_ms_per_call"],
            "peak_rss_mb": peak, "base_rss_mb": base_rss, "src_sha": src, "out_sha": out_sha,
            "cost_model": cm.get("name", "?") if isinstance(cm, dict) else str(cm)}


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


def run_one(case: str, c: Case, policy: str, *, itp_dir: Path, invariants: bool, timeout: float,
            profile: Path | None, cost_model: str | None = None) -> dict:
    """Run one (case, policy) in a child process; returns its result row (without provenance)."""
    trace = c.trace.format(itp=itp_dir)
    spec = {"trace": trace, "cluster": c.cluster, "policy": policy, "invariants": invariants,
            "profile": str(profile) if profile else None, "cost_model": cost_model}
    row = {"case": case, "policy": policy, "trace": c.trace.replace("{itp}", "ITP"), "cluster": c.cluster,
           "invariants": invariants, "cost_model": cost_model or "default"}
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
    keys = set(zip(new["case"], new["policy"], new["cost_model"]))
    old = old[[k not in keys for k in zip(old["case"], old["policy"], old["cost_model"])]]
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
            f"{r['peak_rss_mb']:7.0f}")


def plan_runs(ap: argparse.ArgumentParser, args: argparse.Namespace, stem: str,
              default_cases: tuple[str, ...]) -> tuple[dict, list[str], list[str], dict, str, Path]:
    """The runs a benchmark command asked for: (case table, case names, policies, machine
    provenance, results tag, results path ``OUT_DIR/<stem>_<tag>.csv``) from the options
    ``--cases``, ``--policies``, ``--quick``, ``--tag``, ``--out-dir`` and ``--itp-dir``. Exits
    through ``ap.error`` on an unknown case or a missing ITP directory."""
    table = QUICK if args.quick else CASES
    names = list(QUICK) if args.quick and not args.cases else (args.cases.split(",") if args.cases else list(default_cases))
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(table)}")
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
                                 epilog="cases: " + ", ".join(f"{k} ({v.note}, {v.cluster})" for k, v in CASES.items()))
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated cases (default: {','.join(DEFAULT_CASES)}; all: {','.join(CASES)})")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="one tiny synthetic case (CI smoke test)")
    ap.add_argument("--tag", default=None, help="results file suffix (default: ARCH-Ncpu, or 'quick')")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="results directory (default: bench/results, or runs/bench with --quick)")
    ap.add_argument("--itp-dir", type=Path, default=ITP_DIR, help="directory of the ITP clusterNN.csv.gz files")
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
          f"{'events/s':>9} {'dec_ms':>8} {'peak_MB':>7}", flush=True)
    failed = 0
    for name in names:
        for pol in policies:
            prof = path.parent / "profiles" / f"{tag}_{name}_{pol}.txt" if args.profile else None
            row = run_one(name, table[name], pol, itp_dir=args.itp_dir, invariants=args.check_invariants,
                          timeout=args.timeout, profile=prof, cost_model=args.cost_model)
            row.update(tag=tag, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       **machine)
            print(_fmt(row) + (f"   profile -> {prof}" if prof else ""), flush=True)
            failed += row["status"] != "ok"
            if not args.profile:
                save(path, [row], list(table))
    if not args.profile:
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
