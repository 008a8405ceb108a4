"""Paper-style figures drawn only from the files of a run directory or a comparison directory.

Every figure is re-drawn from what the simulator wrote, so any run can be re-plotted later:

* a **run directory** ``RUN/`` holds ``jobs.csv`` (required), ``timeline.csv``, ``summary.json`` and
  ``config.json`` (optional); figures go to ``RUN/figures/``;
* a **comparison directory** ``OUT/`` holds ``summary.csv`` (required; one row per policy) and one run
  directory per policy, ``OUT/<policy>/``; figures go to ``OUT/figures/``.

Figures (each written as ``<name>.png`` at 200 dpi and ``<name>.pdf``, see :data:`FIGURE_NAMES`):

``jct_cdf``
    CDF of job completion time (finish - submit), log x-axis in hours, one line per policy.
``slowdown_cdf``
    CDF of per-job slowdown (JCT / isolated runtime), log x-axis, one line per policy.
``throughput_time``
    Cluster throughput (tokens/s) over time (days), a step line per policy.
``utilization_time``
    GPU *allocation* utilization (top) and GPU *compute* utilization (bottom) over time (days), in %.
``bars``
    Average JCT, p90 JCT, throughput, allocation and compute utilization, one panel each; values are
    ratios to the ``independent`` policy when it is in the summary, raw values otherwise.

Across several comparison directories (a directory of them, e.g. ``runs/sensitivity``), figures go
to ``DIR/figures/``:

``queue_vs_load``
    Average and p90 queueing delay (first start - submit) against offered load (GPU demand / cluster
    GPUs, from the synthetic traces' ``load=`` option or given explicitly), a line per policy
    (:func:`plot_queue_vs_load`).

:func:`relative_table` gives the numbers behind ``bars`` (ratios to ``independent``) as a table.

CDFs count every job in ``jobs.csv`` in the denominator, so a policy that leaves jobs unfinished
(empty ``jct_s``) tops out below 1. Time series are piecewise constant (each ``timeline.csv`` row holds
from its ``time_s`` to the next row's); lines with more than :data:`MAX_POINTS_PER_LINE` segments are
aggregated into equal-width bins by time-weighted averaging (:func:`time_weighted_bins`), which keeps
the integral (e.g. the tokens trained) exact, so million-row timelines plot in about a second.

A missing optional input skips the figures that need it with a :class:`PlotWarning`; a missing
required input, or a malformed file, raises :class:`tlora_sim.traces.errors.InputError` naming the file.

matplotlib is used without pyplot (:class:`matplotlib.figure.Figure` only), so no display is needed
and the global backend is never changed. Command line: ``python -m tlora_sim.sim.report.plots DIR [--formats png,pdf]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.traces.errors import InputError

__all__ = [
    "FIGURE_NAMES",
    "MAX_POINTS_PER_LINE",
    "PlotWarning",
    "RunData",
    "load_run",
    "load_compare",
    "time_weighted_bins",
    "plot_run",
    "plot_compare",
    "plot_any",
    "jct_cdf_figure",
    "slowdown_cdf_figure",
    "throughput_time_figure",
    "utilization_time_figure",
    "bars_figure",
    "RELATIVE_COLUMNS",
    "relative_table",
    "QUEUE_LOAD_FIGURE",
    "find_compare_dirs",
    "trace_load",
    "load_sweep_points",
    "queue_vs_load_figure",
    "plot_queue_vs_load",
]

#: Base names of the figures, in the order they are drawn (files are ``<name>.<format>``).
FIGURE_NAMES = ("jct_cdf", "slowdown_cdf", "throughput_time", "utilization_time", "bars")
#: Most points drawn per line (CDF points or time bins).
MAX_POINTS_PER_LINE = 2000

JOBS_CSV = "jobs.csv"
TIMELINE_CSV = "timeline.csv"
SUMMARY_JSON = "summary.json"
CONFIG_JSON = "config.json"
SUMMARY_CSV = "summary.csv"
FIGURES_DIR = "figures"

BASELINE_POLICY = "independent"
_BARS_COLUMN_MAX_POLICIES = 6  # more policies than this: bars_figure goes full text width
_S_PER_H = 3600.0
_S_PER_DAY = 86400.0
_LW = 1.0  # line width (pt) of data lines; StepPatch (stairs) does not follow lines.linewidth
_TIMELINE_COLUMNS = ("tokens_per_s", "gpu_alloc_util", "gpu_compute_util")

# (summary column, panel title, better direction, raw-value label quantity)
_BAR_METRICS = (
    ("avg_jct_s", "Avg JCT", "lower", "JCT"),
    ("p90_jct_s", "p90 JCT", "lower", "JCT"),
    ("throughput_tokens_per_s", "Throughput", "higher", "Rate"),
    ("gpu_alloc_util", "Alloc. util.", "higher", "Util."),
    ("gpu_compute_util", "Compute util.", "higher", "Util."),
)


class PlotWarning(UserWarning):
    """A figure (or one policy's line in it) was skipped because optional data is missing."""


def _warn(msg: str) -> None:
    warnings.warn(msg, PlotWarning, stacklevel=3)


# --------------------------------------------------------------------------------------------
# Reading the files
# --------------------------------------------------------------------------------------------

@dataclass
class RunData:
    """The files of one run directory, as read by :func:`load_run`.

    Attributes:
        run_dir: the run directory.
        policy: policy name (``config.json`` ``policy``, else ``summary.json`` ``policy``, else the
            directory name; a comparison names each run after its ``summary.csv`` row instead).
        config: ``config.json`` contents, ``{}`` when the file is missing.
        summary: ``summary.json`` contents, ``None`` when the file is missing.
        jobs: ``jobs.csv`` (one row per job; times in seconds from trace start).
        timeline_path: path of ``timeline.csv``, ``None`` when missing (read lazily: it can be large).
    """

    run_dir: Path
    policy: str
    config: dict
    summary: dict | None
    jobs: pd.DataFrame
    timeline_path: Path | None

    def jct_s(self) -> tuple[np.ndarray, int]:
        """Return (finite job completion times in s, number of jobs in ``jobs.csv``)."""
        return _finite(self.jobs["jct_s"]), len(self.jobs)

    def slowdown(self) -> tuple[np.ndarray, int] | None:
        """Return (finite per-job slowdowns, number of jobs), or ``None`` when not derivable."""
        if "slowdown" not in self.jobs:
            return None
        return _finite(self.jobs["slowdown"]), len(self.jobs)

    def end_time_s(self) -> float:
        """Latest job finish time in s (NaN when no job finished)."""
        if "finish_time_s" not in self.jobs or self.jobs["finish_time_s"].notna().sum() == 0:
            return math.nan
        return float(self.jobs["finish_time_s"].max())


def _finite(s: pd.Series) -> np.ndarray:
    a = s.to_numpy(dtype=float, na_value=np.nan)
    return a[np.isfinite(a)]


def _read_json_object(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg} at line {exc.lineno})", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
    if not isinstance(obj, dict):
        raise InputError("expected one JSON object", file=str(path))
    return obj


def _read_csv(path: Path, **kwargs) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **kwargs)
    except pd.errors.EmptyDataError:
        raise InputError("empty file; expected a CSV header row", file=str(path)) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(f"not a readable CSV ({str(exc).splitlines()[0]})", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None


def _numeric(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    """Column ``col`` as float64; a non-numeric cell raises InputError naming file, row and field."""
    raw = df[col]
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        return raw.astype("float64")
    num = pd.to_numeric(raw, errors="coerce")
    blank = raw.isna() | (raw.astype(str).str.strip() == "")
    bad = num.isna() & ~blank
    if bad.any():
        pos = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(f"expected a number, got {raw.iloc[pos]!r}", file=str(path), row=pos + 1,
                         field=col)
    return num.astype("float64")


def _read_jobs(path: Path) -> pd.DataFrame:
    jobs = _read_csv(path)
    cols = set(jobs.columns)
    for col in ("jct_s", "slowdown", "finish_time_s", "submit_time_s", "isolated_runtime_s"):
        if col in cols:
            jobs[col] = _numeric(jobs, col, path)
    if "jct_s" not in cols:
        if {"finish_time_s", "submit_time_s"} <= cols:
            jobs["jct_s"] = jobs["finish_time_s"] - jobs["submit_time_s"]
        else:
            raise InputError("missing column; expected jct_s (or finish_time_s and submit_time_s)",
                             file=str(path), field="jct_s")
    if "slowdown" not in cols and "isolated_runtime_s" in cols:
        jobs["slowdown"] = jobs["jct_s"] / jobs["isolated_runtime_s"]
    return jobs


def _policy_name(config: dict, summary: dict | None, run_dir: Path) -> str:
    for source in (config, summary or {}):
        pol = source.get("policy")
        if isinstance(pol, dict):
            pol = pol.get("name")
        if isinstance(pol, str) and pol:
            return pol
    return run_dir.name


def load_run(run_dir: str | Path, *, policy: str | None = None) -> RunData:
    """Read a run directory (see the module docstring for its files).

    Args:
        run_dir: the run directory.
        policy: name to give the run; default from ``config.json``/``summary.json``/directory name.

    Returns:
        a :class:`RunData`; ``timeline.csv`` is not read yet (only its path is kept).

    Raises:
        InputError: the directory or ``jobs.csv`` is missing, or a file present is malformed.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("run directory does not exist", file=str(run_dir))
    jobs_path = run_dir / JOBS_CSV
    if not jobs_path.is_file():
        raise InputError(f"not a run directory: expected {JOBS_CSV} (plus optional {TIMELINE_CSV}, "
                         f"{SUMMARY_JSON}, {CONFIG_JSON})", file=str(run_dir))
    config = _read_json_object(run_dir / CONFIG_JSON) if (run_dir / CONFIG_JSON).is_file() else {}
    summary = _read_json_object(run_dir / SUMMARY_JSON) if (run_dir / SUMMARY_JSON).is_file() else None
    jobs = _read_jobs(jobs_path)
    timeline = run_dir / TIMELINE_CSV
    return RunData(run_dir=run_dir, policy=policy or _policy_name(config, summary, run_dir),
                   config=config, summary=summary, jobs=jobs,
                   timeline_path=timeline if timeline.is_file() else None)


def load_compare(compare_dir: str | Path) -> tuple[pd.DataFrame, dict[str, RunData]]:
    """Read a comparison directory: ``summary.csv`` and the run directory of each policy.

    Returns:
        (summary table with one row per policy, runs by policy name in display order). A policy whose
        run directory or ``jobs.csv`` is missing is left out of the runs with a :class:`PlotWarning`.

    Raises:
        InputError: ``summary.csv`` is missing, empty, has no ``policy`` column, or a file present is
            malformed.
    """
    compare_dir = Path(compare_dir)
    if not compare_dir.is_dir():
        raise InputError("comparison directory does not exist", file=str(compare_dir))
    path = compare_dir / SUMMARY_CSV
    if not path.is_file():
        raise InputError(f"not a comparison directory: expected {SUMMARY_CSV} and one run directory "
                         f"per policy", file=str(compare_dir))
    summary = _read_csv(path, dtype={"policy": str}, keep_default_na=False, na_values=[""])
    if "policy" not in summary.columns:
        raise InputError("missing column", file=str(path), field="policy")
    if summary["policy"].isna().any():
        pos = int(np.flatnonzero(summary["policy"].isna().to_numpy())[0])
        raise InputError("empty policy name", file=str(path), row=pos + 1, field="policy")
    summary["policy"] = summary["policy"].astype(str)
    if summary["policy"].duplicated().any():
        dup = summary.loc[summary["policy"].duplicated(), "policy"].iloc[0]
        _warn(f"{path}: policy {dup!r} appears more than once; using its first row")
        summary = summary.drop_duplicates("policy", keep="first")
    for col in summary.columns:
        if col != "policy" and col in {m[0] for m in _BAR_METRICS}:
            summary[col] = _numeric(summary, col, path)
    order = fs.policy_order(summary["policy"])
    summary = summary.set_index("policy").loc[order].reset_index()
    runs: dict[str, RunData] = {}
    for pol in order:
        run_dir = compare_dir / pol
        if not (run_dir / JOBS_CSV).is_file():
            _warn(f"{run_dir}: no {JOBS_CSV}; policy {pol!r} is left out of the per-job and "
                  f"time-series figures")
            continue
        runs[pol] = load_run(run_dir, policy=pol)
    return summary, runs


# --------------------------------------------------------------------------------------------
# Time series aggregation
# --------------------------------------------------------------------------------------------

def time_weighted_bins(time_s: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, *,
                       t_end_s: float | None = None,
                       max_bins: int = MAX_POINTS_PER_LINE) -> tuple[np.ndarray, np.ndarray]:
    """Aggregate a piecewise-constant series into at most ``max_bins`` time-weighted bins.

    Row i holds ``values[i]`` from ``time_s[i]`` until ``time_s[i+1]``; the last row holds until
    ``t_end_s`` (default: its own time, i.e. zero length). Rows sharing one time keep only the last
    (the state after that instant); unsorted input is sorted stably by time.

    With at most ``max_bins`` segments the series is returned exactly (segment edges and values).
    Otherwise ``[time_s[0], t_end_s]`` is cut into ``max_bins`` equal bins and each bin gets the
    time-weighted mean of the series over it, so ``sum(means * diff(edges))`` equals the integral of
    the series (e.g. tokens trained, for tokens/s) up to floating-point rounding.

    Args:
        time_s: segment start times (s), finite.
        values: the value over each segment (any unit), finite, same length as ``time_s``.
        t_end_s: end of the last segment (s); values before the last time are raised to it.
        max_bins: most bins to return (>= 1).

    Returns:
        ``(edges_s, means)`` with ``len(edges_s) == len(means) + 1`` (both empty for empty input);
        draw with ``Axes.stairs(means, edges_s)``.

    Raises:
        ValueError: mismatched shapes, non-finite input, or ``max_bins < 1``.
    """
    t = np.asarray(time_s, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.ndim != 1 or v.shape != t.shape:
        raise ValueError(f"time_s and values must be 1-D of one length, got {t.shape} and {v.shape}")
    if max_bins < 1:
        raise ValueError(f"max_bins must be >= 1, got {max_bins}")
    if t.size == 0:
        return np.empty(0), np.empty(0)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(v))):
        raise ValueError("time_s and values must be finite")
    if np.any(t[1:] < t[:-1]):
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    keep = np.empty(t.size, dtype=bool)
    keep[:-1] = t[1:] != t[:-1]
    keep[-1] = True
    t, v = t[keep], v[keep]
    t_end = float(t[-1]) if t_end_s is None else max(float(t_end_s), float(t[-1]))

    if t_end > t[-1]:
        xp = np.append(t, t_end)
        vals = v
    else:  # the last row has zero length: it ends the series
        xp = t
        vals = v[:-1]
        if vals.size == 0:  # one instant only
            return np.array([t[0], t[0]]), v[:1].copy()
    if vals.size <= max_bins:
        return xp.copy(), vals.copy()
    integral = np.concatenate(([0.0], np.cumsum(vals * np.diff(xp))))
    edges = np.linspace(xp[0], xp[-1], max_bins + 1)
    at_edges = np.interp(edges, xp, integral)
    return edges, np.diff(at_edges) / np.diff(edges)


def _read_timeline(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Binned series per available timeline column: {column: (edges_s, means)}."""
    path = run.timeline_path
    assert path is not None
    header = list(_read_csv(path, nrows=0).columns)
    if "time_s" not in header:
        raise InputError("missing column", file=str(path), field="time_s")
    cols = [c for c in _TIMELINE_COLUMNS if c in header]
    missing = [c for c in _TIMELINE_COLUMNS if c not in header]
    if missing:
        _warn(f"{path}: no column(s) {', '.join(missing)}; their figures leave policy "
              f"{run.policy!r} out")
    df = _read_csv(path, usecols=["time_s", *cols])
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if len(df) == 0:
        return out
    t = _numeric(df, "time_s", path)
    if t.isna().any():
        pos = int(np.flatnonzero(t.isna().to_numpy())[0])
        raise InputError("missing time", file=str(path), row=pos + 1, field="time_s")
    t_end = float(t.max())
    end = run.end_time_s()
    if math.isfinite(end):
        t_end = max(t_end, end)
    for col in cols:
        v = _numeric(df, col, path).ffill().fillna(0.0)
        out[col] = time_weighted_bins(t.to_numpy(), v.to_numpy(), t_end_s=t_end)
    return out


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


def _legend(fig, ax, ncol_max: int = 3) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper center", ncol=min(len(handles), ncol_max))


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
        ax.step(x, y, where="post", linewidth=_LW, **styles[pol].line_kwargs())
    if ref_line is not None:
        ax.axvline(ref_line, color="0.5", linewidth=0.5, linestyle=(0, (2, 2)), zorder=0)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(fs.axis_label("CDF", "fraction of jobs"))
    _legend(fig, ax)
    return fig


def jct_cdf_figure(jct_by_policy: Mapping[str, tuple[np.ndarray, int]],
                   styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: CDF of job completion time, log x-axis in hours, one step line per policy.

    Args:
        jct_by_policy: policy -> (finished jobs' JCTs in s, total jobs incl. unfinished).
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(jct_by_policy)
    return _cdf_figure(jct_by_policy, styles, fs.axis_label("Job completion time", "h"), _S_PER_H)


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


def throughput_time_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray]],
                           styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: cluster throughput (tokens/s, SI-prefixed) over time (days), a step line per policy.

    Args:
        series: policy -> (bin edges in s, tokens/s per bin), as from :func:`time_weighted_bins`.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(series)
    peak = max((float(np.max(m)) for _, m in series.values() if m.size), default=0.0)
    factor, prefix = _si_scale(peak)
    fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 2.2)
    ax = fig.add_subplot()
    for pol, (edges, means) in series.items():
        if means.size:
            ax.stairs(means / factor, edges / _S_PER_DAY, baseline=None, linewidth=_LW,
                      **styles[pol].line_kwargs())
    ax.set_ylim(bottom=0)
    ax.set_xlabel(fs.axis_label("Time", "days"))
    ax.set_ylabel(fs.axis_label("Throughput", f"{prefix} tokens/s".lstrip()))
    _legend(fig, ax)
    return fig


def utilization_time_figure(alloc: Mapping[str, tuple[np.ndarray, np.ndarray]],
                            compute: Mapping[str, tuple[np.ndarray, np.ndarray]],
                            styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: GPU allocation utilization (top) and GPU compute utilization (bottom) over time.

    Two panels sharing the time axis (days); utilizations are drawn in % (inputs are fractions 0..1).
    *Allocation* = GPUs held / GPUs in the cluster; *compute* = model FLOP/s / peak FLOP/s.

    Args:
        alloc: policy -> (bin edges in s, allocation fraction per bin); may be empty.
        compute: policy -> (bin edges in s, compute fraction per bin); may be empty.
        styles: from :func:`tlora_sim.sim.report.style.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles([*alloc, *compute])
    fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 3.0)
    ax_a, ax_c = fig.subplots(2, 1, sharex=True)
    for ax, data, title, quantity in (
            (ax_a, alloc, "GPU allocation (GPUs held / GPUs in cluster)", "Allocation util."),
            (ax_c, compute, "GPU compute (model FLOP/s / peak FLOP/s)", "Compute util.")):
        for pol in styles:
            if pol in data and data[pol][1].size:
                edges, means = data[pol]
                ax.stairs(100.0 * means, edges / _S_PER_DAY, baseline=None, linewidth=_LW,
                          **styles[pol].line_kwargs())
        if not data:
            ax.text(0.5, 0.5, "not in timeline", transform=ax.transAxes, ha="center", va="center",
                    color="0.4")
        ax.set_title(title, loc="left", fontsize=7)
        ax.set_ylabel(fs.axis_label(quantity, "%"))
        top = max((100.0 * float(np.max(m)) for _, m in data.values() if m.size), default=100.0)
        ax.set_ylim(0, min(105.0, max(top * 1.1, 1.0)))
    ax_c.set_xlabel(fs.axis_label("Time", "days"))
    _legend(fig, ax_a if alloc else ax_c)
    return fig


def _available_bar_metrics(summary: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """Bar metrics with at least one finite value in ``summary``."""
    out = []
    for m in _BAR_METRICS:
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
    metrics = _available_bar_metrics(summary)
    if not metrics:
        raise ValueError("summary has none of the bar metrics " + ", ".join(m[0] for m in _BAR_METRICS))
    has_base = baseline in table.index
    wide = len(pols) > _BARS_COLUMN_MAX_POLICIES
    if wide:  # many policies: one row of panels at full text width, legend below
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.5)
        axes = np.atleast_1d(fig.subplots(1, len(metrics))).ravel()
    else:
        fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 3.1)
        axes = fig.subplots(2, 3).ravel()
    x = np.arange(len(pols))
    for ax, (col, title, better, quantity) in zip(axes, metrics):
        vals = np.array([float(table.at[p, col]) for p in pols], dtype=float)
        base = float(table.at[baseline, col]) if has_base else math.nan
        normalised = has_base and math.isfinite(base) and base != 0.0
        if normalised:
            shown = vals / base
            ylabel = fs.axis_label("Ratio", f"\u00d7 {baseline}")
            fmt = "{:.2f}"
        elif col.endswith("_jct_s"):
            shown, ylabel, fmt = vals / _S_PER_H, fs.axis_label(quantity, "h"), "{:.3g}"
        elif col.endswith("_util"):
            shown, ylabel, fmt = 100.0 * vals, fs.axis_label(quantity, "%"), "{:.1f}"
        else:
            finite = vals[np.isfinite(vals)]
            factor, prefix = _si_scale(float(np.max(finite)) if finite.size else 0.0)
            shown, ylabel, fmt = vals / factor, fs.axis_label(quantity, f"{prefix} tok/s".lstrip()), "{:.3g}"
        if has_base and not normalised:
            _warn(f"bars: {baseline!r} has {col} = {base}; panel {title!r} shows raw values")
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


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def _check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f]
    fmts = tuple(dict.fromkeys(str(f).lower().lstrip(".") for f in formats))
    if not fmts:
        raise InputError("no figure format given", field="formats")
    for fmt in fmts:
        if fmt not in fs.SUPPORTED_FORMATS:
            raise InputError(f"unsupported figure format {fmt!r}; expected some of "
                             f"{', '.join(fs.SUPPORTED_FORMATS)}", field="formats")
    return fmts


def _plot_all(where: Path, runs: Mapping[str, RunData], summary: pd.DataFrame | None,
              formats: tuple[str, ...]) -> list[Path]:
    out_dir = where / FIGURES_DIR
    names = list(runs) + (list(summary["policy"]) if summary is not None else [])
    styles = fs.policy_styles(names)
    ordered = [p for p in styles if p in runs]
    written: list[Path] = []

    def save(fig, name: str) -> None:
        written.extend(fs.save_figure(fig, out_dir, name, formats))

    with fs.style_context():
        # Per-job distributions.
        jct = {p: runs[p].jct_s() for p in ordered}
        jct = {p: s for p, s in jct.items() if np.any(s[0] > 0)}
        if jct:
            save(jct_cdf_figure(jct, styles), "jct_cdf")
        else:
            _warn(f"{where}: no finished job with a JCT; skipping figure 'jct_cdf'")

        slow = {}
        for p in ordered:
            s = runs[p].slowdown()
            if s is None:
                _warn(f"{runs[p].run_dir / JOBS_CSV}: no slowdown (or isolated_runtime_s) column; "
                      f"'slowdown_cdf' leaves policy {p!r} out")
            elif np.any(s[0] > 0):
                slow[p] = s
        if slow:
            save(slowdown_cdf_figure(slow, styles), "slowdown_cdf")
        else:
            _warn(f"{where}: no job with a slowdown; skipping figure 'slowdown_cdf'")

        # Time series.
        series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {c: {} for c in _TIMELINE_COLUMNS}
        for p in ordered:
            run = runs[p]
            if run.timeline_path is None:
                _warn(f"{run.run_dir}: no {TIMELINE_CSV}; time-series figures leave policy {p!r} out")
                continue
            for col, binned in _read_timeline(run).items():
                series[col][p] = binned
        if series["tokens_per_s"]:
            save(throughput_time_figure(series["tokens_per_s"], styles), "throughput_time")
        else:
            _warn(f"{where}: no timeline with tokens_per_s; skipping figure 'throughput_time'")
        if series["gpu_alloc_util"] or series["gpu_compute_util"]:
            save(utilization_time_figure(series["gpu_alloc_util"], series["gpu_compute_util"], styles),
                 "utilization_time")
        else:
            _warn(f"{where}: no timeline with gpu_alloc_util or gpu_compute_util; skipping figure "
                  f"'utilization_time'")

        # Summary bars.
        if summary is None:
            _warn(f"{where}: no {SUMMARY_JSON}; skipping figure 'bars'")
        elif not _available_bar_metrics(summary):
            _warn(f"{where}: summary has no value for any of "
                  f"{', '.join(m[0] for m in _BAR_METRICS)}; skipping figure 'bars'")
        else:
            save(bars_figure(summary, styles), "bars")
    return written


def plot_run(run_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw the figures of one run directory into ``run_dir/figures/``.

    Reads ``jobs.csv`` (required), ``timeline.csv``, ``summary.json``, ``config.json`` (optional: a
    missing one skips the figures that need it with a :class:`PlotWarning`). Writes each figure of
    :data:`FIGURE_NAMES` it can draw as ``<name>.<format>``, atomically; one line per figure (the run's
    policy). The ``bars`` figure shows the run's own summary values (no baseline in a single run).

    Args:
        run_dir: the run directory.
        formats: figure formats, among ``png`` (200 dpi), ``pdf``, ``svg``.

    Returns:
        the written files, in :data:`FIGURE_NAMES` order, each in the order of ``formats``.

    Raises:
        InputError: the directory or ``jobs.csv`` is missing, a file is malformed, or a format is
            unknown.
    """
    fmts = _check_formats(formats)
    run = load_run(run_dir)
    summary = None
    if run.summary is not None:
        row = {k: v for k, v in run.summary.items() if not isinstance(v, (dict, list))}
        row["policy"] = run.policy
        summary = pd.DataFrame([row])
        for col in (m[0] for m in _BAR_METRICS):
            if col in summary:
                summary[col] = pd.to_numeric(summary[col], errors="coerce")
    return _plot_all(Path(run_dir), {run.policy: run}, summary, fmts)


def plot_compare(compare_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw the comparison figures of a comparison directory into ``compare_dir/figures/``.

    Reads ``summary.csv`` (required; one row per policy) and each policy's run directory
    ``compare_dir/<policy>/`` (``jobs.csv``, ``timeline.csv``). One line (or bar) per policy, in the
    fixed policy order and colours of :mod:`tlora_sim.sim.report.style`; the ``bars`` figure is normalised to
    ``independent`` when that policy is present. A policy without a run directory is left out of the
    per-job and time-series figures with a :class:`PlotWarning`.

    Args:
        compare_dir: the comparison directory.
        formats: figure formats, among ``png`` (200 dpi), ``pdf``, ``svg``.

    Returns:
        the written files, in :data:`FIGURE_NAMES` order, each in the order of ``formats``.

    Raises:
        InputError: the directory or ``summary.csv`` is missing, a file is malformed, or a format is
            unknown.
    """
    fmts = _check_formats(formats)
    summary, runs = load_compare(compare_dir)
    return _plot_all(Path(compare_dir), runs, summary, fmts)


# --------------------------------------------------------------------------------------------
# Relative table (the numbers behind the bars figure)
# --------------------------------------------------------------------------------------------

#: Columns of :func:`relative_table` after ``policy``: (name, summary column, "x" = policy / baseline
#: or "speedup" = baseline / policy).
RELATIVE_COLUMNS = (
    ("throughput_x", "throughput_tokens_per_s", "x"),
    ("avg_jct_speedup", "avg_jct_s", "speedup"),
    ("p90_jct_speedup", "p90_jct_s", "speedup"),
    ("alloc_util_x", "gpu_alloc_util", "x"),
    ("compute_util_x", "gpu_compute_util", "x"),
)


def relative_table(summary: pd.DataFrame, baseline: str = BASELINE_POLICY) -> pd.DataFrame:
    """Return each policy's figures relative to ``baseline``, one row per policy in display order.

    Columns: ``policy``, then :data:`RELATIVE_COLUMNS` whose summary column is present:
    ``throughput_x``, ``alloc_util_x``, ``compute_util_x`` (policy / baseline: above 1 is better)
    and ``avg_jct_speedup``, ``p90_jct_speedup`` (baseline / policy: above 1 is better, the
    papers' "JCT x times better"). Dimensionless; NaN where a value is missing or the denominator
    is 0. ``bench/policy_study.py`` and ``bench/sensitivity.py`` take their ratios from here; the
    ``bars`` figure shows the same ones (its JCT panels the inverse, policy / baseline).

    Args:
        summary: a comparison's ``summary.csv`` as a DataFrame (see :func:`load_compare`).
        baseline: the policy the ratios are taken to.

    Raises:
        InputError: no ``policy`` column, or ``baseline`` is not one of the policies.
    """
    if "policy" not in summary.columns:
        raise InputError("missing column", field="policy")
    pols = [str(p) for p in summary["policy"]]
    if baseline not in pols:
        raise InputError(f"baseline policy {baseline!r} is not in the summary (policies: "
                         f"{', '.join(pols)})", field="policy")
    table = summary.assign(policy=pols).drop_duplicates("policy").set_index("policy")
    order = fs.policy_order(pols)
    out = pd.DataFrame({"policy": order})
    for name, col, kind in RELATIVE_COLUMNS:
        if col not in table.columns:
            continue
        vals = pd.to_numeric(table[col], errors="coerce").reindex(order).to_numpy(dtype=float)
        base = float(pd.to_numeric(pd.Series([table.at[baseline, col]]), errors="coerce").iloc[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = vals / base if kind == "x" else base / vals
        out[name] = np.where(np.isfinite(ratio), ratio, np.nan)
    return out


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


def trace_load(spec: str) -> tuple[float, int] | None:
    """Offered load of a trace spec: ``(load, reference GPUs)``, or ``None`` when the spec has none.

    Only ``synthetic:`` specs carry a load: their ``load=`` option (default 0.7) is the offered GPU
    demand as a fraction of a ``gpus=``-GPU cluster (default 32), see :mod:`tlora_sim.traces.synthetic`.
    Real traces (``itp:``, ``philly:`` ...) return ``None``: their load is whatever they hold.

    Raises:
        InputError: a synthetic spec with a malformed option (field = the option).
    """
    fmt, _, arg = str(spec).partition(":")
    if fmt.strip().lower() != "synthetic":
        return None
    from tlora_sim.traces.synthetic import parse_options

    opts = parse_options(arg)
    return float(opts["load"]), int(opts["gpus"])


def _trace_without_load(spec: str) -> str:
    """A canonical form of ``spec`` with its load left out (what a load sweep keeps fixed)."""
    fmt, _, arg = str(spec).partition(":")
    if fmt.strip().lower() != "synthetic":
        return str(spec)
    from tlora_sim.traces.synthetic import parse_options

    opts = {k: v for k, v in parse_options(arg).items() if k != "load"}
    return "synthetic:" + ",".join(f"{k}={opts[k]}" for k in sorted(opts))


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
    or its name; values: offered load as a fraction of the cluster's GPUs), else from the trace
    spec of its policy runs (``config.json`` ``inputs.trace``, else ``summary.csv`` ``trace``):
    ``load x gpus / cluster GPUs`` for a ``synthetic:...,load=L,gpus=G`` spec replayed on the
    comparison's cluster (``config.json`` ``inputs.cluster``), i.e. the spec's ``load`` itself when
    the cluster has the ``G`` GPUs the spec was sized for.

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
        InputError: a directory is not a comparison, a file is malformed, the policies of one
            comparison disagree on the trace, or no load sweep remains.
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
        cluster_gpus = math.nan
        if cluster is not None:
            from tlora_sim.sim.core.cluster import parse_cluster

            try:
                cluster_gpus = float(parse_cluster(str(cluster)).total_gpus)
            except InputError as err:
                raise InputError(err.message, file=str(d), field="cluster") from None
        try:
            tl = trace_load(spec) if spec is not None else None
        except InputError as err:
            raise InputError(f"trace spec {spec!r}: {err.message}", file=str(d), field=err.field) from None
        if loads is not None:
            offered = _lookup_load(loads, d)
            if offered is None:
                raise InputError("no load given for this comparison directory", file=str(d), field="loads")
            context = "explicit"
        else:
            if tl is None:
                _warn(f"{d}: trace {spec!r} has no load= option (only synthetic traces do); left out of "
                      f"the queueing-delay-against-load figure (pass loads= to give it one)")
                continue
            offered = tl[0] * tl[1] / cluster_gpus if cluster_gpus > 0 else tl[0]
            fixed = {k: v for k, v in first_in.items() if k not in ("policy", "policy_options", "trace")}
            if not first_in and "seed" in summary.columns:
                fixed = {"seed": str(summary["seed"].iloc[0])}
            fixed["cluster"] = cluster
            fixed["trace"] = _trace_without_load(spec)
            context = json.dumps(fixed, sort_keys=True, default=str)
        contexts[d] = context
        for _, srow in summary.iterrows():
            pol = str(srow["policy"])
            q = np.empty(0)
            if pol in runs:
                jobs = runs[pol].jobs
                path = runs[pol].run_dir / JOBS_CSV
                if "queue_s" in jobs.columns:
                    q = _numeric(jobs, "queue_s", path).to_numpy(dtype=float)
                elif {"start_time_s", "submit_time_s"} <= set(jobs.columns):
                    q = (_numeric(jobs, "start_time_s", path) - jobs["submit_time_s"]).to_numpy(dtype=float)
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
            _warn(f"{', '.join(members)}: no other comparison differs from it only in the load; left "
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
    if max_s >= 2 * _S_PER_H:
        return _S_PER_H, "h"
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
            ax.plot(sub["load"].astype(float), y, marker=st.marker, linewidth=_LW, markersize=3.5,
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
    _legend(fig, axes[0])
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
    fmts = _check_formats(formats)
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


def plot_any(path: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw the figures of ``path``, a comparison directory or a run directory, and return the files.

    A directory with ``summary.csv`` is a comparison (:func:`plot_compare`); otherwise one with
    ``jobs.csv`` is a run (:func:`plot_run`); otherwise one holding two or more comparison
    directories (e.g. ``runs/sensitivity`` of ``bench/sensitivity.py``) gets the figures across
    them, queueing delay against offered load (:func:`plot_queue_vs_load`, into ``path/figures/``;
    each comparison's own figures are redrawn with ``plot_any(path / name)``).

    Raises:
        InputError: ``path`` is not a directory, or holds neither ``summary.csv`` nor ``jobs.csv``
            nor two comparison directories; or any error of the function it dispatches to.
    """
    path = Path(path)
    if not path.is_dir():
        raise InputError("not a directory; expected a run directory (with jobs.csv) or a comparison "
                         "directory (with summary.csv and one run directory per policy)",
                         file=str(path))
    if (path / SUMMARY_CSV).is_file():
        return plot_compare(path, formats)
    if (path / JOBS_CSV).is_file():
        return plot_run(path, formats)
    if len(find_compare_dirs(path)) >= 2:
        return plot_queue_vs_load(path, formats=formats)
    raise InputError("neither a run directory (expected jobs.csv, timeline.csv, summary.json, "
                     "config.json) nor a comparison directory (expected summary.csv and one run "
                     "directory per policy) nor a directory of two or more comparison directories",
                     file=str(path))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m tlora_sim.sim.report.plots DIR [--formats png,pdf]``; prints the written files.

    Returns the exit status: 0 on success, 2 on an :class:`InputError` (printed as one line).
    """
    parser = argparse.ArgumentParser(prog="python -m tlora_sim.sim.report.plots",
                                     description="Re-draw the figures of a run or comparison directory.")
    parser.add_argument("directory", help="run directory (jobs.csv ...), comparison directory "
                                          "(summary.csv + one run directory per policy), or a directory "
                                          "of comparison directories (queueing delay against load)")
    parser.add_argument("--formats", default="png,pdf", help="comma-separated: png, pdf, svg")
    args = parser.parse_args(argv)
    return fs.run_figure_command(lambda: plot_any(args.directory, args.formats), PlotWarning)


if __name__ == "__main__":
    sys.exit(main())
