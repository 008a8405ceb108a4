"""Issue 41: figures a reviewer accepts -- the reference first and in grey, mLoRA and tLoRA apart,
time series smoothed over a stated window, the speed-up figure, footers that name the reference,
discipline, cost model and extrapolated share, sweep reports with short labels and the cluster,
per-policy ticks in the seeds figure."""

from __future__ import annotations

import colorsys

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report.figures import speedup_figure, throughput_time_figure
from tlora_sim.sim.report.rundata import smoothing_window, window_label, window_means


def _hue(hex_color: str) -> float:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hsv(r, g, b)[0]


def test_reference_first_in_grey_and_mlora_tlora_apart():
    styles = fs.policy_styles(["tlora", "mlora", "independent-backfill", "alto", "ours"])
    assert list(styles)[0] == "independent-backfill"
    grey = styles["independent-backfill"].color
    r, g, b = (int(grey[i:i + 2], 16) for i in (1, 3, 5))
    assert r == g == b  # neutral grey
    dh = abs(_hue(styles["mlora"].color) - _hue(styles["tlora"].color))
    assert min(dh, 1 - dh) > 0.25  # opposite sides of the wheel (orange vs blue), not two oranges
    colors = [s.color for s in styles.values()]
    assert len(set(colors)) == len(colors) and set(colors) - {grey} <= set(fs.OKABE_ITO.values())


def test_window_means_keep_the_integral_and_the_window_is_stated():
    edges = np.array([0.0, 100.0, 250.0, 4000.0, 86400.0 * 14])
    means = np.array([5.0, 0.0, 7.0, 1.0])
    w = smoothing_window(edges[-1] - edges[0])
    assert (edges[-1] - edges[0]) / w <= 60 and window_label(w) in ("6 h", "12 h", "1 day")
    e, m = window_means(edges, means, w)
    assert np.sum(m * np.diff(e)) == pytest.approx(np.sum(means * np.diff(edges)))
    assert np.allclose(np.diff(e)[:-1], w)
    fig = throughput_time_figure({"tlora": (edges, means * 1e5)})
    assert "each point the mean over" in fig.get_axes()[0].get_xlabel()
    assert "days" in fig.get_axes()[0].get_xlabel()  # weeks-long: days, not hours


def test_speedup_figure_bars_and_reference_line(tmp_path):
    summary = pd.DataFrame({"policy": ["independent-backfill", "mlora", "tlora"],
                            "avg_jct_speedup": [1.0, 0.8, 2.3], "p90_jct_speedup": [1.0, 0.9, 2.4],
                            "throughput_x": [1.0, 1.0, 1.1], "makespan_speedup": [1.0, 1.0, 1.05]})
    with fs.style_context():
        fig = speedup_figure(summary)
        fs.save_figure(fig, tmp_path, "speedup", ["png"])
    ax = fig.get_axes()[0]
    assert len(ax.patches) == 2 * 4  # the reference is the line at 1, not bars
    labels = {t.get_text() for t in ax.texts}
    assert {"2.30\u00d7", "0.80\u00d7"} <= labels
    assert any(line.get_ydata()[0] == 1.0 for line in ax.get_lines())
    with pytest.raises(ValueError):
        speedup_figure(summary.iloc[:1])


def test_compare_figures_footer_and_speedup(tmp_path):
    from tlora_sim.sim.cli.main import main

    out = tmp_path / "c"
    assert main(["compare", "--trace", "synthetic:jobs=20,seed=4", "--cluster", "1x8xH100", "--policies", "tlora",
                 "--out", str(out), "--no-progress", "-q"]) == 0
    assert (out / "figures" / "speedup.png").is_file() and (out / "figures" / "bars.png").is_file()
    from tlora_sim.sim.report.plots import figure_footer
    from tlora_sim.sim.report.rundata import load_compare

    _, runs = load_compare(out)
    footer = figure_footer(list(runs.values()))
    assert "reference independent-backfill" in footer and "discipline default" in footer
    assert "cost model h100-" in footer and "of GPU-time extrapolated" in footer and "20 of 20 jobs kept" in footer
    assert max(len(line) for line in footer.splitlines()) <= fs.FOOTER_CHARS
    from tlora_sim.sim.report.plots import plot_any

    files = plot_any(out, formats=["png"], policies=["independent-backfill", "tlora"], metrics=["avg_jct_s"],
                     size=(5.0, 2.0))
    assert len(files) == 6


def test_sweep_report_short_labels_and_cluster_in_footer(tmp_path):
    from tlora_sim.sim.experiments import sweep as sw
    from tlora_sim.sim.report import sweep_report

    p = tmp_path / "s.toml"
    p.write_text('traces = ["synthetic:jobs=12,seed=1", "synthetic:jobs=12,seed=2,load=0.9"]\n'
                 'clusters = ["1x8xH100"]\npolicies = ["tlora"]\n[policy_options.tlora]\n'
                 'ordering = ["urgency", "backfill"]\n')
    res = sw.run_sweep(sw.load_sweep(p), tmp_path / "out", workers=1, progress=False)
    assert res.total == 2 * 3 and not res.failed  # reference + two orderings, per trace
    seen = {}
    real = sweep_report.ci_bars

    def spy(table, label, out_dir, name, formats, footer, **kw):
        seen.update(label=list(label), footer=footer, series=list(table[kw.get("series_col", "policy")]))
        return real(table, label, out_dir, name, formats, footer, **kw)

    sweep_report.ci_bars = spy
    try:
        files = sweep_report.plot_sweep(tmp_path / "out", formats=["png"])
    finally:
        sweep_report.ci_bars = real
    assert files and set(seen["label"]) == {"C1", "C2"}
    assert "cluster 1x8xH100" in seen["footer"] and "C1: synthetic:jobs=12,seed=1" in seen["footer"]
    assert {"tlora ordering=urgency", "tlora ordering=backfill", "independent-backfill"} == set(seen["series"])
    assert sweep_report.plot_sweep(tmp_path / "out", plots=False) == []
