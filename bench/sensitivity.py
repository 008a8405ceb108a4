"""Sensitivity of the policy gains to load, cluster size and rank distribution (issues 5, 16, 17).

Each point is one ``tlora-sim compare --seeds`` on a synthetic ITP-fitted workload, every policy
with its defaults: its own priority order with EASY backfilling (every policy's default since
issue 40), its own plans;
the figure shows each policy's average-JCT speed-up over ``independent-backfill`` at each point,
the mean over seeds with its 95% confidence interval (each seed redraws the LoRA attributes).
Writes ``bench/results/sensitivity.csv`` and ``docs/figures/sensitivity.{png,pdf}``.

    python bench/sensitivity.py --out runs/sensitivity --seeds 0-4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "independent-backfill"
POLICIES = [BASELINE, "independent-fused", "mlora", "lorafusion", "tlora", "tlora-nogroup", "lookahead"]
JOBS = 800


def points(jobs: int) -> list[tuple[str, str, str, str, str]]:
    """(panel, x label value, trace spec, cluster, LoRA distribution) per point."""
    spec = "synthetic:jobs={j},seed=5,load={load},gpus=32,max_gpus=8"
    out = [("load", f"{load:.1f}", spec.format(j=jobs, load=load), "4x8xH100", "tlora") for load in (0.5, 0.7, 0.9, 1.1)]
    out += [("cluster GPUs", str(n * 8), spec.format(j=jobs, load=0.8), f"{n}x8xH100", "tlora") for n in (3, 4, 6)]
    out += [("rank distribution", d, spec.format(j=jobs, load=0.8), "4x8xH100", d) for d in ("tlora", "mixed-ranks")]
    return out


def plot(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Three panels (load, cluster size, rank distribution) of avg-JCT speed-up per policy."""
    from matplotlib.ticker import FuncFormatter

    from tlora_sim.sim.report import style as fs

    panels = list(dict.fromkeys(df["panel"]))
    styles = fs.policy_styles(df["policy"].unique())
    with fs.style_context():
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.2)
        axes = fig.subplots(1, len(panels), sharey=True)
        for ax, panel in zip(axes, panels):
            sub = df[df["panel"] == panel]
            xs = list(dict.fromkeys(sub["x"]))
            for name, st in styles.items():
                p = sub[sub["policy"] == name].set_index("x").reindex(xs)
                ax.errorbar(range(len(xs)), p["avg_jct_speedup"], yerr=p["avg_jct_speedup_ci95"], marker=st.marker,
                            capsize=2, **st.line_kwargs())
            ax.set_xticks(range(len(xs)), xs)
            ax.set_xlabel(fs.axis_label(panel, "offered load" if panel == "load" else
                                        "GPUs" if panel == "cluster GPUs" else "named"))
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(  # labelled minor ticks below 1 too (LoRAFusion's)
                lambda v, _: f"{v:g}" if round(v, 6) in (0.2, 0.3, 0.5, 2, 3, 5) else ""))
        axes[0].set_ylabel(fs.axis_label("Avg JCT speed-up", "x independent-backfill"))
        axes[-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return fs.save_figure(fig, out_dir, "sensitivity")


def main(argv: list[str] | None = None) -> int:
    """Run every point and draw the figure; returns the exit status."""
    from tlora_sim.sim.experiments.seeds import ci95

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "sensitivity")
    ap.add_argument("--jobs", type=int, default=JOBS, help="jobs per synthetic trace")
    ap.add_argument("--seeds", default="0-4", help="seeds of every point (default 0-4)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "sensitivity.csv")
    ap.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    args = ap.parse_args(argv)
    opts: list[str] = []  # every policy's defaults (EASY backfilling for all)
    rows = []
    for i, (panel, x, spec, cluster, dist) in enumerate(points(args.jobs)):
        out = args.out / f"p{i}"
        subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--trace", spec, "--cluster", cluster,
                        "--lora-dist", dist, "--seeds", args.seeds, "--policies", ",".join(POLICIES), "--workers",
                        str(args.workers), "--out", str(out), "--no-progress", "--force", *opts], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        by_seed = pd.read_csv(out / "summary_by_seed.csv")
        base = by_seed[by_seed.policy == BASELINE].set_index("seed")
        for pol in dict.fromkeys(by_seed.policy):
            mine = by_seed[by_seed.policy == pol].set_index("seed")
            sp = base.avg_jct_s / mine.avg_jct_s
            thr = mine.throughput_tokens_per_s / base.throughput_tokens_per_s
            rows.append({"panel": panel, "x": x, "trace": spec, "cluster": cluster, "lora_dist": dist,
                         "policy": pol, "seeds": len(mine), "avg_jct_s": mine.avg_jct_s.mean(),
                         "avg_jct_speedup": sp.mean(), "avg_jct_speedup_ci95": ci95(sp),
                         "throughput_x": thr.mean(), "throughput_x_ci95": ci95(thr)})
        print(f"{panel}={x}: done", flush=True)
    df = pd.DataFrame(rows)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.results, index=False)
    for f in plot(df, args.figures):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
