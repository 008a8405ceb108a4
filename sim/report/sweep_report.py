"""``tlora-sim sweep report DIR``: a sweep's cells aggregated over seeds, as a table and a figure.

Reads ``DIR/sweep.csv`` (one row per finished cell) and groups the cells that differ only in
``seed``: each group gets ``seeds`` and, for every numeric metric, its mean and 95% confidence
half-width ``<metric>_ci95`` (Student's t, ``sim/experiments/seeds.py``). Writes
``DIR/report.csv`` and ``DIR/figures/report_avg_jct.png|pdf``: average JCT per policy with its
interval, one bar group per (trace, cluster, other inputs) configuration, a footer naming the
seeds and the kept-job counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report.rundir import write_csv
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError

GROUP_KEYS = ("trace", "cluster", "policy", "lora_dist", "regroup_pause_s", "cost_model", "policy_options")
_S_PER_H = 3600.0


def _check_row_lengths(f: Path, width: int) -> None:
    """Every data row of ``f`` has ``width`` fields (a cut or edited row has fewer or more)."""
    import csv

    with open(f, newline="", encoding="utf-8", errors="replace") as fh:
        try:
            for i, row in enumerate(csv.reader(fh)):
                if i and row and len(row) != width:
                    raise InputError(f"{len(row)} fields, the header has {width} (cut short or edited?)",
                                     file=str(f), row=i)
        except csv.Error as e:
            raise InputError(f"not a readable CSV table ({e})", file=str(f)) from None


def read_sweep_table(f: Path) -> pd.DataFrame:
    """``sweep.csv`` read back and checked: a header with ``seed``, ``avg_jct_s`` and ``policy``,
    at least one row, an integer ``seed`` >= 0, a number in ``avg_jct_s`` and a policy name in
    every row.

    Raises:
        InputError: an empty, unreadable or cut file, a missing column, no rows, or a bad value,
            naming the file, row (1 = the first data row) and field.
    """
    try:
        cells = pd.read_csv(f, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise InputError("empty file; expected the sweep's table (a header row, one row per finished cell)",
                         file=str(f)) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"not a readable CSV table ({' '.join(str(e).split())})", file=str(f)) from None
    except OSError as e:
        raise InputError(f"cannot read ({e.strerror or e})", file=str(f)) from None
    for col in ("seed", "avg_jct_s", "policy"):
        if col not in cells.columns:
            raise InputError("missing column", file=str(f), field=col)
    if cells.empty:
        raise InputError("no finished cells (header only); run the sweep first", file=str(f))
    _check_row_lengths(f, len(cells.columns))
    for col in [k for k in GROUP_KEYS if k in cells.columns] + [c for c in ("kept_jobs",) if c in cells.columns]:
        missing = cells[col].isna().to_numpy()
        if missing.any():
            raise InputError("missing value", file=str(f), row=int(missing.nonzero()[0][0]) + 1, field=col)
    for col in [c for c in ("regroup_pause_s", "kept_jobs") if c in cells.columns]:
        vals = pd.to_numeric(cells[col], errors="coerce")
        bad = (vals.isna() | ~np.isfinite(vals.fillna(0))).to_numpy()
        if bad.any():
            i = int(bad.nonzero()[0][0])
            raise InputError(f"expected a finite number, got {cells[col].iloc[i]!r}", file=str(f), row=i + 1,
                             field=col)
        cells[col] = vals
    seeds = pd.to_numeric(cells["seed"], errors="coerce")
    jct = pd.to_numeric(cells["avg_jct_s"], errors="coerce")
    for col, bad in (("seed", seeds.isna() | (seeds < 0) | (seeds != seeds.round())),
                     ("avg_jct_s", jct.isna() & cells["avg_jct_s"].notna()),
                     ("policy", cells["policy"].isna() | (cells["policy"].astype(str).str.strip() == ""))):
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise InputError(f"bad value {cells[col].iloc[i]!r}", file=str(f), row=i + 1, field=col)
    cells["avg_jct_s"] = jct
    return cells


def sweep_report(sweep_dir: str | Path) -> pd.DataFrame:
    """The aggregated table (see the module docstring); also written to ``DIR/report.csv``.

    Raises:
        InputError: no ``sweep.csv`` in ``sweep_dir``, or it does not read back
            (:func:`read_sweep_table`).
    """
    from tlora_sim.sim.experiments.seeds import ci95

    d = Path(sweep_dir)
    f = d / RunDir.SWEEP_TABLE
    if not f.is_file():
        raise InputError("not a sweep directory (no sweep.csv)", file=str(d))
    cells = read_sweep_table(f)
    keys = [k for k in GROUP_KEYS if k in cells.columns]
    numeric = [c for c in cells.columns if c not in (*keys, "seed", "cell_id")
               and pd.api.types.is_numeric_dtype(cells[c])]
    rows = []
    for vals, part in cells.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, vals if isinstance(vals, tuple) else (vals,)))
        row["seeds"] = int(part["seed"].nunique())
        for c in numeric:
            row[c] = float(part[c].mean())
            row[f"{c}_ci95"] = ci95(part[c].to_numpy())
        rows.append(row)
    table = pd.DataFrame(rows)
    write_csv(d / RunDir.SWEEP_REPORT, table)
    return table


def plot_sweep(sweep_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Write ``report.csv`` and the average-JCT figure with 95% intervals; returns the figure files."""
    d = Path(sweep_dir)
    table = sweep_report(d)
    config_keys = [k for k in GROUP_KEYS if k in table.columns and k != "policy"]
    label = table[config_keys].astype(str).agg(" | ".join, axis=1) if config_keys else pd.Series([""] * len(table))
    seeds = int(table["seeds"].max()) if len(table) else 0
    kept = ""
    if "kept_jobs" in table.columns and len(table):
        kept = f"; kept jobs {int(table['kept_jobs'].min())}-{int(table['kept_jobs'].max())}"
    return ci_bars(table, label, d / "figures", "report_avg_jct", formats,
                   f"mean ± 95% CI over {seeds} seed(s){kept}")


def plot_seeds(compare_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """The figure of a ``compare --seeds`` directory: average JCT per policy with its 95% interval
    (from ``summary.csv``), into ``DIR/figures/seeds_avg_jct``."""
    d = Path(compare_dir)
    table = pd.read_csv(d / RunDir.COMPARE_SUMMARY)
    for col in ("policy", "avg_jct_s", "avg_jct_s_ci95", "seeds"):
        if col not in table.columns:
            raise InputError("missing column", file=str(d / RunDir.COMPARE_SUMMARY), field=col)
    by_seed = pd.read_csv(d / RunDir.SEEDS_TABLE)
    kept = ""
    if "kept_jobs" in by_seed.columns:
        kept = f"; kept jobs {int(by_seed['kept_jobs'].min())}-{int(by_seed['kept_jobs'].max())}"
    footer = f"mean ± 95% CI over {int(table['seeds'].max())} seeds ({', '.join(map(str, sorted(set(by_seed['seed']))))}){kept}"
    return ci_bars(table, pd.Series(["all"] * len(table)), d / "figures", "seeds_avg_jct", formats, footer)


def ci_bars(table: pd.DataFrame, label: pd.Series, out_dir: Path, name: str, formats: Iterable[str],
            footer: str) -> list[Path]:
    """Bars of ``avg_jct_s`` (h) per policy with ``avg_jct_s_ci95`` error bars, one group per
    distinct ``label``; ``footer`` under the axes. Returns the written files."""
    configs = list(dict.fromkeys(label))
    policies = list(dict.fromkeys(table["policy"]))
    styles = fs.policy_styles(policies)
    with fs.style_context():
        fig = fs.new_figure(width_in=max(fs.COLUMN_WIDTH_IN, 1.2 * len(configs) + 1.5), height_in=2.6)
        ax = fig.add_subplot()
        width = 0.8 / max(len(policies), 1)
        for i, p in enumerate(policies):
            sel = table["policy"] == p
            y = [float(table.loc[sel & (label == c), "avg_jct_s"].iloc[0]) / _S_PER_H
                 if (sel & (label == c)).any() else np.nan for c in configs]
            e = [float(table.loc[sel & (label == c), "avg_jct_s_ci95"].iloc[0]) / _S_PER_H
                 if (sel & (label == c)).any() else 0.0 for c in configs]
            ax.bar(np.arange(len(configs)) + i * width, y, width, yerr=e, capsize=2, label=p,
                   color=styles[p].color)
        ax.set_xticks(np.arange(len(configs)) + width * (len(policies) - 1) / 2)
        ax.set_xticklabels([c.split(" | ")[0].split("/")[-1][:28] for c in configs], fontsize=6)
        ax.set_ylabel("average JCT (h)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=6, ncol=min(3, len(policies)), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
        fig.supxlabel(footer, fontsize=5, color="0.35", x=0.01, ha="left")
        return fs.save_figure(fig, out_dir, name, formats)
