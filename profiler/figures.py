"""Paper-style figures from the profiler's data files (no torch needed), and their command line.

Two figures, each drawn only from files the profiler commits under ``profiler/data/``:

``kernels`` (:func:`tlora_sim.profiler.kernel_figures.plot_kernels`)
    Kernel benchmark (``bench/kernels.py`` -> ``kernel_bench_<gpu>.csv``): the training-step time of
    one linear layer (forward + backward, W frozen) per implementation (``base`` = the frozen layer
    alone, ``alone``, ``loop``, ``padded``, ``peft``, ``fused`` = ours) and adapter mix, as a ratio
    to the roofline floor (``floor_ms``: base GEMM FLOPs at the measured matrix rate plus the fewest
    LoRA bytes at the measured copy bandwidth; the floor is the dashed line at 1) or to the frozen
    ``base`` layer of the same mix (the floor then drawn per mix). One panel per layer shape (and
    device), bars grouped by mix. ``ms`` is the CUDA-graph GPU time; ``eager_ms`` (``kernels_eager``)
    the uncaptured step a training loop pays, launch overhead included.

``costmodel_<gpu>`` (:func:`plot_costmodel`)
    Cost model predicted against measured: the step time of one decoder layer (forward + backward,
    ms) for every measured adapter mix of ``profile_<gpu>.csv`` (``tlora-sim profile``), predicted by
    a model fitted as ``tlora-sim costmodel fit`` does (:mod:`tlora_sim.profiler.fit`) on the *training* mixes
    only; the held-out mixes (every k-th mix per model, the split of :func:`tlora_sim.profiler.fit.heldout_mask`,
    k from the artifact ``costmodel_<gpu>.json`` when present, else 4) were never seen by that fit and
    are drawn as filled diamonds with a black edge, the training mixes as small open circles. One
    panel per base model, colour per plan (``alone``, ``loop``, ``fused``), y = x and a +-10 % band.
    With ``e2e_<gpu>.csv`` and the artifact also ``costmodel_e2e_<gpu>``: full-model steps on one GPU
    predicted by the shipped artifact against measured (none of them is in the fit).

Both take paths and return the written files (:func:`tlora_sim.sim.report.style.save_figure`: PNG at 200 dpi and
vector PDF, atomically). Bad input raises :class:`tlora_sim.traces.errors.InputError` naming the file (and row and
field where there is one). Command line::

    python -m tlora_sim.profiler.figures --kernels profiler/data/kernel_bench_h100.csv \\
        --costmodel profiler/data --out docs/figures
    python -m tlora_sim.profiler.figures --out docs/figures     # every committed data file

matplotlib is used without pyplot (:class:`matplotlib.figure.Figure` only); :mod:`tlora_sim.profiler.fit`
(scipy, no torch) is imported only by the cost-model functions.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.traces.errors import InputError
from tlora_sim.profiler.kernel_figures import RELATIVE_TO, ProfilerPlotWarning, log_ticks, plot_kernels, warn_skipped

#: Held-out mixes: every k-th per model when the artifact does not say (``fit.heldout_mask``).
DEFAULT_HOLDOUT_EVERY = 4
_BAND = 0.10  # +-10 % band around y = x

__all__ = [
    "DEFAULT_HOLDOUT_EVERY",
    "costmodel_files",
    "costmodel_predictions",
    "costmodel_figure",
    "e2e_predictions",
    "e2e_figure",
    "plot_costmodel",
    "main",
]

# --------------------------------------------------------------------------------------------
# Cost model: predicted against measured
# --------------------------------------------------------------------------------------------

def costmodel_files(data: str | Path, gpu: str | None = None) -> dict[str, dict[str, Path | list[Path] | None]]:
    """Find the profiler's cost-model files per GPU type.

    Args:
        data: a directory like ``profiler/data`` (``profile_<gpu>.csv``, ``costmodel_<gpu>.json``,
            ``e2e_<gpu>.csv``), or one profile CSV.
        gpu: only this GPU type (e.g. ``H100``); default every type found.

    Returns:
        ``{GPU: {"profile": [CSV, ...], "artifact": JSON or None, "e2e": CSV or None}}``, GPU types
        upper-case and sorted. In a directory, ``profile_<gpu>.csv`` is the profile of that GPU when
        it exists (the merged file ``tlora-sim costmodel fit`` writes), else every ``profile_*.csv``
        (their rows are filtered by their ``gpu`` column).

    Raises:
        InputError: ``data`` does not exist, or holds no profile CSV (for ``gpu``).
    """
    data = Path(data)
    if not data.exists():
        raise InputError("cost-model data does not exist (expected profile_<gpu>.csv, costmodel_<gpu>.json)",
                         file=str(data))
    if data.is_file():
        folder, profiles = data.parent, [data]
    else:
        folder, profiles = data, sorted(data.glob("profile_*.csv"))
    if not profiles:
        raise InputError("no profile_<gpu>.csv (tlora-sim profile writes it)", file=str(data))
    if gpu is not None:
        gpus = [gpu.upper()]
    elif data.is_file():
        gpus = _gpus_in(profiles)
    else:  # profile_<gpu>.csv names its GPU type; else the rows' gpu column does
        named = {f.stem.split("_", 1)[1].upper() for f in profiles if re.fullmatch(r"profile_[A-Za-z0-9]+", f.stem)}
        gpus = sorted(named) or _gpus_in(profiles)
    out: dict[str, dict] = {}
    for g in gpus:
        own = folder / f"profile_{g.lower()}.csv"
        files = [own] if data.is_dir() and own.is_file() else profiles
        art = folder / f"costmodel_{g.lower()}.json"
        e2e = folder / f"e2e_{g.lower()}.csv"
        out[g] = {"profile": files, "artifact": art if art.is_file() else None,
                  "e2e": e2e if e2e.is_file() else None}
    return out


def _gpus_in(paths: Sequence[Path]) -> list[str]:
    gpus: set[str] = set()
    for p in paths:
        try:
            col = pd.read_csv(p, usecols=["gpu"], dtype=str, keep_default_na=False)["gpu"]
        except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise InputError(f"cannot read the gpu column ({str(exc).splitlines()[0]})", file=str(p),
                             field="gpu") from None
        gpus |= {g.upper() for g in col if g}
    if not gpus:
        raise InputError("no gpu value in the profile rows", file=", ".join(map(str, paths)), field="gpu")
    return sorted(gpus)


def _artifact_meta(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cost-model artifact is not readable JSON ({exc})", file=str(path)) from None


def costmodel_predictions(data: str | Path, gpu: str | None = None, holdout_every: int | None = None,
                          correction: bool | None = None) -> pd.DataFrame:
    """Predicted and measured layer steps of every measured mix, held-out mixes marked.

    Reproduces ``tlora-sim costmodel validate``: per model, the measured mixes sorted by key,
    every ``holdout_every``-th held out with all its plans (:func:`tlora_sim.profiler.fit.heldout_mask`);
    a model is fitted (:func:`tlora_sim.profiler.fit.fit_artifact`) on the other rows only and predicts every
    mix row, training and held-out. The held-out rows' errors are the cost model's accuracy; the
    training rows' are in-sample.

    Args:
        data: as for :func:`costmodel_files`.
        gpu: GPU type; default the only one found (several: the first in sorted order).
        holdout_every: k; default the artifact's ``heldout.k``, else 4.
        correction: fit with the residual correction; default as the artifact was fitted, else no.

    Returns:
        one row per mix row: ``model``, ``plan``, ``adapters``, ``mix`` (canonical key), ``tokens``,
        ``measured_ms``, ``predicted_ms`` (one decoder layer, forward + backward, ms), ``ape``
        (|predicted - measured| / measured), ``extrapolated``, ``heldout`` (bool), ``gpu``.

    Raises:
        InputError: missing or malformed files, too few rows to fit, or no mix rows.
    """
    from tlora_sim.profiler.fit import fit_artifact, heldout_mask, predict_rows, read_rows

    files = costmodel_files(data, gpu)
    g = sorted(files)[0]
    meta = _artifact_meta(files[g]["artifact"])
    k = int(holdout_every or (meta.get("heldout") or {}).get("k") or DEFAULT_HOLDOUT_EVERY)
    if k < 2:
        raise InputError(f"holdout_every must be >= 2, got {k}", field="holdout_every")
    if correction is None:
        correction = bool((meta.get("conventions") or {}).get("correction", False))
    df = read_rows([str(p) for p in files[g]["profile"]])
    d = df[df["gpu"].astype(str).str.upper() == g]
    if d.empty:
        raise InputError(f"no profile rows for GPU {g!r}", file=", ".join(map(str, files[g]["profile"])),
                         field="gpu")
    ho = heldout_mask(d, k)
    if not ho.any():
        raise InputError(f"too few mixes to hold every {k}th out", file=", ".join(map(str, files[g]["profile"])))
    art = fit_artifact(d[~ho], g, correction=correction)
    mix = d[d["kind"] == "mix"]
    parts = []
    for flag in (False, True):
        rows = mix[ho.loc[mix.index] == flag]
        if len(rows):
            parts.append(predict_rows(art, rows).assign(heldout=flag))
    pred = pd.concat(parts, ignore_index=True)
    pred["gpu"] = g
    pred.attrs.update({"gpu": g, "holdout_every": k, "correction": correction,
                       "artifact": meta.get("id"), "profile": [str(p) for p in files[g]["profile"]]})
    return pred


def _loglog_axes(ax, lo: float, hi: float) -> None:
    """Square log-log axes over [lo, hi] with plain tick labels."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    log_ticks(ax.xaxis, lo, hi)
    log_ticks(ax.yaxis, lo, hi)


def _ape_text(a: np.ndarray) -> str:
    if a.size == 0:
        return "held out: none"
    return f"held-out APE (n={a.size}):\nmedian {np.median(a):.1%}, p90 {np.quantile(a, 0.9):.1%}"


def costmodel_figure(pred: pd.DataFrame, title: str | None = None):
    """Figure: predicted against measured layer step (ms), log-log, one panel per base model.

    Training mixes are small open circles, held-out mixes filled diamonds with a black edge (their
    scatter collections carry ``gid`` ``"fit:<plan>"`` and ``"heldout:<plan>"``), coloured by plan
    (:func:`tlora_sim.sim.report.style.impl_styles`); the solid line is y = x, the grey band +-10 %. Each panel
    states the held-out median and p90 absolute percentage error.

    Args:
        pred: from :func:`costmodel_predictions` (columns ``model``, ``plan``, ``measured_ms``,
            ``predicted_ms``, ``heldout``; ``ape`` optional).
        title: optional figure title.

    Raises:
        ValueError: ``pred`` is empty or lacks a column.
    """
    from matplotlib.lines import Line2D

    need = {"model", "plan", "measured_ms", "predicted_ms", "heldout"}
    if pred.empty or not need <= set(pred.columns):
        raise ValueError(f"need a non-empty table with columns {sorted(need)}")
    models = sorted(pred["model"].astype(str).unique())
    styles = fs.impl_styles(pred["plan"].astype(str))
    ncol = min(len(models), 4)
    nrow = math.ceil(len(models) / ncol)
    width = fs.COLUMN_WIDTH_IN if ncol == 1 else min(fs.DOUBLE_COLUMN_WIDTH_IN, 0.4 + 1.9 * ncol)
    fig = fs.new_figure(width, 0.7 + 1.75 * nrow if ncol > 1 else 3.0)
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False).ravel())
    for ax, model in zip(axes, models):
        sub = pred[pred["model"].astype(str) == model]
        vals = np.concatenate([sub["measured_ms"].to_numpy(float), sub["predicted_ms"].to_numpy(float)])
        vals = vals[np.isfinite(vals) & (vals > 0)]
        lo, hi = (float(vals.min()) / 1.3, float(vals.max()) * 1.3) if vals.size else (0.1, 10.0)
        line = np.geomspace(lo, hi, 50)
        ax.fill_between(line, line * (1 - _BAND), line * (1 + _BAND), color="0.85", linewidth=0, zorder=0,
                        gid="band")
        ax.plot(line, line, color="black", linewidth=0.6, zorder=1, gid="diagonal")
        for plan, st in styles.items():
            tr = sub[(sub["plan"] == plan) & ~sub["heldout"].astype(bool)]
            te = sub[(sub["plan"] == plan) & sub["heldout"].astype(bool)]
            if len(tr):
                ax.scatter(tr["measured_ms"], tr["predicted_ms"], s=7, marker="o", facecolors="none",
                           edgecolors=st.color, linewidths=0.5, alpha=0.8, zorder=2, gid=f"fit:{plan}",
                           label=f"{plan}, fitted on")
            if len(te):
                ax.scatter(te["measured_ms"], te["predicted_ms"], s=16, marker="D", facecolors=st.color,
                           edgecolors="black", linewidths=0.5, zorder=3, gid=f"heldout:{plan}",
                           label=f"{plan}, held out")
        _loglog_axes(ax, lo, hi)
        h = sub[sub["heldout"].astype(bool)]
        ape = (h["ape"] if "ape" in h else (h["predicted_ms"] - h["measured_ms"]).abs() / h["measured_ms"])
        ax.text(0.03, 0.97, _ape_text(ape.to_numpy(float)), transform=ax.transAxes, ha="left", va="top",
                fontsize=5.5, linespacing=1.1)
        ax.set_title(model, loc="left", fontsize=7, pad=2)
        ax.set_xlabel(fs.axis_label("Measured layer step", "ms"))
        ax.set_ylabel(fs.axis_label("Predicted layer step", "ms"))
    for ax in axes[len(models):]:
        ax.set_axis_off()
    handles = [Line2D([], [], linestyle="none", marker="s", markersize=5, markerfacecolor=st.color,
                      markeredgecolor="black", markeredgewidth=0.3, label=plan) for plan, st in styles.items()]
    handles += [Line2D([], [], linestyle="none", marker="o", markersize=3.5, markerfacecolor="none",
                       markeredgecolor="0.3", markeredgewidth=0.6, label="fitted on"),
                Line2D([], [], linestyle="none", marker="D", markersize=4, markerfacecolor="0.5",
                       markeredgecolor="black", markeredgewidth=0.5, label="held out"),
                Line2D([], [], color="0.8", linewidth=4, label=f"\u00b1{_BAND:.0%}")]
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles) if ncol > 1 else 4)
    if title:
        fig.suptitle(title, fontsize=6.5)
    return fig


def e2e_predictions(e2e_csv: str | Path, artifact: str | Path) -> pd.DataFrame:
    """Full-model steps on one GPU: measured (``e2e_<gpu>.csv``) against the artifact's prediction.

    Returns:
        :func:`tlora_sim.profiler.fit.e2e_table`: ``model``, ``plan``, ``adapters``, ``tokens``,
        ``measured_ms``, ``predicted_ms`` (ms), ``error`` (predicted / measured - 1),
        ``extrapolated``, ``peak_gib``; out-of-memory rows are left out.

    Raises:
        InputError: unreadable files or a wrong artifact schema.
    """
    from tlora_sim.profiler.fit import e2e_table
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
    from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

    try:
        e2e = pd.read_csv(e2e_csv, dtype={"ranks": str, "batch_sizes": str, "seq_lens": str}, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"not a readable CSV ({str(exc).splitlines()[0]})", file=str(e2e_csv)) from None
    for c in ("step_ms", "tokens", "peak_bytes"):
        if c not in e2e.columns:
            raise InputError("missing column", file=str(e2e_csv), field=c)
        e2e[c] = pd.to_numeric(e2e[c], errors="coerce")
    return e2e_table(ProfiledCostModel(load_artifact(artifact)), e2e)


def e2e_figure(e2e: pd.DataFrame):
    """Figure: predicted against measured full-model step (ms, log-log), colour per plan, marker per model.

    None of these points is in the fit (the artifact is fitted on single layers); the line is
    y = x, the grey band +-10 %.

    Raises:
        ValueError: ``e2e`` is empty.
    """
    from matplotlib.lines import Line2D

    if e2e.empty:
        raise ValueError("no full-model steps to draw")
    styles = fs.impl_styles(e2e["plan"].astype(str))
    models = sorted(e2e["model"].astype(str).unique())
    markers = dict(zip(models, ("o", "s", "^", "D", "v", "P", "X")))
    fig = fs.new_figure(fs.COLUMN_WIDTH_IN, 3.0)
    ax = fig.add_subplot()
    vals = np.concatenate([e2e["measured_ms"].to_numpy(float), e2e["predicted_ms"].to_numpy(float)])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    lo, hi = float(vals.min()) / 1.3, float(vals.max()) * 1.3
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * (1 - _BAND), line * (1 + _BAND), color="0.85", linewidth=0, zorder=0)
    ax.plot(line, line, color="black", linewidth=0.6, zorder=1)
    for (model, plan), g in e2e.groupby(["model", "plan"], sort=True):
        ax.scatter(g["measured_ms"], g["predicted_ms"], s=14, marker=markers.get(model, "o"),
                   facecolors=styles[plan].color, edgecolors="black", linewidths=0.4, zorder=2,
                   gid=f"e2e:{model}:{plan}")
    _loglog_axes(ax, lo, hi)
    err = e2e["error"].abs().to_numpy(float) if "error" in e2e else np.empty(0)
    if err.size:
        ax.text(0.97, 0.03, f"|error|: median {np.median(err):.1%}, max {np.max(err):.1%} (n={err.size})",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=5.5)
    ax.set_xlabel(fs.axis_label("Measured full-model step", "ms"))
    ax.set_ylabel(fs.axis_label("Predicted full-model step", "ms"))
    handles = [Line2D([], [], linestyle="none", marker="s", markersize=5, markerfacecolor=st.color,
                      markeredgecolor="black", markeredgewidth=0.3, label=p) for p, st in styles.items()]
    handles += [Line2D([], [], linestyle="none", marker=markers[m], markersize=4, markerfacecolor="0.6",
                       markeredgecolor="black", markeredgewidth=0.4, label=m) for m in models]
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 4))
    return fig


def plot_costmodel(data: str | Path, out_dir: str | Path, formats: Iterable[str] = ("png", "pdf"), *,
                   gpu: str | None = None, holdout_every: int | None = None) -> list[Path]:
    """Draw predicted-against-measured figures of the cost model into ``out_dir``.

    For each GPU type found (:func:`costmodel_files`, or ``gpu``): ``costmodel_<gpu>`` from
    :func:`costmodel_predictions` and :func:`costmodel_figure`; with ``e2e_<gpu>.csv`` and
    ``costmodel_<gpu>.json`` also ``costmodel_e2e_<gpu>`` (:func:`e2e_figure`).

    Args:
        data: ``profiler/data``-like directory or one profile CSV.
        out_dir: output directory (created when missing).
        formats: among ``png`` (200 dpi), ``pdf``, ``svg``.
        gpu: only this GPU type.
        holdout_every: k of the held-out split (default: the artifact's, else 4).

    Returns:
        the written files, GPU by GPU, each in the order of ``formats``.

    Raises:
        InputError: missing or malformed files, too few rows to fit, or an unknown format.
    """
    written: list[Path] = []
    for g, files in costmodel_files(data, gpu).items():
        pred = costmodel_predictions(data, g, holdout_every)
        with fs.style_context():
            written += fs.save_figure(costmodel_figure(pred), out_dir, f"costmodel_{g.lower()}", formats)
        if files["e2e"] is not None and files["artifact"] is not None:
            e2e = e2e_predictions(files["e2e"], files["artifact"])
            if e2e.empty:
                warn_skipped(f"{files['e2e']}: no full-model step without an error; skipping costmodel_e2e_{g.lower()}")
                continue
            with fs.style_context():
                written += fs.save_figure(e2e_figure(e2e), out_dir, f"costmodel_e2e_{g.lower()}", formats)
    return written


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tlora_sim.profiler.figures [--kernels CSV] [--costmodel DIR] --out DIR [--formats png,pdf]``.

    Without ``--kernels`` and ``--costmodel`` it draws every committed data file of
    ``profiler/data`` (``kernel_bench_*.csv``, and the cost model when a profile CSV is there).
    Prints the written files; returns 0, or 2 on an :class:`InputError` (printed as one line).
    """
    ap = argparse.ArgumentParser(prog="python -m tlora_sim.profiler.figures",
                                 description="Draw the kernel-benchmark and cost-model figures from the "
                                             "profiler's data files.")
    ap.add_argument("--kernels", type=Path, action="append", metavar="CSV",
                    help="kernel benchmark CSV (bench/kernels.py); repeatable")
    ap.add_argument("--costmodel", type=Path, metavar="DIR_OR_CSV",
                    help="directory with profile_<gpu>.csv [costmodel_<gpu>.json, e2e_<gpu>.csv], or a profile CSV")
    ap.add_argument("--gpu", help="cost model of this GPU type only (default: every one found)")
    ap.add_argument("--holdout-every", type=int, metavar="K", help="hold out every K-th mix (default: the artifact's, else 4)")
    ap.add_argument("--relative-to", choices=RELATIVE_TO, default="floor", help="kernel ratios to (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--formats", default="png,pdf", help="comma-separated: png, pdf, svg")
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]

    def draw() -> list[Path]:
        kernels, costmodel = args.kernels, args.costmodel
        if not kernels and costmodel is None:
            from tlora_sim.sim.costmodel.profiled.artifact import data_dir

            kernels = sorted(data_dir().glob("kernel_bench_*.csv"))
            costmodel = data_dir() if list(data_dir().glob("profile_*.csv")) else None
            if not kernels and costmodel is None:
                raise InputError("no committed profiler data (kernel_bench_*.csv, profile_*.csv)", file=str(data_dir()))
        written: list[Path] = []
        for csv_path in kernels or []:
            suffix = "" if len(kernels) == 1 else "_" + Path(csv_path).stem.replace("kernel_bench_", "")
            for timing in ("ms", "eager_ms"):
                df_name = ("kernels" + ("_eager" if timing == "eager_ms" else "")
                           + ("_vs_base" if args.relative_to == "base" else "") + suffix)
                try:
                    written += plot_kernels(csv_path, args.out, formats, relative_to=args.relative_to,
                                            timing=timing, name=df_name)
                except InputError as err:
                    if timing == "ms":
                        raise
                    print(f"warning: {err}", file=sys.stderr)  # no eager times: skip that figure
        if costmodel is not None:
            written += plot_costmodel(costmodel, args.out, formats, gpu=args.gpu, holdout_every=args.holdout_every)
        return written

    return fs.run_figure_command(draw, ProfilerPlotWarning)


if __name__ == "__main__":
    sys.exit(main())
