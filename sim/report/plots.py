"""Paper-style figures drawn only from the files of a run directory or a comparison directory.

Every figure is re-drawn from what the simulator wrote, so any run can be re-plotted later:

* a **run directory** ``RUN/`` holds ``jobs.csv`` (required), ``timeline.csv``, ``summary.json`` and
  ``config.json`` (optional); figures go to ``RUN/figures/``;
* a **comparison directory** ``OUT/`` holds ``summary.csv`` (required; one row per policy) and one run
  directory per policy, ``OUT/<policy>/``; figures go to ``OUT/figures/``.

Figures (each written as ``<name>.png`` at 200 dpi and ``<name>.pdf``, see :data:`rundata.FIGURE_NAMES`):

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
    ratios to the reference ``independent-backfill`` when it is in the summary, raw values otherwise.
``speedup``
    The paper-style figure: each policy's speed-up over the reference (avg JCT, p90 JCT, makespan:
    reference / policy; throughput: policy / reference), grouped bars with their values, a line at 1.

Across several comparison directories (a directory of them, e.g. ``runs/sensitivity``), figures go
to ``DIR/figures/``:

``queue_vs_load``
    Average and p90 queueing delay (first start - submit) against offered load (GPU demand / cluster
    GPUs, from the synthetic traces' ``load=`` option or given explicitly), a line per policy
    (:func:`load_sweep.plot_queue_vs_load`).

:func:`relative_table` gives the numbers behind ``bars`` (ratios to the reference baseline
``independent-backfill``, :data:`rundata.REFERENCE_POLICY`) as a table.

CDFs count every job in ``jobs.csv`` in the denominator, so a policy that leaves jobs unfinished
(empty ``jct_s``) tops out below 1. Time series are piecewise constant (each ``timeline.csv`` row holds
from its ``time_s`` to the next row's); lines with more than :data:`rundata.MAX_POINTS_PER_LINE` segments are
aggregated into equal-width bins by time-weighted averaging (:func:`rundata.time_weighted_bins`), which keeps
the integral (e.g. the tokens trained) exact, so million-row timelines plot in about a second.

A missing optional input skips the figures that need it with a :class:`rundata.PlotWarning`; a missing
required input, or a malformed file, raises :class:`tlora_sim.traces.errors.InputError` naming the file.

Reading the directories is :mod:`rundata`'s, drawing each figure :mod:`figures`' and
:mod:`load_sweep`'s; this module writes them.

matplotlib is used without pyplot (:class:`matplotlib.figure.Figure` only), so no display is needed
and the global backend is never changed. Command line: ``python -m tlora_sim.sim.report.plots DIR [--formats png,pdf]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report.tables import SPEEDUP_COLUMNS, policies_holding, ratio_to
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.report.rundata import REFERENCE_POLICY, BASELINE_POLICY, FIGURES_DIR, JOBS_CSV, PlotWarning, RunData, SUMMARY_CSV, SUMMARY_JSON, TIMELINE_CSV, BAR_METRICS, TIMELINE_COLUMNS, check_formats, read_timeline, warn_skipped, load_compare, load_run
from tlora_sim.sim.report.figures import speedup_figure, available_bar_metrics, bars_figure, jct_cdf_figure, slowdown_cdf_figure, throughput_time_figure, utilization_time_figure
from tlora_sim.sim.report.load_sweep import find_compare_dirs, plot_queue_vs_load

__all__ = [
    "plot_run",
    "plot_compare",
    "plot_any",
    "RELATIVE_COLUMNS",
    "relative_table",
]

# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def figure_footer(runs: list[RunData]) -> str:
    """What a reader of the figure needs to know it: trace, cluster, seed(s), jobs kept; then the
    reference and discipline, the cost model and the share of GPU-time on extrapolated step times."""
    if not runs:
        return ""
    cfg = runs[0].config or {}
    trace = str(cfg.get("trace", ""))
    if len(trace) > 40 and "/" in trace:  # a file: its format and name say which
        fmt, _, arg = trace.partition(":")
        trace = f"{fmt}:.../{Path(arg).name}"
    trace = trace if len(trace) <= 60 else "..." + trace[-57:]
    seeds = sorted({r.config.get("seed") for r in runs if r.config and r.config.get("seed") is not None})
    kept = sorted({(r.summary or {}).get("kept_jobs") for r in runs} - {None})
    inputs = sorted({(r.summary or {}).get("input_jobs") for r in runs} - {None})
    parts = [trace, str(cfg.get("cluster", ""))]
    if seeds:
        parts.append("seed " + ",".join(map(str, seeds)))
    if kept:
        of = f" of {inputs[-1]}" if inputs else ""
        parts.append(f"{kept[0]}{of} jobs kept" if len(kept) == 1 else f"{kept[0]}-{kept[-1]}{of} jobs kept")
    line2 = []
    ref = cfg.get("reference")
    if ref:
        line2.append(f"reference {ref}")
    disc = cfg.get("discipline")
    if isinstance(disc, dict) and disc.get("name"):
        backfills = sorted({str((r.config.get("discipline") or {}).get("backfill")) for r in runs if r.config})
        line2.append(f"discipline {disc['name']} (backfill {'/'.join(backfills)})")
    model = next(((r.summary or {}).get("cost_model") for r in runs if (r.summary or {}).get("cost_model")), None)
    if model:
        line2.append(f"cost model {model}")
    shares = [float((r.summary or {})["extrapolated_gpu_time_share_total"]) for r in runs
              if (r.summary or {}).get("extrapolated_gpu_time_share_total") is not None]
    if shares:
        lo, hi = round(100 * min(shares)), round(100 * max(shares))
        line2.append(f"{lo}% of GPU-time extrapolated" if lo == hi else f"{lo}-{hi}% of GPU-time extrapolated")
    return fs.wrap_footer([p for p in parts if p] + line2)


def parse_size(text: str | None) -> tuple[float, float] | None:
    """``WxH`` in inches (``7x3``, ``3.4x2.2``) -> (width, height); None for None.

    Raises:
        InputError: not two positive numbers, or beyond 30 in.
    """
    if text is None:
        return None
    w, sep, h = str(text).lower().partition("x")
    try:
        size = (float(w), float(h))
    except ValueError:
        size = None
    if not sep or size is None or not all(0 < v <= 30 for v in size):
        raise InputError(f"expected WIDTHxHEIGHT in inches (e.g. 7x3), got {text!r}", field="--size")
    return size


def _plot_all(where: Path, runs: Mapping[str, RunData], summary: pd.DataFrame | None,
              formats: tuple[str, ...], policies: Sequence[str] | None = None,
              metrics: Sequence[str] | None = None, size: tuple[float, float] | None = None,
              only: Sequence[str] | None = None) -> list[Path]:
    out_dir = where / FIGURES_DIR
    names = list(runs) + (list(summary["policy"]) if summary is not None else [])
    reference = REFERENCE_POLICY
    if summary is not None and "reference" in summary.columns and summary["reference"].notna().any():
        reference = str(summary["reference"].dropna().iloc[0])
    if summary is not None and reference in set(summary["policy"]):
        from tlora_sim.sim.report.tables import speedups

        summary = speedups(summary.drop(columns=[c for c in SPEEDUP_COLUMNS if c in summary.columns]), reference)
    if policies:  # only these (the speed-ups above were taken against the reference first)
        known = list(dict.fromkeys([*runs, *(summary["policy"] if summary is not None else [])]))
        bad = [p for p in policies if p not in known]
        if bad:
            raise InputError(f"policy {bad[0]!r} is not in this directory; available: {', '.join(known)}",
                             field="--policies")
        runs = {p: r for p, r in runs.items() if p in policies}
        if summary is not None:
            summary = summary[summary["policy"].isin(list(policies))].reset_index(drop=True)
        names = [n for n in names if n in policies]
    if metrics and summary is not None:
        allowed = {m[0] for m in BAR_METRICS} | {"makespan_s"}
        bad = [m for m in metrics if m not in allowed]
        if bad:
            raise InputError(f"unknown metric {bad[0]!r}; the bar figures take: {', '.join(sorted(allowed))}",
                             field="--metrics")
        drop = [m[0] for m in BAR_METRICS if m[0] not in metrics and m[0] in summary.columns]
        keep_speed = {"avg_jct_s": "avg_jct_speedup", "p90_jct_s": "p90_jct_speedup",
                      "throughput_tokens_per_s": "throughput_x", "makespan_s": "makespan_speedup"}
        drop += [v for k, v in keep_speed.items() if k not in metrics and v in summary.columns]
        summary = summary.drop(columns=drop)
    styles = fs.policy_styles(names)
    ordered = [p for p in styles if p in runs]
    written: list[Path] = []

    footer = figure_footer([runs[p] for p in ordered])

    def save(fig, name: str) -> None:
        if only is not None and name not in only:
            return
        if footer:  # a figure-level label: constrained layout keeps room for it under the axes
            fig.supxlabel(footer, fontsize=4.5, color="0.35", x=0.01, ha="left")
        if size is not None:
            fig.set_size_inches(*size)
        written.extend(fs.save_figure(fig, out_dir, name, formats))

    # read and check everything first: a bad file stops the command before any figure is rewritten
    want_series = only is None or bool({"throughput_time", "utilization_time"} & set(only))
    timelines = {p: read_timeline(runs[p]) for p in ordered if runs[p].timeline_path is not None and want_series}
    for p in ordered:
        runs[p].jct_s()
        runs[p].slowdown()

    with fs.style_context():
        # Per-job distributions.
        jct = {p: runs[p].jct_s() for p in ordered}
        jct = {p: s for p, s in jct.items() if np.any(s[0] > 0)}
        if jct:
            save(jct_cdf_figure(jct, styles), "jct_cdf")
        else:
            warn_skipped(f"{where}: no finished job with a JCT; skipping figure 'jct_cdf'")

        slow = {}
        for p in ordered:
            s = runs[p].slowdown()
            if s is None:
                warn_skipped(f"{runs[p].run_dir / JOBS_CSV}: no slowdown (or isolated_runtime_s) column; "
                      f"'slowdown_cdf' leaves policy {p!r} out")
            elif np.any(s[0] > 0):
                slow[p] = s
        if slow:
            save(slowdown_cdf_figure(slow, styles), "slowdown_cdf")
        else:
            warn_skipped(f"{where}: no job with a slowdown; skipping figure 'slowdown_cdf'")

        # Time series.
        series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {c: {} for c in TIMELINE_COLUMNS}
        for p in ordered if want_series else ():
            run = runs[p]
            if run.timeline_path is None:
                warn_skipped(f"{run.run_dir}: no {TIMELINE_CSV}; time-series figures leave policy {p!r} out")
                continue
            for col, binned in timelines[p].items():
                series[col][p] = binned
        if not want_series:
            pass
        elif series["tokens_per_s"]:
            save(throughput_time_figure(series["tokens_per_s"], styles), "throughput_time")
        else:
            warn_skipped(f"{where}: no timeline with tokens_per_s; skipping figure 'throughput_time'")
        if not want_series:
            pass
        elif series["gpu_alloc_util"] or series["gpu_compute_util"]:
            save(utilization_time_figure(series["gpu_alloc_util"], series["gpu_compute_util"], styles),
                 "utilization_time")
        else:
            warn_skipped(f"{where}: no timeline with gpu_alloc_util or gpu_compute_util; skipping figure "
                  f"'utilization_time'")

        # Summary bars.
        if summary is None:
            warn_skipped(f"{where}: no {SUMMARY_JSON}; skipping figure 'bars'")
        elif not available_bar_metrics(summary):
            warn_skipped(f"{where}: summary has no value for any of "
                  f"{', '.join(m[0] for m in BAR_METRICS)}; skipping figure 'bars'")
        else:
            save(bars_figure(summary, styles, baseline=reference), "bars")
        if summary is not None and len(summary) > 1 and reference in set(summary["policy"]) and any(
                c in summary.columns for c in SPEEDUP_COLUMNS):
            save(speedup_figure(summary, styles, reference=reference), "speedup")
    return written


def plot_run(run_dir: str | Path, formats: Iterable[str] = ("png", "pdf"), *,
             metrics: Sequence[str] | None = None, size: tuple[float, float] | None = None) -> list[Path]:
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
    fmts = check_formats(formats)
    run = load_run(run_dir)
    summary = None
    if run.summary is not None:
        row = {k: v for k, v in run.summary.items() if not isinstance(v, (dict, list))}
        row["policy"] = run.policy
        summary = pd.DataFrame([row])
        for col in (m[0] for m in BAR_METRICS):
            if col in summary:
                summary[col] = pd.to_numeric(summary[col], errors="coerce")
    from tlora_sim.sim.report.tenant_figure import plot_tenants

    return (_plot_all(Path(run_dir), {run.policy: run}, summary, fmts, metrics=metrics, size=size)
            + plot_tenants(run_dir, fmts))


def plot_compare(compare_dir: str | Path, formats: Iterable[str] = ("png", "pdf"), *,
                 policies: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                 size: tuple[float, float] | None = None, only: Sequence[str] | None = None) -> list[Path]:
    """Draw the comparison figures of a comparison directory into ``compare_dir/figures/``.

    Reads ``summary.csv`` (required; one row per policy) and each policy's run directory
    ``compare_dir/<policy>/`` (``jobs.csv``, ``timeline.csv``). One line (or bar) per policy, in the
    fixed policy order and colours of :mod:`tlora_sim.sim.report.style`; the ``bars`` figure is normalised to
    ``independent`` when that policy is present. A policy without a run directory is left out of the
    per-job and time-series figures with a :class:`PlotWarning`.

    Args:
        compare_dir: the comparison directory.
        formats: figure formats, among ``png`` (200 dpi), ``pdf``, ``svg``.
        policies: only these policies (speed-ups still against the reference).
        metrics: only these summary columns in ``bars`` and ``speedup``.
        size: (width, height) of every figure in inches.
        only: draw only these figures (``COMPARE_FIGURE_NAMES``; ``compare`` splits them over its workers).

    Returns:
        the written files, in :data:`FIGURE_NAMES` order, each in the order of ``formats``.

    Raises:
        InputError: the directory or ``summary.csv`` is missing, a file is malformed, or a format is
            unknown.
    """
    fmts = check_formats(formats)
    summary, runs = load_compare(compare_dir)
    return _plot_all(Path(compare_dir), runs, summary, fmts, policies=policies, metrics=metrics, size=size, only=only)


# --------------------------------------------------------------------------------------------
# Relative table (the numbers behind the bars figure)
# --------------------------------------------------------------------------------------------

#: Columns of :func:`relative_table` after ``policy``: (name, summary column, "x" = policy / baseline
#: or "speedup" = baseline / policy).
RELATIVE_COLUMNS = (
    ("throughput_x", "throughput_tokens_per_s", "x"),
    ("avg_jct_speedup", "avg_jct_s", "speedup"),
    ("p90_jct_speedup", "p90_jct_s", "speedup"),
    ("makespan_speedup", "makespan_s", "speedup"),
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
        baseline: the policy the ratios are taken to (default the reference baseline
            ``independent-backfill``, the one ``compare`` always runs).

    Raises:
        InputError: no ``policy`` column, or ``baseline`` is not one of the policies (the message
            lists the available ones).
    """
    pols = policies_holding(summary, baseline, "baseline policy", "summary", " (pass baseline=NAME)")
    table = summary.assign(policy=pols).drop_duplicates("policy").set_index("policy")
    order = fs.policy_order(pols)
    out = pd.DataFrame({"policy": order})
    for name, col, kind in RELATIVE_COLUMNS:
        if col not in table.columns:
            continue
        vals = pd.to_numeric(table[col], errors="coerce").reindex(order).to_numpy(dtype=float)
        base = float(pd.to_numeric(pd.Series([table.at[baseline, col]]), errors="coerce").iloc[0])
        out[name] = ratio_to(vals, base, kind)
    return out


def plot_any(path: str | Path, formats: Iterable[str] = ("png", "pdf"), *, policies: Sequence[str] | None = None,
             metrics: Sequence[str] | None = None, size: tuple[float, float] | None = None) -> list[Path]:
    """Draw the figures of ``path``, a sweep, comparison or run directory, and return the files.

    A directory with ``sweep.csv`` is a sweep (``sweep_report.plot_sweep``: the report table and
    average JCT with 95% intervals over seeds).

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
    if (path / RunDir.SWEEP_TABLE).is_file():
        from tlora_sim.sim.report.sweep_report import plot_sweep

        return plot_sweep(path, formats)
    if (path / RunDir.SEEDS_TABLE).is_file():
        from tlora_sim.sim.report.sweep_report import plot_seeds

        return plot_seeds(path, formats)
    if (path / SUMMARY_CSV).is_file():
        return plot_compare(path, formats, policies=policies, metrics=metrics, size=size)
    if (path / JOBS_CSV).is_file():
        return plot_run(path, formats, metrics=metrics, size=size)
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
