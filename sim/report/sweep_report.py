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
from tlora_sim.sim.report.stats import ci95
from tlora_sim.traces.errors import InputError

GROUP_KEYS = ("trace", "cluster", "policy", "lora_dist", "regroup_pause_s", "cost_model", "policy_options",
              "discipline", "window", "first_jobs", "arrival_scale")
OPTIONAL_KEYS = ("window", "first_jobs", "arrival_scale")
"""Group keys that are empty where a cell does not set them (an uncut trace)."""
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
    for col in [k for k in GROUP_KEYS if k in cells.columns and k not in OPTIONAL_KEYS] + \
            [c for c in ("kept_jobs",) if c in cells.columns]:
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


def plot_sweep(sweep_dir: str | Path, formats: Iterable[str] = ("png", "pdf"), plots: bool = True) -> list[Path]:
    """Write ``report.csv`` and (unless ``plots`` is False) the average-JCT figure with 95% intervals;
    returns the figure files.

    One bar group per configuration (the inputs other than policy, policy options, discipline and
    seed), labelled ``C1``, ``C2`` ... with a legend table under the axes naming only the inputs
    that differ between configurations; the inputs every cell shares (the cluster among them) go
    in the footer. One bar per series: the policy, with its options and discipline where set."""
    d = Path(sweep_dir)
    table = sweep_report(d)
    if not plots:
        return []
    config_keys = [k for k in ("trace", "cluster", "lora_dist", "regroup_pause_s", "cost_model") if k in table.columns]
    varying = [k for k in config_keys if table[k].astype(str).nunique() > 1]
    constant = [k for k in config_keys if k not in varying]
    label = table[varying].astype(str).agg(" | ".join, axis=1) if varying else pd.Series(["all"] * len(table))
    series = table.apply(_series_name, axis=1)
    import re

    configs = sorted(dict.fromkeys(label), key=lambda c: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", c)])
    short = {c: (f"C{i + 1}" if varying else "all cells") for i, c in enumerate(configs)}
    seeds = int(table["seeds"].max()) if len(table) else 0
    lines = [f"mean \u00b1 95% CI over {seeds} seed(s)"]
    if "kept_jobs" in table.columns and len(table):
        lo, hi = int(table["kept_jobs"].min()), int(table["kept_jobs"].max())
        lines[0] += f"; kept jobs {lo}" + (f"-{hi}" if hi != lo else "") + " per cell"
    shared = [f"{_KEY_WORDS.get(k, k)} {_short(str(table[k].iloc[0]))}" for k in constant if len(table)]
    meta = d / "sweep.json"
    if meta.is_file():  # the sweep's reference baseline (sweep_file.py adds it to every sweep)
        import json

        try:
            ref = json.loads(meta.read_text()).get("reference")
        except ValueError:
            ref = None
        if ref:
            shared.append(f"reference {ref}")
    if shared:
        lines.append(fs.wrap_footer(["all cells: " + shared[0], *shared[1:]], sep="; "))
    if varying:
        lines.append("configurations: " + ", ".join(_KEY_WORDS.get(k, k) for k in varying))
        lines += [f"{short[c]}: {' | '.join(_short(x) for x in c.split(' | '))}" for c in configs]
    order = label.map({c: i for i, c in enumerate(configs)}).argsort(kind="stable").to_numpy()
    table, label, series = (x.iloc[order].reset_index(drop=True) for x in (table, label, series))
    return ci_bars(table.assign(series=series), label.map(short), d / "figures", "report_avg_jct", formats,
                   "\n".join(fs.wrap_footer([x], sep="; ") if len(x) > fs.FOOTER_CHARS else x for x in lines),
                   series_col="series")


_KEY_WORDS = {"trace": "trace", "cluster": "cluster", "lora_dist": "LoRA dist.", "regroup_pause_s": "regroup pause s",
              "cost_model": "cost model"}


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _series_name(row) -> str:
    """``policy`` plus its options (``k=v``) and a discipline other than ``default``."""
    import json

    name = str(row["policy"])
    opts = row.get("policy_options")
    if isinstance(opts, str) and opts not in ("", "{}"):
        try:
            name += " " + ",".join(f"{k}={v}" for k, v in json.loads(opts).items())
        except ValueError:
            name += " " + opts
    disc = row.get("discipline")
    if isinstance(disc, str) and disc and disc != "default":
        name += f" [{disc}]"
    return name


def plot_seeds(compare_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """The figure of a ``compare --seeds`` directory: average JCT per policy with its 95% interval
    (from ``summary.csv``), one tick per policy, into ``DIR/figures/seeds_avg_jct``, and the
    speed-ups over the reference with their intervals into ``DIR/figures/speedup``; the footers
    name the seeds, the kept jobs (one count, or their range) and the reference."""
    d = Path(compare_dir)
    table = pd.read_csv(d / RunDir.COMPARE_SUMMARY)
    for col in ("policy", "avg_jct_s", "avg_jct_s_ci95", "seeds"):
        if col not in table.columns:
            raise InputError("missing column", file=str(d / RunDir.COMPARE_SUMMARY), field=col)
    by_seed = pd.read_csv(d / RunDir.SEEDS_TABLE)
    seeds = sorted(set(by_seed["seed"]))
    lines = [f"mean \u00b1 95% CI over {len(seeds)} seeds ({', '.join(map(str, seeds))})"]
    if "kept_jobs" in by_seed.columns:
        lo, hi = int(by_seed["kept_jobs"].min()), int(by_seed["kept_jobs"].max())
        lines[0] += f"; {lo} jobs kept per run" if lo == hi else f"; {lo}-{hi} jobs kept per run"
    if "reference" in table.columns and table["reference"].notna().any():
        lines.append(f"reference {table['reference'].dropna().iloc[0]}")
    for col in ("trace", "cluster"):
        if col in by_seed.columns and by_seed[col].nunique() == 1:
            lines.append(f"{col} {_short(str(by_seed[col].iloc[0]))}")
    files = ci_bars(table, table["policy"].astype(str), d / "figures", "seeds_avg_jct", formats, fs.wrap_footer(lines),
                    per_policy_ticks=True)
    ref = table["reference"].dropna().iloc[0] if "reference" in table.columns and table["reference"].notna().any() else None
    if ref is not None and ref in set(table["policy"]) and "avg_jct_speedup" in table.columns and len(table) > 1:
        from tlora_sim.sim.report.figures import speedup_figure

        with fs.style_context():  # the speed-ups with their 95% intervals over the seeds
            fig = speedup_figure(table, fs.policy_styles(table["policy"]), reference=str(ref))
            fig.supxlabel(fs.wrap_footer(lines), fontsize=4.5, color="0.35", x=0.01, ha="left")
            files += fs.save_figure(fig, d / "figures", "speedup", formats)
    return files


def ci_bars(table: pd.DataFrame, label: pd.Series, out_dir: Path, name: str, formats: Iterable[str],
            footer: str, series_col: str = "policy", per_policy_ticks: bool = False) -> list[Path]:
    """Bars of ``avg_jct_s`` (h) per series (``series_col``, default the policy) with
    ``avg_jct_s_ci95`` error bars, one group per distinct ``label`` (``per_policy_ticks``: one bar
    per row, its tick the label); ``footer`` under the axes. Returns the written files."""
    configs = list(dict.fromkeys(label))
    names = list(dict.fromkeys(table[series_col].astype(str)))
    styles = fs.series_styles(names)
    names = list(styles)
    with fs.style_context():
        if per_policy_ticks:
            fig = fs.new_figure(width_in=max(fs.COLUMN_WIDTH_IN, 0.55 * len(names) + 1.2), height_in=2.4)
            ax = fig.add_subplot()
            x = np.arange(len(names))
            rows = [table[table[series_col].astype(str) == n].iloc[0] for n in names]
            y = [float(r["avg_jct_s"]) / _S_PER_H for r in rows]
            e = [float(r["avg_jct_s_ci95"]) / _S_PER_H for r in rows]
            ax.bar(x, y, 0.7, yerr=e, capsize=2, color=[styles[n].color for n in names], edgecolor="black",
                   linewidth=0.4, error_kw={"linewidth": 0.7})
            for xi, yi, ei in zip(x, y, e):
                ax.annotate(f"{yi:.2f} \u00b1 {ei:.2f}", (xi, yi + ei), xytext=(0, 1.5), textcoords="offset points",
                            ha="center", va="bottom", fontsize=5.5)
            ax.set_xticks(x)
            ax.set_xticklabels(names, rotation=30 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center",
                               fontsize=6.5)
            ax.set_ylim(0, max((a + b for a, b in zip(y, e)), default=1.0) * 1.2 or 1.0)
        else:
            fig = fs.new_figure(width_in=max(fs.COLUMN_WIDTH_IN, 0.35 * len(configs) * max(len(names), 1) + 1.5),
                                height_in=2.6)
            ax = fig.add_subplot()
            width = 0.8 / max(len(names), 1)
            for i, p in enumerate(names):
                sel = table[series_col].astype(str) == p
                y = [float(table.loc[sel & (label == c), "avg_jct_s"].iloc[0]) / _S_PER_H
                     if (sel & (label == c)).any() else np.nan for c in configs]
                e = [float(table.loc[sel & (label == c), "avg_jct_s_ci95"].iloc[0]) / _S_PER_H
                     if (sel & (label == c)).any() else 0.0 for c in configs]
                ax.bar(np.arange(len(configs)) + i * width, y, width, yerr=e, capsize=2, label=p,
                       color=styles[p].color, edgecolor="black", linewidth=0.4, hatch=styles[p].hatch or None,
                       error_kw={"linewidth": 0.7})
            ax.set_xticks(np.arange(len(configs)) + width * (len(names) - 1) / 2)
            ax.set_xticklabels(configs, fontsize=7)
            longest = max((len(n) for n in names), default=0)
            ax.legend(fontsize=6, ncol=min(3 if longest <= 16 else 2 if longest <= 28 else 1, len(names)),
                      loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        ax.set_ylabel(fs.axis_label("Average JCT", "h"))
        ax.set_ylim(bottom=0)
        ax.grid(axis="x", visible=False)
        fig.supxlabel(footer, fontsize=5, color="0.35", x=0.01, ha="left")
        return fs.save_figure(fig, out_dir, name, formats)
