"""Queueing against offered load across a directory of comparisons (the sensitivity figure):
finding the comparisons, reading each one's load from the ``axes`` its runs' ``config.json``
records (``sim/experiments/spec.py`` ``axes``: the offered load, the cluster's GPUs and the trace
with its load left out, derived once where the run was set up), and drawing ``queue_vs_load``.
Run directories written before ``axes`` existed are left out with a warning naming them (re-run
the comparison, or pass ``loads=``)."""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.report.rundata import FIGURES_DIR, JOBS_CSV, SUMMARY_CSV, load_compare
from tlora_sim.sim.report.rundata import check_formats, numeric_column, warn_skipped
from tlora_sim.sim.report.style import LINE_WIDTH, S_PER_H, legend_above


# --------------------------------------------------------------------------------------------
# Across comparisons: queueing delay against offered load
# --------------------------------------------------------------------------------------------

#: Base name of the queueing-delay-against-load figure (further load sweeps: ``_2``, ``_3``, ...).
QUEUE_LOAD_FIGURE = "queue_vs_load"


def _natural_key(name: str) -> list:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def find_compare_dirs(parent: str | Path) -> list[Path]:
    """Return the comparison directories (holding ``summary.csv``) directly under ``parent``.

    Sorted by name in natural order (``p2`` before ``p10``); ``figures/`` and hidden entries are
    ignored. Returns ``[]`` when ``parent`` is not a directory.
    """
    parent = Path(parent)
    if not parent.is_dir():
        return []
    subs = [d for d in parent.iterdir()
            if d.is_dir() and not d.name.startswith(".") and d.name != FIGURES_DIR
            and (d / SUMMARY_CSV).is_file()]
    return sorted(subs, key=lambda d: _natural_key(d.name))


def _axes(runs: Mapping, d: Path) -> tuple[dict | None, Path | None]:
    """The ``axes`` record of a comparison's runs (the first run's that has one) and its file."""
    for run in runs.values():
        rec = run.config.get("axes") if isinstance(run.config, dict) else None
        if rec is not None:
            path = Path(run.run_dir) / "config.json"
            if not isinstance(rec, dict):
                raise InputError(f"expected an object of the run's axes, got {rec!r}", file=str(path), field="axes")
            return rec, path
    return None, None


def _axis_number(rec: dict, key: str, path: Path) -> float | None:
    """``axes.<key>`` as a float (None where absent or null).

    Raises:
        InputError: not a finite number, naming the file and ``axes.<key>``.
    """
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError(f"expected a finite number, got {v!r}", file=str(path), field=f"axes.{key}")
    return float(v)


def _first(*values):
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and v != "":
            return v
    return None


def _lookup_load(loads: Mapping, d: Path) -> float | None:
    for key in (d, str(d), d.name, d.resolve(), str(d.resolve())):
        if key in loads:
            return float(loads[key])
    for key, val in loads.items():  # keys given as other spellings of the same path
        with_path = Path(str(key))
        if with_path.exists() and with_path.resolve() == d.resolve():
            return float(val)
    return None


def load_sweep_points(compare_dirs: Sequence[str | Path],
                      loads: Mapping[str | Path, float] | None = None) -> pd.DataFrame:
    """Collect queueing delays per policy and offered load from several comparison directories.

    The offered load of each comparison comes from ``loads`` when given (keys: the directory path,
    or its name; values: offered load as a fraction of the cluster's GPUs), else from the ``axes``
    its policy runs record in ``config.json`` (``sim/experiments/spec.py`` ``axes``): ``load``,
    i.e. ``load x gpus / cluster GPUs x arrival_scale`` for a ``synthetic:...,load=L,gpus=G``
    spec replayed on the comparison's cluster (the spec's ``load`` itself when the cluster has the
    ``G`` GPUs the spec was sized for and the arrivals are not scaled). A comparison whose runs
    record no axes (written before they were recorded) is left out with a :class:`PlotWarning`.

    Without ``loads`` the comparisons are grouped into *load sweeps*: comparisons whose inputs
    (trace options, cluster, seed, LoRA distribution, ...) differ only in the load form one sweep
    (``series``); a sweep keeps one comparison per load (the first in the given order) and needs at
    least two loads. Comparisons without a load or alone in their group are left out with a
    :class:`PlotWarning`. With ``loads`` every comparison belongs to one sweep (series 1).

    Args:
        compare_dirs: comparison directories (``summary.csv`` plus one run directory per policy).
        loads: optional explicit offered load per directory.

    Returns:
        one row per (comparison, policy) kept: ``series`` (1, 2, ...), ``load`` (offered load,
        fraction of the cluster's GPUs), ``trace_load`` and ``trace_gpus`` (the spec's options, NaN
        for real traces), ``cluster``, ``cluster_gpus``, ``compare_dir``, ``policy``,
        ``avg_queue_s`` (``summary.csv``; else the mean of ``jobs.csv`` ``queue_s``),
        ``p50_queue_s`` and ``p90_queue_s`` (of ``jobs.csv`` ``queue_s`` over the jobs that started;
        NaN without the run directory), ``jobs``, ``context`` (what the sweep keeps fixed, JSON).
        Sorted by series, load and policy display order.

    Raises:
        InputError: a directory is not a comparison, a file is malformed (an ``axes`` value that
            is no number names ``config.json`` and ``axes.<key>``), the policies of one comparison
            disagree on the trace, or no load sweep remains.
    """
    dirs = list(dict.fromkeys(Path(d) for d in compare_dirs))
    if not dirs:
        raise InputError("no comparison directories given", field="compare_dirs")
    rows: list[dict] = []
    contexts: dict[Path, str] = {}
    for d in dirs:
        summary, runs = load_compare(d)
        configs = [r.config for r in runs.values() if r.config]
        inputs = [c.get("inputs") if isinstance(c.get("inputs"), dict) else {} for c in configs]
        traces = {str(_first(i.get("trace"), c.get("trace"))) for i, c in zip(inputs, configs)
                  if _first(i.get("trace"), c.get("trace")) is not None}
        if not traces and "trace" in summary.columns:  # no config.json: summary.csv's column
            traces = {str(t) for t in summary["trace"].dropna()}
        if len(traces) > 1:
            raise InputError(f"the policy runs replay different traces ({', '.join(sorted(traces))}); "
                             f"a comparison replays one", file=str(d))
        spec = next(iter(traces), None)
        first_in = inputs[0] if inputs else {}
        cluster = _first(first_in.get("cluster"), configs[0].get("cluster") if configs else None,
                         summary["cluster"].iloc[0] if "cluster" in summary.columns and len(summary) else None)
        rec, rec_path = _axes(runs, d)
        cluster_gpus, tl = math.nan, None
        if rec is not None:
            cluster_gpus = _first(_axis_number(rec, "cluster_gpus", rec_path), math.nan)
            trace_l, trace_g = _axis_number(rec, "trace_load", rec_path), _axis_number(rec, "trace_gpus", rec_path)
            tl = (trace_l, int(trace_g)) if trace_l is not None and trace_g is not None else None
        if loads is not None:
            offered = _lookup_load(loads, d)
            if offered is None:
                raise InputError("no load given for this comparison directory", file=str(d), field="loads")
            context = "explicit"
        else:
            if rec is None:
                warn_skipped(f"{d}: its runs' config.json records no axes (written by a tlora-sim before the experiment "
                      f"spec); left out of the queueing-delay-against-load figure (re-run the comparison, or "
                      f"pass loads= to give it one)")
                continue
            offered = _axis_number(rec, "load", rec_path)
            if offered is None:
                warn_skipped(f"{d}: trace {spec!r} has no load= option (only synthetic traces do); left out of "
                      f"the queueing-delay-against-load figure (pass loads= to give it one)")
                continue
            fixed = {k: v for k, v in first_in.items() if k not in ("policy", "policy_options", "trace")}
            if not first_in and "seed" in summary.columns:
                fixed = {"seed": str(summary["seed"].iloc[0])}
            fixed["cluster"] = cluster
            fixed["trace"] = rec.get("trace_family", spec)
            context = json.dumps(fixed, sort_keys=True, default=str)
        contexts[d] = context
        for _, srow in summary.iterrows():
            pol = str(srow["policy"])
            q = np.empty(0)
            if pol in runs:
                jobs = runs[pol].jobs
                path = runs[pol].run_dir / JOBS_CSV
                if "queue_s" in jobs.columns:
                    q = numeric_column(jobs, "queue_s", path).to_numpy(dtype=float)
                elif {"start_time_s", "submit_time_s"} <= set(jobs.columns):
                    q = (numeric_column(jobs, "start_time_s", path) - jobs["submit_time_s"]).to_numpy(dtype=float)
                q = q[np.isfinite(q)]
            avg = pd.to_numeric(pd.Series([srow.get("avg_queue_s", np.nan)]), errors="coerce").iloc[0]
            if not math.isfinite(float(avg)) and q.size:
                avg = float(q.mean())
            rows.append({
                "series": 0, "load": float(offered),
                "trace_load": tl[0] if tl else math.nan, "trace_gpus": tl[1] if tl else math.nan,
                "cluster": cluster, "cluster_gpus": cluster_gpus, "compare_dir": str(d), "policy": pol,
                "avg_queue_s": float(avg),
                "p50_queue_s": float(np.percentile(q, 50)) if q.size else math.nan,
                "p90_queue_s": float(np.percentile(q, 90)) if q.size else math.nan,
                "jobs": int(srow["jobs"]) if "jobs" in srow and pd.notna(srow["jobs"]) else len(q),
                "context": context,
            })
    points = pd.DataFrame(rows, columns=["series", "load", "trace_load", "trace_gpus", "cluster",
                                         "cluster_gpus", "compare_dir", "policy", "avg_queue_s",
                                         "p50_queue_s", "p90_queue_s", "jobs", "context"])
    # One comparison per (context, load): the first in the given order.
    keep_dirs: list[str] = []
    series_of: dict[str, int] = {}
    seen: set[tuple[str, float]] = set()
    by_context: dict[str, list[str]] = {}
    for d in dirs:
        if d not in contexts:
            continue
        sub = points[points["compare_dir"] == str(d)]
        if sub.empty:
            continue
        key = (contexts[d], round(float(sub["load"].iloc[0]), 9))
        if key in seen:
            continue
        seen.add(key)
        by_context.setdefault(contexts[d], []).append(str(d))
    for context, members in by_context.items():
        n_loads = points[points["compare_dir"].isin(members)]["load"].round(9).nunique()
        if n_loads < 2:
            warn_skipped(f"{', '.join(members)}: no other comparison differs from it only in the load; left "
                  f"out of the queueing-delay-against-load figure")
            continue
        series_of[context] = len(series_of) + 1
        keep_dirs += members
    points = points[points["compare_dir"].isin(keep_dirs)].copy()
    if points.empty:
        raise InputError("no load sweep: expected comparison directories of synthetic traces that "
                         "differ only in their load= option (or pass loads=)",
                         file=", ".join(str(d) for d in dirs))
    points["series"] = points["context"].map(series_of).astype(int)
    rank = {p: i for i, p in enumerate(fs.policy_order(points["policy"]))}
    points["_order"] = points["policy"].map(rank)
    points = points.sort_values(["series", "load", "_order"], kind="stable").drop(columns="_order")
    return points.reset_index(drop=True)


def _time_unit(max_s: float) -> tuple[float, str]:
    """(seconds per unit, unit) for a duration axis whose largest value is ``max_s`` seconds."""
    if max_s >= 2 * S_PER_H:
        return S_PER_H, "h"
    if max_s >= 120.0:
        return 60.0, "min"
    return 1.0, "s"


def queue_vs_load_figure(points: pd.DataFrame, styles: Mapping[str, fs.PolicyStyle] | None = None,
                         title: str | None = None):
    """Figure: average (left) and p90 (right) queueing delay against offered load, a line per policy.

    Queueing delay = first start - submit (s), drawn in s, min or h (picked from the largest
    value); the x-axis is the offered load as a fraction of the cluster's GPUs (1.0 = demand equals
    capacity), a dotted line marks 1.0 when it is in range. The p90 panel is left out when no
    point has a p90. One column wide.

    Args:
        points: rows of one load sweep, columns ``policy``, ``load``, ``avg_queue_s`` and optionally
            ``p90_queue_s`` (e.g. one ``series`` of :func:`load_sweep_points`).
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
        title: optional panel title (e.g. what the sweep keeps fixed).

    Raises:
        ValueError: ``points`` has no finite average queueing delay.
    """
    styles = styles or fs.policy_styles(points["policy"])
    avg = pd.to_numeric(points["avg_queue_s"], errors="coerce")
    if not np.isfinite(avg.to_numpy(dtype=float, na_value=np.nan)).any():
        raise ValueError("no finite avg_queue_s to plot")
    p90 = pd.to_numeric(points["p90_queue_s"], errors="coerce") if "p90_queue_s" in points else None
    has_p90 = p90 is not None and np.isfinite(p90.to_numpy(dtype=float, na_value=np.nan)).any()
    top = float(np.nanmax(np.concatenate([avg.to_numpy(dtype=float, na_value=np.nan),
                                          p90.to_numpy(dtype=float, na_value=np.nan) if has_p90 else []])))
    scale, unit = _time_unit(top)
    fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 2.3)
    axes = list(np.atleast_1d(fig.subplots(1, 2 if has_p90 else 1)))
    panels = [("avg_queue_s", "Average")] + ([("p90_queue_s", "90th percentile")] if has_p90 else [])
    loads = np.sort(points["load"].astype(float).unique())
    for ax, (col, panel_title) in zip(axes, panels):
        for pol, st in styles.items():
            sub = points[points["policy"] == pol].sort_values("load")
            if sub.empty:
                continue
            y = pd.to_numeric(sub[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan) / scale
            ax.plot(sub["load"].astype(float), y, marker=st.marker, linewidth=LINE_WIDTH, markersize=3.5,
                    **st.line_kwargs())
        if loads.size and loads[0] <= 1.0 <= loads[-1]:
            ax.axvline(1.0, color="0.5", linewidth=0.5, linestyle=(0, (2, 2)), zorder=0)
        ax.set_ylim(bottom=0)
        ax.set_title(panel_title, loc="left", fontsize=7, pad=2)
        ax.set_xticks(loads, [f"{v:.3g}" for v in loads])
        ax.tick_params(axis="x", labelrotation=90 if loads.size > 6 else 0)
    axes[0].set_ylabel(fs.axis_label("Queueing delay", unit))
    fig.supxlabel(fs.axis_label("Offered load", "GPU demand / cluster GPUs"), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=6.5)
    legend_above(fig, axes[0])
    return fig


def _sweep_title(points: pd.DataFrame) -> str:
    ctx = json.loads(points["context"].iloc[0]) if points["context"].iloc[0] != "explicit" else {}
    parts = [f"cluster {points['cluster'].iloc[0]}"] if pd.notna(points["cluster"].iloc[0]) else []
    if ctx.get("lora_dist"):
        parts.append(f"LoRA {ctx['lora_dist']}")
    if ctx.get("trace"):
        parts.append(str(ctx["trace"]).split(":", 1)[0])
    return ", ".join(parts)


def plot_queue_vs_load(source: str | Path | Sequence[str | Path], out_dir: str | Path | None = None,
                       formats: Iterable[str] = ("png", "pdf"),
                       loads: Mapping[str | Path, float] | None = None) -> list[Path]:
    """Draw queueing delay against offered load across comparison directories.

    Each load sweep found by :func:`load_sweep_points` becomes one figure,
    ``queue_vs_load.<format>`` for the first and ``queue_vs_load_2``, ... for further ones (then
    titled with the cluster and LoRA distribution they keep fixed), drawn by
    :func:`queue_vs_load_figure` from ``summary.csv`` and each run's ``jobs.csv`` only. E.g. the
    ``load`` points of ``bench/sensitivity.py`` (``runs/sensitivity/p0..p3``, synthetic traces with
    ``load=0.5..1.1`` on the 32 GPUs they were sized for) form one sweep; its other points, which
    vary the cluster or the rank distribution, are left out with a :class:`PlotWarning`.

    Args:
        source: a directory whose subdirectories are comparison directories (see
            :func:`find_compare_dirs`), or a sequence of comparison directories.
        out_dir: where the figures go; default ``SOURCE/figures/`` for a directory, else
            ``figures/`` in the comparison directories' common parent.
        formats: figure formats, among ``png`` (200 dpi), ``pdf``, ``svg``.
        loads: explicit offered load per comparison directory (see :func:`load_sweep_points`).

    Returns:
        the written files, sweep by sweep, each in the order of ``formats``.

    Raises:
        InputError: no comparison directory, no load sweep, a malformed file, or an unknown format.
    """
    fmts = check_formats(formats)
    if isinstance(source, (str, Path)):
        root = Path(source)
        dirs = find_compare_dirs(root)
        if not dirs:
            raise InputError("expected comparison directories (each with summary.csv) under it",
                             file=str(root))
        default_out = root / FIGURES_DIR
    else:
        dirs = [Path(d) for d in source]
        if not dirs:
            raise InputError("no comparison directories given", field="source")
        default_out = Path(os.path.commonpath([str(d.resolve()) for d in dirs])) / FIGURES_DIR
    points = load_sweep_points(dirs, loads)
    out = Path(out_dir) if out_dir is not None else default_out
    n_series = int(points["series"].max())
    styles = fs.policy_styles(points["policy"])
    written: list[Path] = []
    with fs.style_context():
        for k in range(1, n_series + 1):
            sub = points[points["series"] == k]
            name = QUEUE_LOAD_FIGURE if k == 1 else f"{QUEUE_LOAD_FIGURE}_{k}"
            fig = queue_vs_load_figure(sub, {p: styles[p] for p in styles if p in set(sub["policy"])},
                                       title=_sweep_title(sub) if n_series > 1 else None)
            written += fs.save_figure(fig, out, name, fmts)
    return written
