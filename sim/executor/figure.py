"""``validation.png``/``.pdf``: simulated against real JCT per job, one panel per policy run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def plot_validation(jobs: pd.DataFrame, out: Path) -> list[Path]:
    """Draw ``validation_jobs.csv`` rows (``policy, jct_s_real, jct_s_sim, abs_error``): one panel
    per policy in the project's display order and colours, the y = x line, each panel titled with
    its median and p90 per-job error. Returns the written files (``out/validation.png``, ``.pdf``).

    Raises:
        ValueError: ``jobs`` is empty.
    """
    from tlora_sim.sim.report import style as fs

    if jobs.empty:
        raise ValueError("no job to draw")
    policies = fs.policy_order(jobs.policy)
    styles = fs.policy_styles(policies)
    with fs.style_context():
        fig = fs.new_figure(fs.DOUBLE_COLUMN_WIDTH_IN, 2.4)
        axes = np.atleast_1d(fig.subplots(1, len(policies), squeeze=False)[0])
        for ax, pol in zip(axes, policies):
            p, st = jobs[jobs.policy == pol], styles[pol]
            ax.scatter(p.jct_s_real, p.jct_s_sim, s=12, color=st.color, marker=st.marker, label=pol)
            hi = float(max(p.jct_s_real.max(), p.jct_s_sim.max())) * 1.05
            ax.plot([0, hi], [0, hi], color="0.5", lw=0.8, ls="--")
            ax.set_xlim(0, hi)
            ax.set_ylim(0, hi)
            ax.set_title(f"{pol}: error p50 {p.abs_error.median():.0%}, p90 {p.abs_error.quantile(0.9):.0%}")
            ax.set_xlabel(fs.axis_label("Real JCT", "s"))
        axes[0].set_ylabel(fs.axis_label("Simulated JCT", "s"))
        return fs.save_figure(fig, out, "validation")
