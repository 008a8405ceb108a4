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

CDFs count every job in ``jobs.csv`` in the denominator, so a policy that leaves jobs unfinished
(empty ``jct_s``) tops out below 1. Time series are piecewise constant (each ``timeline.csv`` row holds
from its ``time_s`` to the next row's); lines with more than :data:`MAX_POINTS_PER_LINE` segments are
aggregated into equal-width bins by time-weighted averaging (:func:`time_weighted_bins`), which keeps
the integral (e.g. the tokens trained) exact, so million-row timelines plot in about a second.

A missing optional input skips the figures that need it with a :class:`PlotWarning`; a missing
required input, or a malformed file, raises :class:`sim.errors.InputError` naming the file.

matplotlib is used without pyplot (:class:`matplotlib.figure.Figure` only), so no display is needed
and the global backend is never changed. Command line: ``python -m sim.plots DIR [--formats png,pdf]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from sim import figstyle as fs
from sim.errors import InputError

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
        styles: from :func:`sim.figstyle.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(jct_by_policy)
    return _cdf_figure(jct_by_policy, styles, fs.axis_label("Job completion time", "h"), _S_PER_H)


def slowdown_cdf_figure(slowdown_by_policy: Mapping[str, tuple[np.ndarray, int]],
                        styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: CDF of per-job slowdown (JCT / isolated runtime), log x-axis, one line per policy.

    Args:
        slowdown_by_policy: policy -> (finished jobs' slowdowns, total jobs incl. unfinished).
        styles: from :func:`sim.figstyle.policy_styles` (default: from the policies given).
    """
    styles = styles or fs.policy_styles(slowdown_by_policy)
    return _cdf_figure(slowdown_by_policy, styles,
                       fs.axis_label("Slowdown", "\u00d7 isolated runtime"), 1.0, ref_line=1.0)


def throughput_time_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray]],
                           styles: Mapping[str, fs.PolicyStyle] | None = None):
    """Figure: cluster throughput (tokens/s, SI-prefixed) over time (days), a step line per policy.

    Args:
        series: policy -> (bin edges in s, tokens/s per bin), as from :func:`time_weighted_bins`.
        styles: from :func:`sim.figstyle.policy_styles` (default: from the policies given).
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
        styles: from :func:`sim.figstyle.policy_styles` (default: from the policies given).
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

    When ``baseline`` is one of the policies, each panel shows the ratio to it (unit "x baseline",
    dashed line at 1; a metric whose baseline value is 0 or missing falls back to raw values); else
    raw values: JCT in hours, throughput in SI-prefixed tokens/s, utilizations in %. Each bar is
    annotated with its value; arrows in the titles say whether lower or higher is better.

    Args:
        summary: one row per policy with a ``policy`` column and the columns of
            ``summary.csv`` (``avg_jct_s``, ``p90_jct_s``, ``throughput_tokens_per_s``,
            ``gpu_alloc_util``, ``gpu_compute_util``); metrics missing or with no finite value are
            left out.
        styles: from :func:`sim.figstyle.policy_styles` (default: from the policies given).
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
                        fontsize=5.5)
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
    legend_ax = axes[-1] if len(metrics) < len(axes) else None
    note = "\u2193 lower / \u2191 higher is better"
    if legend_ax is not None:
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
    fixed policy order and colours of :mod:`sim.figstyle`; the ``bars`` figure is normalised to
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


def plot_any(path: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw the figures of ``path``, a comparison directory or a run directory, and return the files.

    A directory with ``summary.csv`` is a comparison (:func:`plot_compare`); otherwise one with
    ``jobs.csv`` is a run (:func:`plot_run`).

    Raises:
        InputError: ``path`` is not a directory, or holds neither ``summary.csv`` nor ``jobs.csv``;
            or any error of the function it dispatches to.
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
    raise InputError("neither a run directory (expected jobs.csv, timeline.csv, summary.json, "
                     "config.json) nor a comparison directory (expected summary.csv and one run "
                     "directory per policy)", file=str(path))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m sim.plots DIR [--formats png,pdf]``; prints the written files.

    Returns the exit status: 0 on success, 2 on an :class:`InputError` (printed as one line).
    """
    parser = argparse.ArgumentParser(prog="python -m sim.plots",
                                     description="Re-draw the figures of a run or comparison directory.")
    parser.add_argument("directory", help="run directory (jobs.csv ...) or comparison directory "
                                          "(summary.csv + one run directory per policy)")
    parser.add_argument("--formats", default="png,pdf", help="comma-separated: png, pdf, svg")
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", PlotWarning)
            warnings.showwarning = _show_warning
            paths = plot_any(args.directory, args.formats)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
