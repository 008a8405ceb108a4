"""Does the host-speed probe follow the executed steps? (issue 43; a diagnostic, like ``step_ratio.py``)

For each executed run directory (``tlora-sim execute`` output with ``probes.csv``), every steady
step (``event == "step"`` and not the first step after a start or regroup of its group;
``steptable.step_rows``' ``first``) is predicted with the calibrated artifact at host factor 1
(``workload.executor_cost_model``: ``ProfiledCostModel(art, checkpointing=False)``, the model
``validate-run --host-speed off`` replays with) and ``r = measured / predicted``. ``r`` is then set
against the probe's host factor through time (``host_speed.factor_series`` of the run's probes,
window +-10 s, over the artifact's ``calibration.probe.ref_ms``):

1. windows: the steps are put in consecutive ``WINDOW_S`` (10 s) windows from t = 0 by their
   midpoint; each window's median ``r`` is set against the factor at the window's start and at its
   middle: Pearson and Spearman correlation and the least-squares slope of log r on log factor (1 =
   the step moves as the probe does, 0 = not at all);
2. the same with ``python_ms`` (the pure-Python loop timed beside the probe) in place of
   ``probe_ms``, its factor over the calibration's median ``python_ms``;
3. per run: the median r, the median factor (at each step's midpoint), and the share of the run's
   median |log r| that dividing by the factor removes: ``1 - median|log(r / f)| / median|log r|``
   (1 = the factor explains r entirely, 0 = not at all, < 0 = it makes it worse). Beside it the
   same share for what ``validate-run --host-speed probes`` does, which scales only the host terms
   (``host_speed.speed_artifact``): ``r_model = measured / predicted at factor f``
   (``*_model`` columns; for a GPU-bound step f moves the prediction less than f).

``--calibrations CAL.json ...`` adds one row per calibration: its host-bound points (``tokens <=
2048``) with ``measured_ms / calibrated_no_probe_ms`` set against the point's ``probe_factor`` and
against its ``python_ms`` (median of the point's probes over the calibration's median), the same
statistics (no windows: one value per point). ``--out CSV`` writes the run table there and the
calibration table beside it (``<stem>_calibrations.csv``); ``--figure PNG`` draws, per run, the
windows' median r and the factor against time. The analysis of the 2026-12-02 H200 session::

    D=profiler/data/validation/h200_2026-12-02
    python -m tlora_sim.sim.executor.probe_track $D/A/{independent,mlora,tlora} $D/B/{independent,mlora,tlora} \\
        $D/A_repeat/tlora --artifact $D/calibrated_h200.json \\
        --calibrations $D/calibrated_h200.json $D/calibrated_h200_end.json \\
        --out $D/probe_track.csv --figure $D/probe_track.png

Nothing here changes a default, window or fit: it reads committed data and reports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from tlora_sim.sim.executor.host_speed import WINDOW_S as PROBE_WINDOW_S
from tlora_sim.sim.executor.host_speed import HostSpeed, factor_series, read_probes, reference_ms, speed_artifact
from tlora_sim.sim.executor.step_ratio import predicted_steps
from tlora_sim.sim.executor.steptable import predicted_s
from tlora_sim.traces.errors import InputError

#: width of the windows whose median r is set against the factor (s; the drift study's 10-s medians)
WINDOW_S = 10.0
#: the calibration points counted as host-bound (tokens per step; README: GPU-bound from 4,096 up)
HOST_BOUND_TOKENS = 2048
#: the host-factor step of ``host_elasticity`` (10%)
ELASTICITY_STEP = 0.1
#: the two host signals: the probe (what ``validate-run --host-speed probes`` follows) and the loop
SIGNALS = ("probe", "python")


def references(art: dict, path: Path) -> tuple[float, float]:
    """(ref probe ms, ref python ms) of a calibrated artifact: ``calibration.probe.ref_ms`` and the
    median ``python_ms`` of ``calibration.probe.probes``.

    Raises:
        InputError: the artifact has no probe record (calibrated before the probe existed).
    """
    ref = reference_ms(art)
    probes = ((art.get("calibration") or {}).get("probe") or {}).get("probes") or []
    py = [float(p["python_ms"]) for p in probes if isinstance(p, dict) and "python_ms" in p]
    if ref is None or not py:
        raise InputError("the artifact has no probe record (calibration.probe.ref_ms and .probes)",
                         file=str(path), field="calibration.probe")
    return ref, float(np.median(py))


def steady_steps(run_dir: Path, artifact: Path, factor_of=None) -> pd.DataFrame:
    """The steady steps of ``run_dir``: ``start_s, end_s, t_s`` (midpoint), ``measured_s``,
    ``predicted_s`` (s; ``artifact`` at host factor 1) and ``r`` (their ratio), in time order.
    With ``factor_of`` (a dict signal -> callable t_s -> host factor) also, per signal,
    ``<signal>_factor`` (at the step's midpoint) and ``<signal>_r_model`` (measured over the
    prediction of ``artifact`` with its host terms times that factor), and ``host_elasticity``:
    d log predicted / d log host factor at 1 (by a ``ELASTICITY_STEP`` difference; the slope of log
    r on log factor the model expects if the host followed the probe: ~1 host-bound, ~0 GPU-bound).

    Raises:
        InputError: a file of the run directory is missing or malformed (``validate.load_run``), or
            the artifact is unreadable or of another GPU type.
    """
    st, jobs, gpu = predicted_steps(run_dir, artifact)
    st = st[~st["first"]].copy()
    st["measured_s"] = st.span_s
    st["t_s"] = (st.start_s + st.end_s) / 2
    st["r"] = st.ratio
    cols = ["start_s", "end_s", "t_s", "measured_s", "predicted_s", "r"]
    if factor_of:
        from tlora_sim.sim.costmodel.profiled.artifact import load_artifact
        from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

        art = load_artifact(artifact)
        models: dict[float, object] = {}
        for s, at in factor_of.items():
            f = np.array([at(t) for t in st.t_s])
            st[f"{s}_factor"] = f
            pred = np.empty(len(st))
            for v in np.unique(f):
                m = models.get(float(v))
                if m is None:
                    m = models[float(v)] = ProfiledCostModel(speed_artifact(art, float(v)), checkpointing=False)
                sel = f == v
                pred[sel] = predicted_s(m, gpu, jobs, st[sel])
            st[f"{s}_r_model"] = st.measured_s / pred
            cols += [f"{s}_factor", f"{s}_r_model"]
        m = ProfiledCostModel(speed_artifact(art, 1 + ELASTICITY_STEP), checkpointing=False)
        st["host_elasticity"] = (predicted_s(m, gpu, jobs, st) / st.predicted_s - 1) / ELASTICITY_STEP
        cols.append("host_elasticity")
    return st.sort_values("t_s", kind="stable")[cols].reset_index(drop=True)


def speeds(run_dir: Path, ref_ms: float, ref_python_ms: float) -> dict[str, HostSpeed]:
    """The run's host factor through time from ``probe_ms`` and from ``python_ms`` (each
    ``factor_series`` with the validation's window, over its reference; see the module docstring).

    Raises:
        InputError: ``probes.csv`` missing, malformed or empty.
    """
    path = run_dir / "probes.csv"
    if not path.is_file():
        raise InputError("no probes.csv (run executed before the probe existed)", file=str(path))
    probes = read_probes(path)
    raw = pd.read_csv(path)
    if "python_ms" not in raw.columns:
        raise InputError("probes.csv lacks column python_ms", file=str(path))
    py = pd.DataFrame({"t_s": raw.t_s.astype(float), "probe_ms": raw.python_ms.astype(float)})
    py = py.sort_values("t_s", kind="stable").reset_index(drop=True)
    return {"probe": factor_series(probes, ref_ms, PROBE_WINDOW_S),
            "python": factor_series(py, ref_python_ms, PROBE_WINDOW_S)}


def windows(steps: pd.DataFrame, sp: dict[str, HostSpeed], width: float = WINDOW_S) -> pd.DataFrame:
    """One row per ``width``-s window [k width, (k + 1) width) holding at least one steady step:
    ``t0_s``, ``n_steps``, ``r_median`` and, per signal, the factor at the window's start
    (``<signal>_start``) and middle (``<signal>_mid``)."""
    k = np.floor(steps.t_s.to_numpy() / width).astype(int)
    g = steps.assign(k=k).groupby("k").r.agg(["size", "median"])
    out = pd.DataFrame({"t0_s": g.index.to_numpy() * width, "n_steps": g["size"].to_numpy(),
                        "r_median": g["median"].to_numpy()})
    for s in SIGNALS:
        out[f"{s}_start"] = [sp[s].at(t) for t in out.t0_s]
        out[f"{s}_mid"] = [sp[s].at(t + width / 2) for t in out.t0_s]
    return out


def association(factor: np.ndarray, r: np.ndarray) -> dict:
    """Pearson and Spearman correlation of ``r`` with ``factor`` and the least-squares slope of
    log r on log factor (NaN where fewer than 3 values or either is constant). Spearman ranks values
    rounded to 12 significant digits, so floating-point noise does not break ties."""
    f, r = np.asarray(factor, float), np.asarray(r, float)
    ok = np.isfinite(f) & np.isfinite(r) & (f > 0) & (r > 0)
    f, r = f[ok], r[ok]
    nan = {"n": int(len(f)), "pearson": np.nan, "spearman": np.nan, "slope_log": np.nan}
    if len(f) < 3 or np.ptp(f) == 0 or np.ptp(r) == 0:
        return nan
    return {"n": int(len(f)), "pearson": float(stats.pearsonr(f, r)[0]),
            "spearman": float(stats.spearmanr(*(np.array([float(f"{v:.12g}") for v in x]) for x in (f, r)))[0]),
            "slope_log": float(np.polyfit(np.log(f), np.log(r), 1)[0])}


def removal(factor: np.ndarray, r: np.ndarray) -> dict:
    """``median_abs_log_r`` (median |log r|), ``median_abs_log_r_f`` (median |log(r / factor)|) and
    ``removed_share`` (1 - the second over the first; NaN when the first is 0)."""
    a = float(np.median(np.abs(np.log(r))))
    b = float(np.median(np.abs(np.log(np.asarray(r, float) / np.asarray(factor, float)))))
    return {"median_abs_log_r": a, "median_abs_log_r_f": b, "removed_share": (1 - b / a) if a > 0 else np.nan}


def label(run_dir: Path) -> str:
    """``parent/name`` of a run directory (``A/tlora``; runs of workloads share policy names)."""
    return f"{run_dir.parent.name}/{run_dir.name}"


def track(run_dir: Path, artifact: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(table rows, windows, steps) of one run: one table row per (signal, at) with ``at`` the
    window's ``start`` or ``mid``: the window statistics (``association``) and the run's per-step
    ones (``median_r``, ``median_factor``, ``removal``; the same for both ``at``).

    Raises:
        InputError: see ``steady_steps``, ``speeds``, ``references``.
    """
    from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

    ref, ref_py = references(load_artifact(artifact), Path(artifact))
    sp = speeds(run_dir, ref, ref_py)
    st = steady_steps(run_dir, artifact, {s: sp[s].at for s in SIGNALS})
    if st.empty:
        raise InputError("no steady step", file=str(run_dir / "steps.csv"))
    win = windows(st, sp)
    rows = []
    for s in SIGNALS:
        per_step = per_step_stats(st, s)
        for at in ("start", "mid"):
            a = association(win[f"{s}_{at}"].to_numpy(), win.r_median.to_numpy())
            rows.append({"run": label(run_dir), "signal": s, "at": at, "windows": a.pop("n"), **a, **per_step})
    win.insert(0, "run", label(run_dir))
    st.insert(0, "run", label(run_dir))
    return pd.DataFrame(rows), win, st


def per_step_stats(st: pd.DataFrame, s: str) -> dict:
    """The per-step statistics of signal ``s`` over the ``steady_steps`` rows ``st``: ``steps``,
    ``median_r``, ``median_factor``, ``removal`` of the factor, and ``median_abs_log_r_model`` /
    ``removed_share_model`` (the same with the host-terms-only prediction), and the steps'
    ``median_host_elasticity``."""
    f = st[f"{s}_factor"].to_numpy()
    rm = removal(f, st.r.to_numpy())
    b = float(np.median(np.abs(np.log(st[f"{s}_r_model"].to_numpy()))))
    a = rm["median_abs_log_r"]
    return {"steps": len(st), "median_r": float(st.r.median()), "median_factor": float(np.median(f)), **rm,
            "median_abs_log_r_model": b, "removed_share_model": (1 - b / a) if a > 0 else np.nan,
            "median_host_elasticity": float(st.host_elasticity.median())}


def pooled(win: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
    """The ``track`` rows of all runs together (``run = "all"``): windows and steps pooled."""
    rows = []
    for s in SIGNALS:
        per_step = per_step_stats(st, s)
        for at in ("start", "mid"):
            a = association(win[f"{s}_{at}"].to_numpy(), win.r_median.to_numpy())
            rows.append({"run": "all", "signal": s, "at": at, "windows": a.pop("n"), **a, **per_step})
    return pd.DataFrame(rows)


def calibration_rows(path: Path) -> pd.DataFrame:
    """One row per signal of a calibrated artifact's host-bound points (``tokens <= HOST_BOUND_TOKENS``):
    ``measured_ms / calibrated_no_probe_ms`` against the point's factor (``probe_factor``; for
    ``python``, the median ``python_ms`` of the point's probes over the calibration's median).

    Raises:
        InputError: unreadable, or no ``calibration.points`` / probe record.
    """
    try:
        art = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the artifact ({type(e).__name__})", file=str(path)) from None
    _, ref_py = references(art, Path(path))
    pts = pd.DataFrame((art.get("calibration") or {}).get("points") or [])
    need = ["tokens", "measured_ms", "calibrated_no_probe_ms", "probe_factor"]
    if pts.empty or any(c not in pts.columns for c in need):
        raise InputError(f"calibration.points missing or lacking {need}", file=str(path), field="calibration.points")
    pr = pd.DataFrame(art["calibration"]["probe"]["probes"])
    py = pr.groupby("point").python_ms.median() / ref_py if "point" in pr.columns else pd.Series(dtype=float)
    pts["python_factor"] = [py.get(i, np.nan) for i in range(len(pts))]
    pts = pts[pts.tokens <= HOST_BOUND_TOKENS]
    r = (pts.measured_ms / pts.calibrated_no_probe_ms).to_numpy()
    rows = []
    for s, col in (("probe", "probe_factor"), ("python", "python_factor")):
        f = pts[col].to_numpy(dtype=float)
        ok = np.isfinite(f)
        a = association(f[ok], r[ok])
        rows.append({"calibration": Path(path).name, "signal": s, "points": a.pop("n"), **a,
                     "median_r": float(np.median(r[ok])), "median_factor": float(np.median(f[ok])),
                     **removal(f[ok], r[ok])})
    return pd.DataFrame(rows)


def figure(win: pd.DataFrame, path: Path) -> None:
    """Small multiples, one panel per run: the windows' median r (points) and the probe factor at
    the window's middle (line) against time (s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(win.run))
    ncol = min(4, len(runs))
    nrow = -(-len(runs) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.5 * nrow), sharey=True, squeeze=False)
    for ax, run in zip(axes.flat, runs):
        w = win[win.run == run]
        mid = w.t0_s + WINDOW_S / 2
        ax.axhline(1, color="0.8", lw=0.8)
        ax.plot(mid, w.probe_mid, "-", color="C0", lw=1.5, label="probe factor")
        ax.plot(mid, w.python_mid, ":", color="C2", lw=1.2, label="python_ms factor")
        ax.plot(mid, w.r_median, "o", color="C3", ms=3.5, label="median r (10 s)")
        a = association(w.probe_mid.to_numpy(), w.r_median.to_numpy())
        ax.set_title(f"{run}  (Pearson {a['pearson']:.2f})", fontsize=9)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(runs):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("r = measured / predicted;\nhost factor", fontsize=8)
    axes.flat[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tlora_sim.sim.executor.probe_track", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="executed run directories with probes.csv")
    ap.add_argument("--artifact", type=Path, required=True, help="calibrated artifact (with calibration.probe)")
    ap.add_argument("--calibrations", type=Path, nargs="*", default=[],
                    help="calibrated artifacts whose points to analyse as well")
    ap.add_argument("--out", type=Path, default=None, help="write the run table here (and <stem>_calibrations.csv)")
    ap.add_argument("--figure", type=Path, default=None, help="write the small-multiples figure here (PNG)")
    args = ap.parse_args(argv)
    try:
        parts = [track(d, args.artifact) for d in args.runs]
        cal = pd.concat([calibration_rows(p) for p in args.calibrations]) if args.calibrations else None
    except InputError as e:
        print(f"error: {e}")
        return 2
    win = pd.concat([p[1] for p in parts], ignore_index=True)
    st = pd.concat([p[2] for p in parts], ignore_index=True)
    table = pd.concat([p[0] for p in parts] + [pooled(win, st)], ignore_index=True)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
        if cal is not None:
            print()
            print(cal.round(3).to_string(index=False))
    if args.out:
        table.round(6).to_csv(args.out, index=False)
        print(f"wrote {args.out}")
        if cal is not None:
            cp = args.out.with_name(f"{args.out.stem}_calibrations.csv")
            cal.round(6).to_csv(cp, index=False)
            print(f"wrote {cp}")
    if args.figure:
        figure(win, args.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
