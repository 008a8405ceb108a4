"""The shipped H100 artifact against a fused profile of the session-16 kernel (no torch; CPU).

    .venv/bin/python profiler/data/fused_recheck_h100_2026-11-26_h/check.py [FOLDER [OLD_FOLDER]]

Without arguments it checks this folder against ``../fused_profile_h100_2026-11-26``; FOLDER (a
folder holding another ``run_fused.py`` ``profile_h100.csv``, or an H200's ``profile_h200.csv``,
checked against the H200 artifact) and OLD_FOLDER (the profile its mixes
are compared with) check a later kernel the same way (``../fused_recheck_h100_2026-11-26_i``).

Reads this folder's ``profile_h100.csv`` (``run_fused.py`` on one H100 with the persistent GEMM in
the forward, kernels 78c700f83c59) and prints, per model and step size, the shipped artifact's
error on its fused mix rows (``profiler/fit.py``'s ``predict_rows``, the same predictions the
simulator makes), and each mix's measured step against the same mix measured with the previous
kernel in ``../fused_profile_h100_2026-11-26/profile_h100.csv`` (another lease: host-bound steps
move ~30% between machines there, so the GPU-bound ones, >= 10 ms, carry the kernel's effect).
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from pathlib import Path

from tlora_sim.profiler import fit
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
SMALL_MS = 10.0
KEY = ["model", "ranks", "batch_sizes", "seq_lens"]


def mix_rows(path: Path) -> pd.DataFrame:
    """The fused mix rows (kind ``mix``, no error) of a profile CSV."""
    df = pd.read_csv(path)
    return df[(df["kind"] == "mix") & (df["plan"] == "fused") & df["error"].isna()].copy()


def describe(a: np.ndarray) -> str:
    """``n, median, p90, worst`` of absolute errors in percent."""
    if not len(a):
        return "-"
    return f"{len(a):3d} rows  median {np.median(a):5.1f}%  p90 {np.quantile(a, .9):5.1f}%  worst {a.max():5.1f}%"


def main(folder: Path = HERE, old_folder: Path = DATA / "fused_profile_h100_2026-11-26") -> None:
    """Print the artifact's errors on ``folder``'s fused mix rows and the step ratios against
    ``old_folder``'s same mixes. The GPU is the one whose profile ``folder`` holds
    (``profile_h200.csv``: the H200 artifact, else the H100's). Raises FileNotFoundError if either
    profile CSV is missing."""
    gpu = "h200" if (folder / "profile_h200.csv").exists() else "h100"
    art = load_artifact(DATA / f"costmodel_{gpu}.json")
    new = mix_rows(folder / f"profile_{gpu}.csv")
    pred = fit.predict_rows(art, new)
    pred["signed"] = pred.predicted_ms / pred.measured_ms - 1
    print(f"artifact {art.get('id', '?')} on {len(pred)} fused mix rows of {folder.name}")
    for model, g in [("all", pred), *pred.groupby("model")]:
        for name, s in (("small", g[g.measured_ms < SMALL_MS]), ("large", g[g.measured_ms >= SMALL_MS])):
            bias = np.median(s.signed) * 100 if len(s) else float("nan")
            print(f"  {model:12s} {name} (<>{SMALL_MS:g} ms): {describe(s.ape.to_numpy() * 100)}"
                  f"   median signed {bias:+.1f}%")
    old = mix_rows(old_folder / f"profile_{gpu}.csv")
    both = new.merge(old, on=KEY, suffixes=("_new", "_old"))
    both["ratio"] = both.step_ms_new / both.step_ms_old
    print(f"\nsame mixes measured with both kernels: {len(both)}; step new / old ({old_folder.name}),"
          " median (p10-p90)")
    for model, g in [("all", both), *both.groupby("model")]:
        for name, s in (("small", g[g.step_ms_old < SMALL_MS]), ("large", g[g.step_ms_old >= SMALL_MS])):
            if len(s):
                q = np.quantile(s.ratio, [.1, .5, .9])
                print(f"  {model:12s} {name}: {len(s):3d} mixes  {q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})")


if __name__ == "__main__":
    main(*(Path(a).resolve() for a in sys.argv[1:3]))
