"""The policy study: every seed system, ours, the two alone baselines and the grouping policies'
no-grouping ablations, against the reference baseline ``independent-backfill``, over several seeds
with 95% confidence intervals, with the decomposition ladder (issue 40).

Every policy runs its defaults: its own priority order with EASY backfilling (no policy's
default is strict head-of-line), its own plans, tLoRA's promise against the fused kernel. The
``default`` discipline is that; ``shared`` (``--disciplines default,shared``) sets FIFO order for
every policy (``--option NAME.order=fifo``; EASY stays), the rule of ``compare --discipline
shared``. Ratios are per seed against ``independent-backfill`` of the same seed, then averaged
with their CI; ``vs_tlora`` is tLoRA's average JCT over the policy's, per seed. For ``tlora`` and
``lookahead`` each row also carries its ladder step (``eager-alone`` independent-backfill ->
``fused-alone`` independent-fused -> ``+order`` P-nogroup -> ``+grouping`` P) and the per-seed
speed-up over the previous step (``step_speedup``). Throughput is reported beside JCT
(``throughput_x``): where the baseline's queue explodes a JCT ratio says less than it.

    python bench/policy_study.py --out runs/study --seeds 0-4          # the README's table
    python bench/policy_study.py --out runs/study --quick               # small smoke version

Writes ``bench/results/policy_study.csv`` (one row per workload x discipline x policy) and its
per-seed table ``bench/results/policy_study_by_seed.csv`` (one row per workload x policy x seed),
each row with the ``commit`` its runs came from. ``--merge`` re-runs only some policies: their
per-seed rows replace the stored ones of the same (workload, policy, seed), the other rows are kept
(each with its own commit), and the ratio table is recomputed from the merged per-seed table; the
stored rows of the baseline ``compare`` always re-runs must equal the new ones, else it stops
(the kept rows would come from other code).

    python bench/policy_study.py --policies tlora-nogroup,tlora --merge --seeds 0-4   # one policy's rows
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ITP = ROOT.parent / "shared" / "traces" / "msr-itp-elasticflow"
BASELINE = "independent-backfill"
FUSED = "independent-fused"
LADDERS = ["tlora", "lookahead"]
POLICIES = [BASELINE, FUSED, "mlora", "lorafusion", "alto"] + [p for g in LADDERS for p in (f"{g}-nogroup", g)]
# name -> (trace spec, cluster, extra CLI args); cluster sizes hold ~60-80% of the mean GPU demand
ITP_CLUSTERS = {"itp02": ("cluster02.csv.gz", "16x8xH100"), "itp05": ("cluster05.csv.gz", "2x8xH100"),
                "itp09": ("cluster09.csv.gz", "5x8xH100")}
WORKLOADS = {
    **{name: (f"itp:{ITP}/{f}", cluster, []) for name, (f, cluster) in ITP_CLUSTERS.items()},
    "llm-synthetic": ("synthetic:jobs=3000,load=0.8,gpus=64,max_gpus=16", "8x8xH100",
                      ["--lora-dist", "llm-cluster", "--sweeps", "0.25:4,8"]),
    "load-2.0": ("synthetic:jobs=2000,load=2.0,gpus=64,max_gpus=16", "8x8xH100", ["--lora-dist", "llm-cluster"]),
    "light-0.3": ("synthetic:jobs=1000,load=0.3,gpus=64,max_gpus=16", "8x8xH100", ["--lora-dist", "llm-cluster"]),
}
QUICK = {"llm-synthetic-small": ("synthetic:jobs=150,load=0.8,gpus=32,max_gpus=8", "4x8xH100",
                                 ["--lora-dist", "llm-cluster", "--sweeps", "0.25:4"])}
STEPS = {BASELINE: "eager-alone", FUSED: "fused-alone"}


def run(name: str, spec: str, cluster: str, extra: list[str], discipline: str, seeds: str, out: Path,
        workers: int, policies: list[str] = POLICIES) -> pd.DataFrame:
    """One ``compare --seeds`` of ``policies``; returns its per-seed table."""
    opts = []
    if discipline == "shared":
        for p in policies:
            if p not in (BASELINE, FUSED):
                opts += ["--option", f"{p}.order=fifo"]
    cmd = [sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--trace", spec, "--cluster", cluster,
           "--policies", ",".join(policies), "--seeds", seeds, "--workers", str(workers), "--out", str(out),
           "--no-progress", "--no-invariants", "--force", *opts, *extra]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return pd.read_csv(out / "summary_by_seed.csv").assign(workload=name, discipline=discipline)


BY_SEED = ["workload", "policy", "seed", "jobs", "avg_jct_s", "p90_jct_s", "avg_queue_s", "makespan_s",
           "throughput_tokens_per_s", "gpu_alloc_util", "colocated_jobs", "over_max_slowdown",
           "over_max_slowdown_share", "commit"]
"""Columns of ``policy_study_by_seed.csv``."""
KEY = ["workload", "policy", "seed"]


def head_commit() -> str:
    """The short hash of HEAD (the code the runs came from), or ``unknown`` outside a git checkout."""
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return got.stdout.strip() if got.returncode == 0 else "unknown"


def merge(stored: pd.DataFrame, new: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """``stored`` per-seed rows with those of ``policies`` in ``new`` replacing the same (workload,
    policy, seed); new rows of other policies are only checked: where stored too they must have the
    same average JCT (the stored rows still hold for this code).

    Raises:
        SystemExit: a re-run policy outside ``policies`` whose average JCT differs from the stored one.
    """
    check = new[~new.policy.isin(policies)].merge(stored, on=KEY, suffixes=("", "_stored"))
    bad = check[check.avg_jct_s != check.avg_jct_s_stored]
    if len(bad):
        raise SystemExit(f"stored rows differ from this code's: {bad[KEY + ['avg_jct_s', 'avg_jct_s_stored']]}")
    mine = {k: r for k, r in zip(map(tuple, new[KEY].to_numpy().tolist()), new[BY_SEED].to_dict("records"))
            if k[1] in policies}
    rows = [mine.pop(k, r) for k, r in zip(map(tuple, stored[KEY].to_numpy().tolist()),
                                           stored[BY_SEED].to_dict("records"))]  # replaced in place
    return pd.DataFrame(rows + list(mine.values()), columns=BY_SEED)


def ratios(by_seed: pd.DataFrame) -> pd.DataFrame:
    """Per workload, discipline and policy: mean and CI of the per-seed speed-ups against the
    baseline (avg and p90 JCT: baseline / policy; throughput: policy / baseline), against tLoRA
    (``vs_tlora``: tLoRA's avg JCT / the policy's), the ladder step and its per-seed speed-up over
    the previous step, and the share of the log avg-JCT speed-up that the discipline alone
    explains (``ordering_share``: log speed-up of P-nogroup / log speed-up of P)."""
    from tlora_sim.sim.experiments.seeds import ci95

    rows = []
    for (w, d), part in by_seed.groupby(["workload", "discipline"], sort=False):
        jct = {p: g.set_index("seed").avg_jct_s for p, g in part.groupby("policy")}
        base = part[part.policy == BASELINE].set_index("seed")
        for pol in dict.fromkeys(part.policy):
            mine = part[part.policy == pol].set_index("seed")
            s_avg = base.avg_jct_s / mine.avg_jct_s
            s_p90 = base.p90_jct_s / mine.p90_jct_s
            thr = mine.throughput_tokens_per_s / base.throughput_tokens_per_s
            vs = jct["tlora"] / mine.avg_jct_s if "tlora" in jct else pd.Series([np.nan])
            row = {"workload": w, "discipline": d, "policy": pol, "seeds": len(mine),
                   "avg_jct_h": mine.avg_jct_s.mean() / 3600, "avg_jct_h_ci95": ci95(mine.avg_jct_s / 3600),
                   "avg_jct_speedup": s_avg.mean(), "avg_jct_speedup_ci95": ci95(s_avg),
                   "p90_jct_speedup": s_p90.mean(), "p90_jct_speedup_ci95": ci95(s_p90),
                   "throughput_x": thr.mean(), "throughput_x_ci95": ci95(thr),
                   "vs_tlora": vs.mean(), "vs_tlora_ci95": ci95(vs),
                   "over_max_slowdown_share": mine.get("over_max_slowdown_share", pd.Series([np.nan])).mean()}
            prev = {BASELINE: None, FUSED: BASELINE}
            for g in LADDERS:
                prev[f"{g}-nogroup"], prev[g] = FUSED, f"{g}-nogroup"
            if pol in prev:
                row["ladder_step"] = STEPS.get(pol, "+order" if pol.endswith("-nogroup") else "+grouping")
                step = (jct[prev[pol]] / mine.avg_jct_s if prev[pol] in jct else pd.Series([np.nan])) \
                    if prev[pol] else pd.Series([1.0])
                row["step_speedup"], row["step_speedup_ci95"] = step.mean(), ci95(step)
            if "commit" in mine:
                row["commit"] = ",".join(sorted(set(mine["commit"].astype(str))))
            ng = part[part.policy == f"{pol}-nogroup"].set_index("seed")
            if len(ng) and abs(math.log(max(s_avg.mean(), 1e-9))) > 1e-3:
                row["ordering_share"] = math.log((base.avg_jct_s / ng.avg_jct_s).mean()) / math.log(s_avg.mean())
            rows.append(row)
    out = pd.DataFrame(rows)
    return out[[c for c in out.columns if c != "commit"] + (["commit"] if "commit" in out else [])]


def main(argv: list[str] | None = None) -> int:
    """Run the study; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "study")
    ap.add_argument("--quick", action="store_true", help="one small synthetic workload (CI smoke)")
    ap.add_argument("--workloads", help="comma-separated subset of: " + ", ".join(WORKLOADS))
    ap.add_argument("--seeds", default="0-4", help="seeds (default 0-4)")
    ap.add_argument("--disciplines", default="default", help="comma-separated: default, shared")
    ap.add_argument("--policies", help="comma-separated subset of the policies (default: all; keep "
                                       f"{BASELINE} for the ratios)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--itp", type=Path, default=ITP, help="directory of the ITP cluster traces (default: %(default)s)")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "policy_study.csv")
    ap.add_argument("--by-seed", type=Path, default=ROOT / "bench" / "results" / "policy_study_by_seed.csv",
                    help="the per-seed table (default: %(default)s)")
    ap.add_argument("--merge", action="store_true",
                    help="replace only the re-run policies' rows of the stored per-seed table, then recompute "
                         "the ratios from it (needs --policies)")
    args = ap.parse_args(argv)
    if args.merge and (not args.policies or args.disciplines != "default" or args.quick):
        ap.error("--merge needs --policies, the default discipline (the stored table's) and no --quick")
    table = QUICK if args.quick else {**WORKLOADS, **{n: (f"itp:{args.itp}/{f}", c, [])
                                                      for n, (f, c) in ITP_CLUSTERS.items()}}
    names = args.workloads.split(",") if args.workloads else list(table)
    parts = []
    for name in names:
        spec, cluster, extra = table[name]
        for d in args.disciplines.split(","):
            parts.append(run(name, spec, cluster, extra, d, args.seeds, args.out / name / d, args.workers,
                             args.policies.split(",") if args.policies else POLICIES))
    by_seed = pd.concat(parts, ignore_index=True).assign(commit=head_commit())
    if args.merge:
        stored = pd.read_csv(args.by_seed, dtype={"commit": str})
        by_seed = merge(stored, by_seed, args.policies.split(","))
        result = ratios(by_seed.assign(discipline="default"))
    else:
        result = ratios(by_seed)
    if not args.quick:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        result.to_csv(args.results, index=False)
        by_seed[BY_SEED].to_csv(args.by_seed, index=False)
    cols = ["workload", "discipline", "policy", "avg_jct_h", "avg_jct_speedup", "avg_jct_speedup_ci95",
            "throughput_x", "vs_tlora", "vs_tlora_ci95", "ladder_step", "step_speedup", "over_max_slowdown_share"]
    print(result[[c for c in cols if c in result.columns]].to_markdown(index=False, floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
