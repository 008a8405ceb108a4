"""The per-tenant figure of a run directory (``figures/tenants.*``), drawn from its ``tenants.csv``.

Two panels, one bar per tenant (at most :data:`MAX_TENANTS`, the largest by GPU-hours): average JCT
and average queueing delay (h), and each tenant's finish-time fairness rho (mean, with its max as a
marker; the dashed line at 1 is the fair share, docs/metrics.md "Tenants and fairness"). Drawn only
where the trace has two or more tenants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from tlora_sim.sim.report import style as fs
from tlora_sim.traces.errors import InputError

TENANTS_CSV = "tenants.csv"
MAX_TENANTS = 20
_NEEDED = ("tenant", "avg_jct_s", "avg_queue_s", "avg_rho", "max_rho", "gpu_hours")


def plot_tenants(run_dir: str | Path, formats: Iterable[str] = ("png", "pdf")) -> list[Path]:
    """Draw ``run_dir/figures/tenants.<fmt>`` from ``run_dir/tenants.csv``; returns the written files
    (none when the file is absent or names fewer than two tenants).

    Raises:
        InputError: ``tenants.csv`` unreadable or lacking a column of :data:`_NEEDED`.
    """
    path = Path(run_dir) / TENANTS_CSV
    if not path.is_file():
        return []
    try:
        df = pd.read_csv(path, keep_default_na=False, dtype={"tenant": str})
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise InputError(f"cannot read ({e})", file=str(path)) from None
    missing = [c for c in _NEEDED if c not in df.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", file=str(path), field=missing[0])
    if len(df) < 2:
        return []
    df = df.sort_values(["gpu_hours", "tenant"], ascending=[False, True]).head(MAX_TENANTS)
    x = np.arange(len(df))
    names = [t or "(none)" for t in df["tenant"]]
    with fs.style_context():
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.4)
        a, b = fig.subplots(nrows=1, ncols=2)
        a.bar(x - 0.2, df["avg_jct_s"] / 3600.0, 0.4, label="avg JCT")
        a.bar(x + 0.2, df["avg_queue_s"] / 3600.0, 0.4, label="avg queueing")
        a.set_ylabel(fs.axis_label("time", "h"))
        a.legend(fontsize=5)
        b.bar(x, df["avg_rho"], 0.6, label="mean rho")
        b.scatter(x, df["max_rho"], s=6, color="k", zorder=3, label="max rho")
        b.axhline(1.0, ls="--", lw=0.6, color="0.4")
        b.set_ylabel(fs.axis_label("finish-time fairness rho", "ratio"))
        b.legend(fontsize=5)
        for ax in (a, b):
            ax.set_xticks(x, names, rotation=60, ha="right", fontsize=5)
            ax.set_xlabel(fs.axis_label("tenant", "name"))
        return fs.save_figure(fig, Path(run_dir) / "figures", "tenants", formats)
