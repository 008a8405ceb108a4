"""How long a comparison's figures take against its replay (issue 41: at most 25% of the wall time).

Runs ``compare`` once with ``plots=False`` (the replay: every policy, the tables), then draws the
figures of the directory it wrote as ``compare`` does (``plot_compare`` in the parent process, the
formats of ``replay.COMPARE_FORMATS``: PNG), each timed with ``time.perf_counter``, and appends one row to ``bench/results/figures_<tag>.csv``: the trace,
cluster, policies, workers, ``replay_s``, ``figures_s`` and ``figures_share`` = figures_s /
(replay_s + figures_s), with the per-figure seconds (``fig_<name>_s``).

Default input: ITP cluster02 (``/work/shared/traces/msr-itp-elasticflow/cluster02.csv.gz``) on
16x8xH100 under the reference and the five seed systems, seed 0::

    python bench/figures.py                      # ITP cluster02, 2 workers
    python bench/figures.py --trace synthetic:default --cluster 4x8xH100 --policies independent-backfill,mlora,tlora
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ITP02 = "/work/shared/traces/msr-itp-elasticflow/cluster02.csv.gz"
POLICIES = "independent-backfill,lorafusion,mlora,alto,tlora"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=f"itp:{ITP02}")
    ap.add_argument("--cluster", default="16x8xH100")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default=f"{platform.machine()}-{__import__('os').cpu_count()}cpu")
    ap.add_argument("--results", type=Path, default=None, help="CSV to append to (default bench/results/figures_<tag>.csv)")
    args = ap.parse_args(argv)

    import pandas as pd

    from tlora_sim.sim.experiments.replay import COMPARE_FORMATS, ReplayConfig, compare
    from tlora_sim.sim.report import style as fs
    from tlora_sim.sim.report.plots import plot_compare

    if args.trace.startswith("itp:") and not Path(args.trace[4:]).is_file():
        print(f"skipped: {args.trace[4:]} is not here", file=sys.stderr)
        return 0
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-figures-") as tmp:
        out = Path(tmp) / "cmp"
        t0 = time.perf_counter()
        compare(ReplayConfig(trace=args.trace, policy=pols[0], cluster=args.cluster, seed=args.seed), pols, out,
                workers=args.workers, progress=False, check_invariants=False, plots=False)
        replay_s = time.perf_counter() - t0
        per: dict[str, float] = {}
        real_save = fs.save_figure

        def timed_save(fig, out_dir, name, formats=("png", "pdf"), **kw):
            t = time.perf_counter()
            try:
                return real_save(fig, out_dir, name, formats, **kw)
            finally:
                per[name] = per.get(name, 0.0) + time.perf_counter() - t

        fs.save_figure = timed_save
        try:
            t1 = time.perf_counter()
            files = plot_compare(out, formats=COMPARE_FORMATS)  # as compare draws them
            figures_s = time.perf_counter() - t1
        finally:
            fs.save_figure = real_save
        jobs = int(pd.read_csv(out / "summary.csv")["jobs"].max())
    row = {"trace": args.trace.replace(str(Path(ITP02).parent), "ITP"), "cluster": args.cluster,
           "policies": ",".join(pols), "workers": args.workers, "jobs": jobs, "replay_s": round(replay_s, 3),
           "figures_s": round(figures_s, 3), "figures_share": round(figures_s / (replay_s + figures_s), 4),
           "formats": ",".join(COMPARE_FORMATS), "files": len(files), **{f"fig_{k}_s": round(v, 3) for k, v in per.items()},
           "host": args.tag, "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = args.results or ROOT / "bench" / "results" / f"figures_{args.tag}.csv"
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(path, index=False)
    print(" ".join(f"{k}={v}" for k, v in row.items()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
