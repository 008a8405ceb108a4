"""Issue 19's summary of a kernel benchmark run (bench/kernels.py): per mix, the fused step
against the frozen base layer and against the best baseline, and the targets met.

``bench/kernels.py`` prints it at the end of a run; to summarise a CSV it wrote earlier::

    python bench/kernel_summary.py profiler/data/kernel_bench_h100_2026-11-25-b.csv [--json OUT]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics

BASELINES = ("alone", "loop", "padded", "peft", "lorafusion", "grouped")


def _num(v) -> float:
    """A CSV cell as a number (absent or empty: NaN)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def summarize(rows):
    """Per-mix comparison and issue 19's targets; returns (text, dict). ``rows``: the dicts
    bench/kernels.py writes (one per layer, mix and implementation). With ``--configs`` the first
    configuration (``fused#0``) stands for ``fused``; the baselines are every other
    implementation measured (alone, loop, padded, peft, lorafusion, grouped)."""
    by = {}
    for r in rows:
        by.setdefault((r["layer"], r["mix"]), {})[r["impl"]] = r
    lines = [f"{'layer':<11}{'mix':<9}{'ranks':<21}{'tokens':<15}{'base':>8}{'fused':>15}"
             f"{'loop':>15}{'padded':>15}{'alone':>15}{'peft':>15}{'vsBest':>7}{'eagVsLoop':>10}"]
    res = {"mixes": []}
    for (layer, mix), d in by.items():
        if "fused" not in d and "fused#0" in d:  # --configs: the first one stands for fused
            d["fused"] = d["fused#0"]
        if "base" not in d or "fused" not in d:
            continue
        b = d["base"]["ms"]
        f = d["fused"]

        def cell(k):
            return f" {d[k]['ms']:.3f}({d[k]['ms'] / b:.2f}x)" if k in d else "-"
        bl = [d[k]["ms"] for k in BASELINES if k in d]
        best = min(bl) if bl else float("nan")
        ev = d["loop"]["eager_ms"] / f["eager_ms"] if "loop" in d else float("nan")
        ranks = d["base"]["ranks"]
        differ = len(set(ranks.split(","))) > 1
        lines.append(f"{layer:<11}{mix:<9}{ranks[:20]:<21}{d['base']['tokens'][:14]:<15}{b:>8.3f}"
                     f"{cell('fused'):>15}{cell('loop'):>15}{cell('padded'):>15}"
                     f"{cell('alone'):>15}{cell('peft'):>15}{best / f['ms']:>7.2f}{ev:>10.2f}")
        res["mixes"].append({"layer": layer, "mix": mix, "fused_ratio": f["ms"] / b,
                             "speedup_vs_best": best / f["ms"], "eager_vs_loop": ev,
                             "ranks_differ": differ, "tokens": int(f.get("M") or 0),
                             "eager_over_gpu": f["eager_ms"] / f["ms"],
                             "eager_graph_over_gpu": _num(f.get("eager_graph_ms")) / f["ms"],
                             "eager_auto_over_gpu": _num(f.get("eager_auto_ms")) / f["ms"],
                             "beats_padded": (d["padded"]["ms"] > f["ms"]) if "padded" in d
                             else None})
    m = res["mixes"]
    if m:
        def med(it):
            v = [x for x in it if not math.isnan(x)]
            return statistics.median(v) if v else float("nan")
        t = {
            "median_fused_ratio": med(x["fused_ratio"] for x in m),
            "max_fused_ratio": max(x["fused_ratio"] for x in m),
            "median_speedup_vs_best": med(x["speedup_vs_best"] for x in m),
            "median_eager_vs_loop": med(x["eager_vs_loop"] for x in m),
            "max_eager_over_gpu_2048": max((x["eager_over_gpu"] for x in m if x["tokens"] >= 2048),
                                           default=float("nan")),
            **{f"max_eager_{p}_over_gpu_2048": max((x[f"eager_{p}_over_gpu"] for x in m
                                                    if x["tokens"] >= 2048
                                                    and not math.isnan(x[f"eager_{p}_over_gpu"])),
                                                   default=float("nan")) for p in ("graph", "auto")},
            "beats_padded_all_differing": all(x["beats_padded"] for x in m
                                              if x["ranks_differ"] and x["beats_padded"]
                                              is not None),
        }
        t["met"] = {"fused<=1.15x base (median)": t["median_fused_ratio"] <= 1.15,
                    "fused<=1.3x base (every mix)": t["max_fused_ratio"] <= 1.3,
                    ">=1.2x vs best baseline (median)": t["median_speedup_vs_best"] >= 1.2,
                    ">=2x vs loop eager (median)": t["median_eager_vs_loop"] >= 2.0,
                    "eager within 15% of GPU time (>= 2048 tokens)": t["max_eager_over_gpu_2048"] <= 1.15,
                    "eager within 15% of GPU time (>= 2048 tokens), cuda_graph='auto'":
                        t["max_eager_auto_over_gpu_2048"] <= 1.15,
                    "faster than padded (differing ranks)": t["beats_padded_all_differing"]}
        res["targets"] = t
        lines.append("targets: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                               for k, v in t.items()}))
    return "\n".join(lines), res


def read_rows(path: str) -> list[dict]:
    """The rows of a ``bench/kernels.py`` CSV, with ``ms``, ``eager_ms`` and ``M`` as numbers (an
    empty cell: NaN).

    Raises:
        SystemExit: a file without the columns layer, mix, impl, ms, eager_ms (names the file).
    """
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"layer", "mix", "impl", "ms", "eager_ms"}
    if rows and not need <= rows[0].keys():
        raise SystemExit(f"{path}: not a bench/kernels.py CSV (missing {', '.join(sorted(need - rows[0].keys()))})")
    for r in rows:
        for k in ("ms", "eager_ms", "M"):
            if k in r:
                r[k] = float(r[k]) if r[k] not in ("", None) else float("nan")
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Summarise a bench/kernels.py CSV: per mix, fused against the "
                                             "frozen base layer and the best baseline; issue 19's targets.")
    ap.add_argument("csv", help="kernel benchmark CSV (bench/kernels.py --out)")
    ap.add_argument("--json", help="also write the per-mix comparison and targets as JSON here")
    args = ap.parse_args(argv)
    text, res = summarize(read_rows(args.csv))
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
