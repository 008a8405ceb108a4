"""The per-run and per-comparison figures: JCT and slowdown CDFs, throughput and utilization
over time, and the summary bars. Each function takes already-loaded data and returns a
matplotlib Figure (``style.py`` sets sizes and fonts); nothing here reads or writes files."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report.rundata import BAR_METRICS, BASELINE_POLICY, MAX_POINTS_PER_LINE, warn_skipped
from tlora_sim.sim.report.style import LINE_WIDTH, S_PER_DAY, S_PER_H, legend_above

_BARS_COLUMN_MAX_POLICIES = 6  # more policies than this: bars_figure goes full text width


# --------------------------------------------------------------------------------------------
# Figure builders (each returns a matplotlib Figure; call inside figstyle.style_context())
# --------------------------------------------------------------------------------------------

def _si_scale(max_value: float) -> tuple[float, str]:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if max_value >= factor:
            return factor, prefix
    return 1.0, ""


def _plain_log_ticks(axis) -> None:
    """Label a log axis 0.1, 1, 10 (not 10^k); label minor ticks 2 and 5 when it spans < 2 decades."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    lo, hi = sorted(axis.get_view_interval())
    narrow = lo > 0 and math.log10(hi / lo) < 2.0

    def minor(v: float, _pos) -> str:
        mant = v / 10 ** math.floor(math.log10(v) + 1e-9) if v > 0 else 0.0
        return f"{v:g}" if narrow and (abs(mant - 2) < 1e-6 or abs(mant - 5) < 1e-6) else ""

    axis.set_minor_formatter(FuncFormatter(minor) if narrow else NullFormatter())


def _ecdf_points(values: np.ndarray, n_total: int, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(values)
    y = np.arange(1, x.size + 1, dtype=float) / max(n_total, 1)
    if x.size > max_points:
        idx = np.unique(np.linspace(0, x.size - 1, max_points).round().astype(int))
        x, y = x[idx], y[idx]
    return np.concatenate(([x[0]], x)), np.concatenate(([0.0], y))


def _cdf_figure(samples: Mapping[str, tuple[np.ndarray, int]], styles: Mapping[str, fs.PolicyStyle],
                xlabel: str, scale: float, ref_line: float | None = None):
    fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 2.3)
    ax = fig.add_subplot()
    for pol, (vals, n_total) in samples.items():
        vals = vals[vals > 0] / scale
        if vals.size == 0:
            continue
        x, y = _ecdf_points(vals, n_total, MAX_POINTS_PER_LINE)
        ax.step(x, y, where="post", linewidth=LINE_WIDTH, **styles[pol].line_kwargs())
    if ref_line is not None:
        ax.axvline(ref_line, color="black", linewidth=0.5, alpha=0.45, zorder=0)  # not the reference policy's grey dots
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(fs.axis_label("CDF", "fraction of jobs"))
    legend_above(fig, ax)
    return fig


def jct_cdf_figure(jct_by_policy: Mapping[str, tuple[np.ndarray, int]],
                   styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: CDF of job completion time, log x-axis in hours, one step line per policy.

    Args:
        jct_by_policy: policy -> (finished jobs' JCTs in s, total jobs incl. unfinished).
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(jct_by_policy)
    return _cdf_figure(jct_by_policy, styles, fs.axis_label("Job completion time", "h"), S_PER_H)


def slowdown_cdf_figure(slowdown_by_policy: Mapping[str, tuple[np.ndarray, int]],
                        styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: CDF of per-job slowdown (JCT / isolated runtime), log x-axis, one line per policy.

    Args:
        slowdown_by_policy: policy -> (finished jobs' slowdowns, total jobs incl. unfinished).
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(slowdown_by_policy)
    return _cdf_figure(slowdown_by_policy, styles,
                       fs.axis_label("Slowdown", "\u00d7 isolated runtime"), 1.0, ref_line=1.0)


def _smoothed(series: Mapping[str, tuple[np.ndarray, np.ndarray]]):
    """Every series as window means over one common window (``rundata.smoothing_window``), and
    the time unit: (policy -> (window centres in the unit, means), window in words, unit name, s per unit)."""
    from tlora_sim.sim.report.rundata import smoothing_window, window_label, window_means

    spans = [float(e[-1] - e[0]) for e, m in series.values() if m.size]
    span = max(spans, default=0.0)
    window = smoothing_window(span)
    unit, per = ("days", S_PER_DAY) if span > 2 * S_PER_DAY else ("h", S_PER_H)
    out = {}
    for pol, (edges, means) in series.items():
        if not means.size:
            continue
        e, m = window_means(edges, means, window)
        centres = (e[:-1] + e[1:]) / 2.0
        out[pol] = (centres / per, m)
    return out, window_label(window), unit, per


def throughput_time_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray]],
                           styles: Mapping[str, fs.PolicyStyle] | None = None,
                           size: tuple[float, float] | None = None):
    """Figure: cluster throughput (tokens/s, SI-prefixed) over time, one line per policy, each point
    the time-weighted mean over a window chosen for the span (about 60 windows: 1 min to 7 days,
    named in the x label), so weeks-long traces stay readable.

    Args:
        series: policy -> (bin edges in s, tokens/s per bin), as from :func:`time_weighted_bins`.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
        size: (width, height) in inches (default: one column).
    """
    styles = styles or fs.policy_styles(series)
    smooth, window, unit, _ = _smoothed(series)
    peak = max((float(np.nanmax(m)) for _, m in smooth.values() if m.size), default=0.0)
    factor, prefix = _si_scale(peak)
    fig = fs.new_figure(*(size or (fs.COLUMN_WIDTH_IN, 2.2)))
    ax = fig.add_subplot()
    for pol in styles:
        if pol in smooth:
            x, m = smooth[pol]
            ax.plot(x, m / factor, linewidth=LINE_WIDTH, **styles[pol].line_kwargs())
    ax.set_ylim(bottom=0)
    ax.set_xlabel(fs.axis_label("Time", f"{unit}; each point the mean over {window}"))
    ax.set_ylabel(fs.axis_label("Throughput", f"{prefix} tokens/s".lstrip()))
    legend_above(fig, ax, ncol_max=4)
    return fig


def utilization_time_figure(alloc: Mapping[str, tuple[np.ndarray, np.ndarray]],
                            compute: Mapping[str, tuple[np.ndarray, np.ndarray]],
                            styles: Mapping[str, fs.PolicyStyle] | None = None,
                            size: tuple[float, float] | None = None):
    """Figure: GPU allocation utilization (top) and GPU compute utilization (bottom) over time.

    Two panels sharing the time axis; utilizations in % (inputs are fractions 0..1), each point the
    time-weighted mean over one window chosen for the span (named in the x label).
    *Allocation* = GPUs held / GPUs in the cluster; *compute* = model FLOP/s / peak FLOP/s.

    Args:
        alloc: policy -> (bin edges in s, allocation fraction per bin); may be empty.
        compute: policy -> (bin edges in s, compute fraction per bin); may be empty.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
        size: (width, height) in inches (default: one column).
    """
    styles = styles or fs.policy_styles([*alloc, *compute])
    fig = fs.new_figure(*(size or (fs.COLUMN_WIDTH_IN, 3.0)))
    ax_a, ax_c = fig.subplots(2, 1, sharex=True)
    window, unit = "", "h"
    for ax, data, title, quantity in (
            (ax_a, alloc, "GPU allocation (GPUs held / GPUs in cluster)", "Allocation util."),
            (ax_c, compute, "GPU compute (model FLOP/s / peak FLOP/s)", "Compute util.")):
        smooth, w, u, _ = _smoothed(data) if data else ({}, "", unit, 1.0)
        if data:
            window, unit = w, u
        for pol in styles:
            if pol in smooth:
                x, m = smooth[pol]
                ax.plot(x, 100.0 * m, linewidth=LINE_WIDTH, **styles[pol].line_kwargs())
        if not data:
            ax.text(0.5, 0.5, "not in timeline", transform=ax.transAxes, ha="center", va="center",
                    color="0.4")
        ax.set_title(title, loc="left", fontsize=7)
        ax.set_ylabel(fs.axis_label(quantity, "%"))
        top = max((100.0 * float(np.nanmax(m)) for _, m in smooth.values() if m.size), default=100.0)
        ax.set_ylim(0, min(105.0, max(top * 1.1, 1.0)))
    ax_c.set_xlabel(fs.axis_label("Time", f"{unit}; each point the mean over {window}" if window else unit))
    legend_above(fig, ax_a if alloc else ax_c, ncol_max=4)
    return fig


def available_bar_metrics(summary: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """The entries of ``rundata.BAR_METRICS`` whose column ``summary`` has, with at least one finite
    value (the panels :func:`bars_figure` draws)."""
    out = []
    for m in BAR_METRICS:
        if m[0] in summary.columns:
            vals = pd.to_numeric(summary[m[0]], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            if np.isfinite(vals).any():
                out.append(m)
    return out


def bars_figure(summary: pd.DataFrame, styles: Mapping[str, fs.PolicyStyle] | None = None,
                baseline: str = BASELINE_POLICY):
    """Figure: bar panels of avg JCT, p90 JCT, throughput, allocation and compute utilization.

    Up to six policies: a one-column figure, panels in a 2 x 3 grid with the legend in the sixth
    cell; more: a full-text-width figure, the panels in one row and the legend below them.
    When ``baseline`` is one of the policies, each panel shows the ratio to it (unit "x baseline",
    dashed line at 1; a metric whose baseline value is 0 or missing falls back to raw values); else
    raw values: JCT in hours, throughput in SI-prefixed tokens/s, utilizations in %. Each bar is
    annotated with its value; arrows in the titles say whether lower or higher is better.

    Args:
        summary: one row per policy with a ``policy`` column and the columns of
            ``summary.csv`` (``avg_jct_s``, ``p90_jct_s``, ``throughput_tokens_per_s``,
            ``gpu_alloc_util``, ``gpu_compute_util``); metrics missing or with no finite value are
            left out.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
        baseline: policy the ratios are taken to.

    Raises:
        ValueError: no metric has a finite value.
    """
    from matplotlib.patches import Patch

    styles = styles or fs.policy_styles(summary["policy"])
    table = summary.set_index("policy")
    pols = [p for p in styles if p in table.index]
    metrics = available_bar_metrics(summary)
    if not metrics:
        raise ValueError("summary has none of the bar metrics " + ", ".join(m[0] for m in BAR_METRICS))
    has_base = baseline in table.index
    wide = len(pols) > _BARS_COLUMN_MAX_POLICIES
    if wide:  # many policies: one row of panels at full text width, legend below
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.5)
        axes = np.atleast_1d(fig.subplots(1, len(metrics))).ravel()
    else:
        cols = min(3, len(metrics) + 1)  # the panels and one cell for the legend
        rows = math.ceil((len(metrics) + 1) / cols)
        fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 1.55 * rows)
        axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    x = np.arange(len(pols))
    for ax, (col, title, better, quantity) in zip(axes, metrics):
        vals = np.array([float(table.at[p, col]) for p in pols], dtype=float)
        base = float(table.at[baseline, col]) if has_base else math.nan
        normalised = has_base and math.isfinite(base) and base != 0.0
        if normalised:
            shown = vals / base
            ylabel = fs.axis_label("Ratio", "\u00d7 reference")
            fmt = "{:.2f}"
        elif col.endswith("_jct_s"):
            shown, ylabel, fmt = vals / S_PER_H, fs.axis_label(quantity, "h"), "{:.3g}"
        elif col.endswith("_util"):
            shown, ylabel, fmt = 100.0 * vals, fs.axis_label(quantity, "%"), "{:.1f}"
        else:
            finite = vals[np.isfinite(vals)]
            factor, prefix = _si_scale(float(np.max(finite)) if finite.size else 0.0)
            shown, ylabel, fmt = vals / factor, fs.axis_label(quantity, f"{prefix} tok/s".lstrip()), "{:.3g}"
        if has_base and not normalised:
            warn_skipped(f"bars: {baseline!r} has {col} = {base}; panel {title!r} shows raw values")
        heights = np.where(np.isfinite(shown), shown, 0.0)
        ax.bar(x, heights, width=0.75, color=[styles[p].color for p in pols],
               hatch=None, edgecolor="black", linewidth=0.4)
        for patch, pol in zip(ax.patches, pols):
            patch.set_hatch(styles[pol].hatch or None)
        top = float(np.max(heights)) if heights.size else 1.0
        top = top if top > 0 else 1.0
        for xi, val in zip(x, shown):
            text = fmt.format(val) if math.isfinite(val) else "n/a"
            ax.annotate(text, (xi, val if math.isfinite(val) else 0.0), xytext=(0, 1.5),
                        textcoords="offset points", ha="center", va="bottom", rotation=90,
                        fontsize=5.5 if len(pols) <= 8 else 4.5)
        if normalised:
            ax.axhline(1.0, color="0.4", linewidth=0.6, linestyle=(0, (2, 2)), zorder=0)
        ax.set_ylim(0, top * 1.45)
        arrow = "\u2193" if better == "lower" else "\u2191"
        ax.set_title(f"{title} {arrow}", fontsize=7, pad=2)
        ax.set_xticks([])
        ax.set_xlim(-0.6, len(pols) - 0.4)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_ylabel(ylabel, fontsize=6.5, labelpad=1)
        ax.grid(axis="x", visible=False)
    for ax in axes[len(metrics):]:
        ax.set_axis_off()
    handles = [Patch(facecolor=styles[p].color, edgecolor="black", linewidth=0.4,
                     hatch=styles[p].hatch or None, label=p) for p in pols]
    legend_ax = axes[-1] if len(metrics) < len(axes) and not wide else None
    note = "\u2193 lower / \u2191 higher is better"
    if wide:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(pols), 6), title=note,
                   title_fontsize=5.5, handlelength=1.6)
    elif legend_ax is not None:
        legend_ax.legend(handles=handles, loc="center", ncol=1 if len(pols) <= 6 else 2,
                         title=note, title_fontsize=5.5, handlelength=1.6)
    else:
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(pols), 4), title=note,
                   title_fontsize=5.5)
    return fig


#: Panels of the speed-up figure: (column of ``sim/report/tables.py``, label).
SPEEDUP_PANELS = (("avg_jct_speedup", "Avg JCT"), ("p90_jct_speedup", "p90 JCT"),
                  ("throughput_x", "Throughput"), ("makespan_speedup", "Makespan"))


def speedup_figure(summary: pd.DataFrame, styles: Mapping[str, fs.PolicyStyle] | None = None,
                   reference: str = BASELINE_POLICY, size: tuple[float, float] | None = None):
    """Figure (paper style): each policy's speed-up over ``reference``, grouped bars per metric.

    Groups: avg JCT, p90 JCT, makespan (reference / policy) and throughput (policy / reference),
    where the summary has the column (``sim/report/tables.py`` ``speedups``); one bar per policy
    other than the reference, labelled ``1.58x``; a dashed line at 1 (the reference); error bars
    from ``<column>_ci95`` where present (``compare --seeds``). Above 1 is better everywhere.

    Args:
        summary: one row per policy with ``policy`` and speed-up columns.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles`.
        reference: the reference policy (left out of the bars: it is the line at 1).
        size: (width, height) in inches (default: one column, 2.4 in high).

    Raises:
        ValueError: no speed-up column or no policy besides the reference.
    """
    styles = styles or fs.policy_styles(summary["policy"])
    panels = [(c, t) for c, t in SPEEDUP_PANELS if c in summary.columns]
    table = summary.set_index("policy")
    pols = [p for p in styles if p in table.index and p != reference]
    if not panels or not pols:
        raise ValueError("no speed-up column, or no policy besides the reference")
    fig = fs.new_figure(*(size or (fs.COLUMN_WIDTH_IN, 2.4)))
    ax = fig.add_subplot()
    width = 0.8 / len(pols)
    top = 1.0
    for i, p in enumerate(pols):
        xs = np.arange(len(panels)) + (i - (len(pols) - 1) / 2) * width
        ys = np.array([float(table.at[p, c]) for c, _ in panels], dtype=float)
        err = np.array([float(table.at[p, c + "_ci95"]) if c + "_ci95" in table.columns else 0.0
                        for c, _ in panels], dtype=float)
        err = np.where(np.isfinite(err), err, 0.0)
        heights = np.where(np.isfinite(ys), ys, 0.0)
        bars = ax.bar(xs, heights, width * 0.92, color=styles[p].color, edgecolor="black", linewidth=0.4,
                      hatch=styles[p].hatch or None, label=p,
                      yerr=err if err.any() else None, capsize=1.5, error_kw={"linewidth": 0.6})
        for b, y, e in zip(bars, ys, err):
            ax.annotate("n/a" if not math.isfinite(y) else f"{y:.2f}\u00d7",
                        (b.get_x() + b.get_width() / 2, (y if math.isfinite(y) else 0.0) + e),
                        xytext=(0, 1.5), textcoords="offset points", ha="center", va="bottom",
                        fontsize=5.5 if len(pols) <= 3 else 4.5, rotation=0 if len(pols) <= 3 else 90)
        finite = heights + err
        top = max(top, float(np.max(finite)) if finite.size else 1.0)
    ax.axhline(1.0, color=fs.REFERENCE_GREY, linewidth=0.9, linestyle=(0, (3, 2)), zorder=0.5,
               label=f"{reference} (reference) = 1")
    ax.set_xticks(np.arange(len(panels)))
    ax.set_xticklabels([t for _, t in panels])
    ax.set_xlim(-0.55, len(panels) - 0.45)
    ax.set_ylim(0, top * 1.22)
    ax.set_ylabel(fs.axis_label("Speed-up \u2191", "\u00d7 reference"))
    ax.grid(axis="x", visible=False)
    legend_above(fig, ax, ncol_max=2)
    return fig
