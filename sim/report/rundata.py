"""Reading run and comparison directories for the figures: ``RunData``, ``load_run``,
``load_compare``, the checks every figure relies on (files present, columns numeric), and the
time-weighted binning of piecewise-constant timelines. File names come from here; the figure
modules never open a file themselves."""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError


#: Base names of the figures, in the order they are drawn (files are ``<name>.<format>``).
FIGURE_NAMES = ("jct_cdf", "slowdown_cdf", "throughput_time", "utilization_time", "bars")
#: A comparison also draws the speed-up figure (against its reference).
COMPARE_FIGURE_NAMES = FIGURE_NAMES + ("speedup",)
#: Most points drawn per line (CDF points or time bins).
MAX_POINTS_PER_LINE = 2000

JOBS_CSV = RunDir.JOBS
TIMELINE_CSV = RunDir.TIMELINE
SUMMARY_JSON = RunDir.SUMMARY
CONFIG_JSON = RunDir.CONFIG
SUMMARY_CSV = RunDir.COMPARE_SUMMARY
FIGURES_DIR = RunDir.FIGURES

REFERENCE_POLICY = "independent-backfill"
"""The reference baseline of every comparison (every job alone, FIFO with EASY backfilling):
what ``compare`` and ``sweep`` add when absent, what speed-ups and ratios are taken against."""
BASELINE_POLICY = REFERENCE_POLICY  # the older name
#: The ``timeline.csv`` columns the time-series figures draw.
TIMELINE_COLUMNS = ("tokens_per_s", "gpu_alloc_util", "gpu_compute_util")

#: The summary bars: (summary column, panel title, better direction, raw-value label quantity).
BAR_METRICS = (
    ("avg_jct_s", "Avg JCT", "lower", "JCT"),
    ("p90_jct_s", "p90 JCT", "lower", "JCT"),
    ("throughput_tokens_per_s", "Throughput", "higher", "Rate"),
    ("gpu_alloc_util", "Alloc. util.", "higher", "Util."),
    ("gpu_compute_util", "Compute util.", "higher", "Util."),
)


class PlotWarning(UserWarning):
    """A figure (or one policy's line in it) was skipped because optional data is missing."""


def warn_skipped(msg: str) -> None:
    """Warn (:class:`PlotWarning`) that a figure or a policy's line in it is skipped; the warning
    names the caller of the function that calls this."""
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


def numeric_column(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    """Column ``col`` of ``df`` (read from ``path``) as float64, blank cells NaN.

    Raises:
        InputError: a non-numeric cell, naming the file, its row (1-based, after the header) and field.
    """
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
            jobs[col] = numeric_column(jobs, col, path)
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
    if config and summary:  # both files of one run: they name the same policy, trace and seed
        inputs = config.get("inputs") if isinstance(config.get("inputs"), dict) else config
        for key in ("policy", "trace", "seed"):
            a, b = inputs.get(key), summary.get(key)
            if a is not None and b is not None and isinstance(a, (str, int)) and a != b:
                raise InputError(f"{b!r} here, but {CONFIG_JSON} says {a!r}: the directory mixes files of "
                                 f"different runs", file=str(run_dir / SUMMARY_JSON), field=key)
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
        warn_skipped(f"{path}: policy {dup!r} appears more than once; using its first row")
        summary = summary.drop_duplicates("policy", keep="first")
    for col in summary.columns:
        if col != "policy" and col in {m[0] for m in BAR_METRICS}:
            summary[col] = numeric_column(summary, col, path)
    order = fs.policy_order(summary["policy"])
    summary = summary.set_index("policy").loc[order].reset_index()
    runs: dict[str, RunData] = {}
    for pol in order:
        run_dir = compare_dir / pol
        if not (run_dir / JOBS_CSV).is_file():
            warn_skipped(f"{run_dir}: no {JOBS_CSV}; policy {pol!r} is left out of the per-job and "
                  f"time-series figures")
            continue
        runs[pol] = load_run(run_dir, policy=pol)
    check_one_comparison(compare_dir, summary, runs)
    return summary, runs


IDENTITY_SKIP = ("policy", "policy_options")
"""``config.json`` ``inputs`` that differ between the runs of one comparison (all else is shared)."""

ROW_CHECKED = ("jobs", "avg_jct_s", "p90_jct_s", "makespan_s")
"""``summary.csv`` fields that must equal the policy's own ``summary.json`` (same run, same bytes)."""


def run_identity(config: dict) -> dict:
    """The inputs a run shares with every other run of its comparison: ``config.json``'s
    ``inputs`` without ``IDENTITY_SKIP`` ({} for a config without ``inputs``)."""
    inputs = config.get("inputs") if isinstance(config, dict) else None
    if not isinstance(inputs, dict):
        return {}
    return {k: v for k, v in inputs.items() if k not in IDENTITY_SKIP}


def check_one_comparison(compare_dir: Path, summary: pd.DataFrame, runs: dict[str, RunData]) -> None:
    """Refuse a comparison directory whose parts come from different runs: the policies' run
    directories must share their inputs (:func:`run_identity`: trace, cluster, seed, LoRA
    distribution, regroup pause, cost model, ...), and each ``summary.csv`` row must agree with
    that policy's ``summary.json`` on ``ROW_CHECKED``.

    Raises:
        InputError: naming the ``config.json`` and the first input that differs, or the
            ``summary.csv`` row and field that disagree.
    """
    import json
    import math

    first_pol, first_id = None, None
    for pol, run in runs.items():
        ident = run_identity(run.config)
        if not ident:
            continue
        if first_id is None:
            first_pol, first_id = pol, ident
            continue
        for key in sorted(set(first_id) | set(ident)):
            a, b = first_id.get(key), ident.get(key)
            if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
                raise InputError(f"this policy's run comes from a different run than {first_pol!r}'s "
                                 f"({key} {b!r} vs {a!r}); the directory mixes runs: redo the comparison",
                                 file=str(run.run_dir / CONFIG_JSON), field=f"inputs.{key}")
    path = Path(compare_dir) / SUMMARY_CSV
    for i, row in enumerate(summary.to_dict("records")):
        run = runs.get(row["policy"])
        if run is None or not isinstance(run.summary, dict):
            continue
        for key in ROW_CHECKED:
            if key not in row or key not in run.summary:
                continue
            try:
                a, b = float(row[key]), float(run.summary[key])
            except (TypeError, ValueError):
                continue
            if math.isfinite(a) and math.isfinite(b) and not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
                raise InputError(f"{a!r} here, but {run.run_dir / SUMMARY_JSON} says {b!r}: the policy's "
                                 f"directory comes from another run; redo the comparison", file=str(path),
                                 row=i + 1, field=key)


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


def read_timeline(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The run's ``timeline.csv`` binned per available :data:`TIMELINE_COLUMNS` column:
    ``{column: (edges_s, means)}`` (:func:`time_weighted_bins`; the series end at the later of the
    last row and the last job's finish). A missing column is left out with a :class:`PlotWarning`.

    Raises:
        InputError: no ``time_s`` column, a missing time, or a non-numeric cell.
    """
    path = run.timeline_path
    assert path is not None
    header = list(_read_csv(path, nrows=0).columns)
    if "time_s" not in header:
        raise InputError("missing column", file=str(path), field="time_s")
    cols = [c for c in TIMELINE_COLUMNS if c in header]
    missing = [c for c in TIMELINE_COLUMNS if c not in header]
    if missing:
        warn_skipped(f"{path}: no column(s) {', '.join(missing)}; their figures leave policy "
              f"{run.policy!r} out")
    df = _read_csv(path, usecols=["time_s", *cols])
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if len(df) == 0:
        return out
    t = numeric_column(df, "time_s", path)
    if t.isna().any():
        pos = int(np.flatnonzero(t.isna().to_numpy())[0])
        raise InputError("missing time", file=str(path), row=pos + 1, field="time_s")
    t_end = float(t.max())
    end = run.end_time_s()
    if math.isfinite(end):
        t_end = max(t_end, end)
    for col in cols:
        v = numeric_column(df, col, path).ffill().fillna(0.0)
        out[col] = time_weighted_bins(t.to_numpy(), v.to_numpy(), t_end_s=t_end)
    return out




def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    """The figure formats asked for (a list or a comma-separated string), lower-case, without dots
    or repeats, in order.

    Raises:
        InputError: none given, or one not in ``style.SUPPORTED_FORMATS`` (field ``formats``).
    """
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


#: Candidate smoothing windows of the time-series figures (s): 1 min ... 7 days.
SMOOTH_WINDOWS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 2 * 3600.0, 6 * 3600.0, 12 * 3600.0, 86400.0,
                    2 * 86400.0, 7 * 86400.0)
#: About this many windows across a time-series figure.
SMOOTH_TARGET_WINDOWS = 60


def smoothing_window(span_s: float) -> float:
    """The smoothing window of a time series spanning ``span_s`` seconds: the smallest of
    :data:`SMOOTH_WINDOWS_S` that gives at most :data:`SMOOTH_TARGET_WINDOWS` windows (s)."""
    for w in SMOOTH_WINDOWS_S:
        if span_s / w <= SMOOTH_TARGET_WINDOWS:
            return w
    return SMOOTH_WINDOWS_S[-1]


def window_means(edges_s: np.ndarray, means: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Time-weighted means of a piecewise-constant series over consecutive ``window_s`` windows
    from ``edges_s[0]`` (the last window ends at ``edges_s[-1]``, so it may be shorter).

    Exact for the series given (its integral over each window divided by the window's length), so
    the integral over the whole span is kept.

    Returns:
        ``(window_edges_s, window_means)``, ``len(edges) == len(means) + 1``; empty for empty input.

    Raises:
        ValueError: ``window_s <= 0``.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    e = np.asarray(edges_s, dtype=float)
    m = np.asarray(means, dtype=float)
    if m.size == 0 or e[-1] <= e[0]:
        return e.copy(), m.copy()
    integral = np.concatenate(([0.0], np.cumsum(m * np.diff(e))))
    n = int(math.ceil((e[-1] - e[0]) / window_s - 1e-9))
    new = np.minimum(e[0] + window_s * np.arange(n + 1), e[-1])
    new[-1] = e[-1]
    at = np.interp(new, e, integral)
    with np.errstate(divide="ignore", invalid="ignore"):
        return new, np.diff(at) / np.diff(new)


def window_label(window_s: float) -> str:
    """``6 h``, ``1 day``, ``15 min``: a smoothing window in words."""
    if window_s >= 86400 and window_s % 86400 == 0:
        d = int(window_s // 86400)
        return f"{d} day" + ("s" if d > 1 else "")
    if window_s >= 3600 and window_s % 3600 == 0:
        return f"{int(window_s // 3600)} h"
    return f"{window_s / 60:g} min"
