"""Fit the roofline model's LoRA constants to the measured kernel benchmark.

For each implementation, the time above the frozen base layer is fitted by least squares as
``passes x T x (d_in + d_out) x 2 bytes / HBM bandwidth + per_adapter_s x adapters`` over every
measured mix of ``profiler/data/kernel_bench_h100.csv`` (GPU time, H100). ``sim/costmodel/roofline.py``
quotes the result:

    python bench/calibrate_roofline.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
H100_BW = 3.35e12  # bytes/s, sim.cluster.GPUS["H100"]


def fit(csv: Path) -> pd.DataFrame:
    """One row per implementation: passes, per-adapter seconds, median relative error of the total."""
    d = pd.read_csv(csv)
    p = d.pivot_table(index=["layer", "ranks", "tokens", "n_adapters", "M"], columns="impl", values="ms").reset_index()
    d_in = p["layer"].str.split("x").str[0].astype(int)
    d_out = p["layer"].str.split("x").str[1].astype(int)
    unit_ms = (d_in + d_out) * 2 * p["M"] / H100_BW * 1e3
    rows = []
    for impl in [c for c in ("fused", "loop", "padded", "alone") if c in p.columns]:
        a = np.c_[unit_ms, p["n_adapters"] * 1e-3]
        coef, *_ = np.linalg.lstsq(a, (p[impl] - p["base"]).to_numpy(), rcond=None)
        err = np.median(np.abs((a @ coef + p["base"]) / p[impl] - 1))
        rows.append({"impl": impl, "passes": coef[0], "per_adapter_us": coef[1], "median_rel_err": err,
                     "mixes": len(p)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    print(fit(ROOT / "profiler" / "data" / "kernel_bench_h100.csv").to_string(index=False, float_format="%.3g"))
    sys.exit(0)
