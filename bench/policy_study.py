"""The policy comparison of issue 5: every seed policy, ours and their no-grouping ablations on
several ITP clusters and a synthetic LLM-cluster workload, relative to ``independent``.

Writes ``OUT/<workload>/`` comparison directories (``tlora-sim compare`` layout) and
``bench/results/policy_study.csv`` (one row per workload x policy, with ratios to
``independent``), and prints a Markdown table.

    python bench/policy_study.py --out runs/study            # all workloads
    python bench/policy_study.py --out runs/study --quick    # small smoke version
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
ITP = ROOT.parent / "shared" / "traces" / "msr-itp-elasticflow"
POLICIES = ["independent", "mlora", "mlora-nogroup", "tlora", "tlora-nogroup", "lorafusion", "lorafusion-nogroup",
            "alto", "alto-nogroup", "lookahead", "lookahead-nogroup"]
# name -> (trace spec, cluster, extra CLI args); cluster sizes hold ~60-80% of the mean GPU demand
# (GPU-hours over span: cluster02 86 GPUs, cluster05 10, cluster09 31) and the largest job.
WORKLOADS = {
    "itp02": (f"itp:{ITP}/cluster02.csv.gz", "16x8xH100", []),
    "itp05": (f"itp:{ITP}/cluster05.csv.gz", "2x8xH100", []),
    "itp09": (f"itp:{ITP}/cluster09.csv.gz", "5x8xH100", []),
    "llm-synthetic": ("synthetic:jobs=3000,seed=11,load=0.8,gpus=64,max_gpus=16", "8x8xH100",
                      ["--lora-dist", "llm-cluster", "--sweeps", "0.25:4,8"]),
}
QUICK = {"llm-synthetic-small": ("synthetic:jobs=150,seed=3,load=0.8,gpus=32,max_gpus=8", "4x8xH100",
                                 ["--lora-dist", "llm-cluster", "--sweeps", "0.25:4"])}
METRICS = {"throughput_tokens_per_s": "throughput", "avg_jct_s": "avg_jct", "p90_jct_s": "p90_jct",
           "gpu_alloc_util": "alloc_util", "gpu_compute_util": "compute_util"}


def relative(summary: pd.DataFrame, workload: str) -> pd.DataFrame:
    """The summary's metrics and their ratios to ``independent`` (``tlora_sim.sim.report.plots.relative_table``:
    throughput and utilizations as x, JCTs as speed-up, independent / policy), in summary order."""
    from tlora_sim.sim.report.plots import relative_table

    out = summary[["policy"] + list(METRICS)].copy()
    out.insert(0, "workload", workload)
    rel = relative_table(summary, "independent").set_index("policy")
    for col in ("throughput_x", "avg_jct_speedup", "p90_jct_speedup", "alloc_util_x", "compute_util_x"):
        out[col] = rel.loc[out["policy"], col].to_numpy()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the study; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "study")
    ap.add_argument("--quick", action="store_true", help="one small synthetic workload (CI smoke)")
    ap.add_argument("--workloads", help="comma-separated subset of: " + ", ".join(WORKLOADS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "policy_study.csv")
    args = ap.parse_args(argv)
    table = QUICK if args.quick else WORKLOADS
    names = args.workloads.split(",") if args.workloads else list(table)
    rows = []
    for name in names:
        spec, cluster, extra = table[name]
        out = args.out / name
        cmd = [sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--trace", spec, "--cluster", cluster, "--seed", "0",
               "--policies", args.policies, "--workers", str(args.workers), "--out", str(out), "--no-progress",
               *extra]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        rows.append(relative(pd.read_csv(out / "summary.csv"), name))
    result = pd.concat(rows, ignore_index=True)
    if not args.quick:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        result.to_csv(args.results, index=False)
    cols = ["workload", "policy", "throughput_x", "avg_jct_speedup", "p90_jct_speedup", "alloc_util_x",
            "compute_util_x"]
    print(result[cols].to_markdown(index=False, floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
