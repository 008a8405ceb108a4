"""Kernel-benchmark figures and tables: reading ``bench/kernels.py``'s CSV, the per-mix table, and
kernel time relative to the frozen base layer or the floor, per implementation. Also what the
profiler's figures share (:class:`ProfilerPlotWarning`, :func:`log_ticks`); the cost-model figures
and the command line are in :mod:`tlora_sim.profiler.figures`."""
from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.traces.errors import InputError


#: Columns a kernel benchmark CSV must have (``bench/kernels.py`` writes these and more).
KERNEL_COLUMNS = ("layer", "ranks", "tokens", "impl", "ms", "eager_ms", "floor_ms", "device", "torch", "triton")
#: Timing columns of the kernel benchmark, and how their axis is named.
_TIMINGS = {"ms": "GPU step time", "eager_ms": "Eager step time"}
#: What :func:`kernel_figure` divides kernel time by: the roofline floor, or the frozen base layer.
RELATIVE_TO = ("floor", "base")


class ProfilerPlotWarning(UserWarning):
    """Part of a profiler figure was left out because its data is missing."""


def warn_skipped(msg: str) -> None:
    """Warn (:class:`ProfilerPlotWarning`) that part of a figure is left out; the warning names the
    caller of the function that calls this."""
    warnings.warn(msg, ProfilerPlotWarning, stacklevel=3)


# --------------------------------------------------------------------------------------------
# Kernel benchmark
# --------------------------------------------------------------------------------------------

def _split_list(v) -> list[str]:
    return [x.strip() for x in re.split(r"[,;]", str(v)) if x.strip()]


def _mix_label(row: pd.Series) -> str:
    mix = str(row.get("mix", "") or "").strip()
    if mix and mix.lower() != "nan":
        return mix
    ranks, tokens = _split_list(row["ranks"]), _split_list(row["tokens"])
    n = row.get("n_adapters")
    n = int(n) if n is not None and pd.notna(n) and str(n).strip() else max(len(ranks), len(tokens), 1)
    r = f"r{ranks[0]}\u00d7{n}" if len(set(ranks)) == 1 else "r" + ",".join(ranks)
    t = f"@{tokens[0]}" if len(set(tokens)) == 1 else "@" + "/".join(dict.fromkeys(tokens))
    return f"{r} {t}"


def read_kernel_bench(path: str | Path) -> pd.DataFrame:
    """Read a kernel benchmark CSV (``bench/kernels.py``) and check it.

    Required columns: :data:`KERNEL_COLUMNS` (``ms``, ``floor_ms`` in ms, positive numbers;
    ``eager_ms`` in ms, may be blank). ``ranks`` and ``tokens`` are kept as text (``"8,16,32,64"``).
    Adds ``mix_label``: the ``mix`` column where present, else a label made of ranks and tokens.

    Raises:
        InputError: a missing or unreadable file, an empty table, a missing column, or a
            non-numeric or non-positive time (naming the file, row and field).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("kernel benchmark CSV does not exist (bench/kernels.py --out writes it)",
                         file=str(path))
    try:
        df = pd.read_csv(path, dtype={"ranks": str, "tokens": str, "impl": str, "layer": str,
                                      "mix": str, "device": str},
                         keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise InputError("empty file; expected a CSV header row", file=str(path)) from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise InputError(f"not a readable CSV ({str(exc).splitlines()[0]})", file=str(path)) from None
    missing = [c for c in KERNEL_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}; expected {', '.join(KERNEL_COLUMNS)}",
                         file=str(path), field=missing[0])
    if df.empty:
        raise InputError("no rows", file=str(path))
    for col in ("ms", "eager_ms", "floor_ms"):
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce")
        bad = num.isna() & raw.notna()
        if col != "eager_ms":
            bad |= raw.isna() | ~(num > 0)
        else:
            bad |= num.notna() & ~(num > 0)
        if bad.any():
            pos = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(f"expected a positive time in ms, got {raw.iloc[pos]!r}", file=str(path),
                             row=pos + 1, field=col)
        df[col] = num.astype(float)
    for col in ("layer", "impl", "device", "ranks", "tokens"):
        if df[col].isna().any():
            pos = int(np.flatnonzero(df[col].isna().to_numpy())[0])
            raise InputError("empty value", file=str(path), row=pos + 1, field=col)
        df[col] = df[col].astype(str)
    if "n_adapters" in df.columns:
        df["n_adapters"] = pd.to_numeric(df["n_adapters"], errors="coerce")
    df["mix_label"] = [_mix_label(r) for _, r in df.iterrows()]
    return df


def kernel_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, layer, mix, implementation): times and ratios, in benchmark order.

    Columns: ``device``, ``layer``, ``mix`` (``mix_label``), ``ranks``, ``tokens``, ``impl``, ``ms``,
    ``eager_ms``, ``floor_ms`` (medians over repeated rows, ms), ``ratio_to_floor`` (ms / floor_ms),
    ``ratio_to_base`` and ``eager_ratio_to_base`` (over the ``base`` implementation of the same
    mix; NaN without one). Dimensionless ratios; above 1 is slower.

    Args:
        df: from :func:`read_kernel_bench`.
    """
    keys = ["device", "layer", "mix_label", "impl"]
    first = df.drop_duplicates(keys)[keys + ["ranks", "tokens"]]
    med = df.groupby(keys, sort=False)[["ms", "eager_ms", "floor_ms"]].median().reset_index()
    t = first.merge(med, on=keys, how="left")
    base = t[t["impl"] == "base"].set_index(["device", "layer", "mix_label"])
    idx = pd.MultiIndex.from_frame(t[["device", "layer", "mix_label"]])
    t["ratio_to_floor"] = t["ms"] / t["floor_ms"]
    t["ratio_to_base"] = t["ms"].to_numpy() / base["ms"].reindex(idx).to_numpy()
    t["eager_ratio_to_base"] = t["eager_ms"].to_numpy() / base["eager_ms"].reindex(idx).to_numpy()
    return t.rename(columns={"mix_label": "mix"}).reset_index(drop=True)


def kernel_figure(df: pd.DataFrame, relative_to: str = "floor", timing: str = "ms"):
    """Figure: per-implementation step time of each adapter mix relative to the roofline floor.

    One panel per (device, layer) in benchmark order, a group of bars per mix (benchmark order),
    a bar per implementation in :func:`tlora_sim.sim.report.style.impl_order` and colours. ``relative_to="floor"``:
    bars are ``timing / floor_ms`` and the floor is the dashed line at 1; ``"base"``: bars are
    ``timing / base`` (the frozen layer of the same mix, the solid line at 1, no ``base`` bar) and
    the floor is a dashed tick over each mix at ``floor_ms / base``. The y-axis turns logarithmic when
    the ratios span more than 6x (eager loops reach 10x+).

    Args:
        df: from :func:`read_kernel_bench`.
        relative_to: ``"floor"`` or ``"base"``.
        timing: ``"ms"`` (CUDA-graph GPU time) or ``"eager_ms"`` (uncaptured step).

    Raises:
        ValueError: an unknown ``relative_to`` or ``timing``, or nothing to draw (no finite ratio).
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if relative_to not in RELATIVE_TO:
        raise ValueError(f"relative_to must be one of {RELATIVE_TO}, got {relative_to!r}")
    if timing not in _TIMINGS:
        raise ValueError(f"timing must be one of {tuple(_TIMINGS)}, got {timing!r}")
    table = kernel_table(df)
    value = table[timing]
    if relative_to == "floor":
        table["y"] = value / table["floor_ms"]
    else:
        base = table[table["impl"] == "base"].set_index(["device", "layer", "mix"])[timing]
        base_val = base.reindex(pd.MultiIndex.from_frame(table[["device", "layer", "mix"]])).to_numpy(dtype=float)
        table["y"] = value.to_numpy(dtype=float) / base_val
        table["floor_y"] = table["floor_ms"].to_numpy(dtype=float) / base_val
        table = table[table["impl"] != "base"]
    table = table[np.isfinite(table["y"].to_numpy(dtype=float, na_value=np.nan))]
    if table.empty:
        raise ValueError(f"no finite {timing} ratio to the {relative_to} to draw")
    panels = list(dict.fromkeys(zip(table["device"], table["layer"])))
    devices = {d for d, _ in panels}
    styles = fs.impl_styles(table["impl"])
    ys = table["y"].to_numpy(dtype=float)
    lo, hi = float(np.min(ys)), float(np.max(ys))
    log = hi / max(lo, 1e-12) > 6.0
    fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 0.55 + 1.55 * len(panels))
    axes = np.atleast_1d(fig.subplots(len(panels), 1, squeeze=False).ravel())
    ref_label = "roofline floor" if relative_to == "floor" else "frozen base layer"
    for ax, (device, layer) in zip(axes, panels):
        sub = table[(table["device"] == device) & (table["layer"] == layer)]
        mixes = list(dict.fromkeys(sub["mix"]))
        impls = [i for i in styles if i in set(sub["impl"])]
        width = 0.82 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            s = sub[sub["impl"] == impl].set_index("mix").reindex(mixes)
            x = np.arange(len(mixes)) - 0.41 + width * (j + 0.5)
            st = styles[impl]
            ax.bar(x, s["y"].to_numpy(dtype=float), width=width, color=st.color,
                   hatch=st.hatch or None, edgecolor="black", linewidth=0.3, label=impl, gid=f"impl:{impl}")
        if relative_to == "floor":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle=(0, (3, 2)), zorder=3, gid="floor")
        else:
            ax.axhline(1.0, color="0.35", linewidth=0.6, zorder=3, gid="base")
            floor = sub.groupby("mix", sort=False)["floor_y"].median().reindex(mixes).to_numpy(dtype=float)
            xs = np.arange(len(mixes))
            ax.hlines(floor, xs - 0.45, xs + 0.45, colors="black", linewidth=0.8, linestyles=(0, (3, 2)),
                      zorder=3, gid="floor")
        ax.set_xticks(np.arange(len(mixes)), mixes, rotation=20 if max(len(m) for m in mixes) > 8 else 0,
                      ha="right" if max(len(m) for m in mixes) > 8 else "center")
        ax.set_xlim(-0.6, len(mixes) - 0.4)
        ax.grid(axis="x", visible=False)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(min(0.8, lo * 0.85), hi * 1.35)
            log_ticks(ax.yaxis, min(0.8, lo * 0.85), hi * 1.35)
        else:
            ax.set_ylim(0, hi * 1.12)
        title = f"{layer} layer" if len(devices) == 1 else f"{device}: {layer} layer"
        ax.set_title(title, loc="left", fontsize=7, pad=2)
        unit = "\u00d7 roofline floor" if relative_to == "floor" else "\u00d7 frozen base"
        ax.set_ylabel(fs.axis_label(_TIMINGS[timing], unit), fontsize=6.5)
    derived = "mix" not in df.columns
    axes[-1].set_xlabel(fs.axis_label("Adapter mix", "ranks \u00d7 adapters @ tokens each" if derived
                                      else "bench/kernels.py MIXES"))
    handles = [Patch(facecolor=styles[i].color, hatch=styles[i].hatch or None, edgecolor="black",
                     linewidth=0.3, label=i) for i in styles]
    handles.append(Line2D([], [], color="black", linewidth=0.8, linestyle=(0, (3, 2)), label="roofline floor"))
    if relative_to == "base":
        handles.append(Line2D([], [], color="0.35", linewidth=0.6, label=ref_label))
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 8))
    return fig


def plot_kernels(csv_path: str | Path, out_dir: str | Path, formats: Iterable[str] = ("png", "pdf"), *,
                 relative_to: str = "floor", timing: str = "ms", name: str | None = None) -> list[Path]:
    """Draw the kernel benchmark figure (:func:`kernel_figure`) from a CSV into ``out_dir``.

    Args:
        csv_path: ``kernel_bench_<gpu>.csv`` of ``bench/kernels.py``.
        out_dir: output directory (created when missing).
        formats: among ``png`` (200 dpi), ``pdf``, ``svg``.
        relative_to: ``"floor"`` (default) or ``"base"``.
        timing: ``"ms"`` (CUDA-graph time, default) or ``"eager_ms"``.
        name: file base name; default ``kernels``, plus ``_eager`` for eager timing and ``_vs_base``
            relative to the base layer.

    Returns:
        the written files, in the order of ``formats``.

    Raises:
        InputError: a bad CSV (see :func:`read_kernel_bench`), an unknown format, or no finite
            ratio to draw.
    """
    df = read_kernel_bench(csv_path)
    if name is None:
        name = "kernels" + ("_eager" if timing == "eager_ms" else "") + ("_vs_base" if relative_to == "base" else "")
    with fs.style_context():
        try:
            fig = kernel_figure(df, relative_to=relative_to, timing=timing)
        except ValueError as err:
            raise InputError(str(err), file=str(csv_path), field=timing) from None
        return fs.save_figure(fig, out_dir, name, formats)


def log_ticks(axis, lo: float, hi: float) -> None:
    """Plain tick labels (0.2, 1, 5, not 10^k) on a log axis over [lo, hi]: at 1-2-5 per decade, at
    every integer mantissa when it spans under 1.2 decades, at powers of ten beyond 3 decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    span = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0,) if span > 3 else (1.0, 2.0, 5.0) if span > 1.2 else tuple(float(m) for m in range(1, 10))
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
