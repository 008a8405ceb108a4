#!/usr/bin/env python3
"""Issue 6's sweep target: a sweep of 100 cells on Ray gives the same rows as the local backend.

Builds a 100-cell sweep (5 small synthetic traces x 5 policies x 4 seeds on 2x8xH100), runs it
with the local backend (process pool) and with ``--backend ray`` on a local Ray started by
``ray.init(num_cpus=N)``, and compares the two ``sweep.csv`` files byte for byte and every cell's
``jobs.csv``. Writes ``bench/results/sweep_ray_100.json`` (times, cells, whether the rows match,
machine, commit).

    .venv/bin/python bench/sweep_ray.py                 # 100 cells, 2 workers / 2 Ray CPUs
    .venv/bin/python bench/sweep_ray.py --cpus 4 --out-dir /tmp/sweep

Exit status 1 if the backends disagree.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACES = [f"synthetic:jobs=40,seed={s},load=0.9" for s in range(1, 6)]
POLICIES = ["independent-backfill", "mlora", "tlora", "lorafusion", "lookahead"]  # the reference first
SEEDS = [0, 1, 2, 3]


def sweep_toml() -> str:
    """The 100-cell sweep (traces x policies x seeds on one cluster)."""
    q = ", ".join
    return (f"traces = [{q(json.dumps(t) for t in TRACES)}]\nclusters = [\"2x8xH100\"]\n"
            f"policies = [{q(json.dumps(p) for p in POLICIES)}]\nseeds = [{q(str(s) for s in SEEDS)}]\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=2, help="local workers and Ray CPUs (default 2)")
    ap.add_argument("--out-dir", type=Path, default=None, help="where the two sweeps go (default: a temp dir)")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "sweep_ray_100.json",
                    help="result file (JSON)")
    args = ap.parse_args(argv)

    import ray

    from tlora_sim.sim.experiments import sweep as sw

    base = args.out_dir or Path(tempfile.mkdtemp(prefix="sweep_ray_"))
    base.mkdir(parents=True, exist_ok=True)
    spec = base / "sweep.toml"
    spec.write_text(sweep_toml())
    sweep = sw.load_sweep(spec)
    n = len(sweep.cells)

    t0 = time.perf_counter()
    local = sw.run_sweep(sweep, base / "local", workers=args.cpus, progress=True)
    t_local = time.perf_counter() - t0
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        on_ray = sw.run_sweep(sweep, base / "ray", backend="ray", progress=True)
        t_ray = time.perf_counter() - t0
    finally:
        ray.shutdown()

    same_rows = (base / "local" / "sweep.csv").read_bytes() == (base / "ray" / "sweep.csv").read_bytes()
    same_jobs = all((sw.cell_dir(base / "local", c) / "jobs.csv").read_bytes()
                    == (sw.cell_dir(base / "ray", c) / "jobs.csv").read_bytes() for c in sweep.cells)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = {"cells": n, "local_ran": local.ran, "ray_ran": on_ray.ran, "failed": len(local.failed) + len(on_ray.failed),
           "local_s": round(t_local, 2), "ray_s": round(t_ray, 2), "cpus": args.cpus,
           "same_sweep_csv": same_rows, "same_jobs_csv_every_cell": same_jobs,
           "ray": ray.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": "python bench/sweep_ray.py" + (f" --cpus {args.cpus}" if args.cpus != 2 else "")}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if same_rows and same_jobs and not out["failed"] and n == 100 else 1


if __name__ == "__main__":
    sys.exit(main())
