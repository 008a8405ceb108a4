"""Figures drawn from synthetic run / comparison directories (sim.plots, sim.figstyle)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.core.cluster import parse_cluster
from tlora_sim.sim.experiments.spec import ExperimentSpec
from tlora_sim.sim.experiments.spec import axes as spec_axes
from tlora_sim.sim.report import style as fs
from tlora_sim.sim.report import figures, load_sweep, plots, rundata
from tlora_sim.traces.errors import InputError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
POLICIES = ("tlora", "independent", "mlora")  # deliberately not in display order

SUMMARY_COLUMNS = ["policy", "jobs", "avg_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "avg_queue_s",
                   "makespan_s", "throughput_tokens_per_s", "gpu_alloc_util", "gpu_compute_util",
                   "avg_slowdown"]


def _jobs(rng: np.random.Generator, n: int, speed: float) -> pd.DataFrame:
    submit = np.sort(rng.uniform(0, 2 * 86400, n))
    iso = rng.lognormal(mean=8.0, sigma=1.2, size=n)
    queue = rng.exponential(1800.0, n) / speed
    jct = iso * rng.uniform(1.0, 1.6, n) + queue
    return pd.DataFrame({
        "job_id": [f"j{i}" for i in range(n)], "index": np.arange(n),
        "tenant": rng.choice(["a", "b"], n), "model": "llama3-8b",
        "rank": rng.choice([4, 8, 16], n), "batch_size": 4, "seq_len": 1024,
        "num_gpus": rng.choice([1, 2, 4], n), "total_steps": 1000, "tokens_per_step": 4096,
        "submit_time_s": submit, "start_time_s": submit + queue, "finish_time_s": submit + jct,
        "jct_s": jct, "queue_s": queue, "isolated_runtime_s": iso, "slowdown": jct / iso,
        "max_group_size": rng.integers(1, 4, n),
    })


def _timeline(rng: np.random.Generator, n: int, t_end: float) -> pd.DataFrame:
    t = np.concatenate(([0.0], np.sort(rng.uniform(0, t_end, n - 2)), [t_end]))
    alloc = rng.uniform(0.2, 1.0, n)
    alloc[-1] = 0.0
    return pd.DataFrame({
        "time_s": t, "running_jobs": rng.integers(0, 20, n), "queued_jobs": rng.integers(0, 5, n),
        "groups": rng.integers(0, 8, n), "gpus_allocated": (alloc * 32).round(), "gpus_total": 32,
        "tokens_per_s": alloc * 2.5e5, "model_flops_per_s": alloc * 1e15, "gpu_alloc_util": alloc,
        "gpu_compute_util": alloc * 0.4,
    })


def _write_run(run_dir: Path, policy: str, seed: int, speed: float = 1.0, *, timeline: bool = True,
               summary: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    jobs = _jobs(rng, 40, speed)
    jobs.loc[len(jobs) - 1, ["finish_time_s", "jct_s", "slowdown"]] = np.nan  # one unfinished job
    jobs.to_csv(run_dir / "jobs.csv", index=False)
    t_end = float(jobs["finish_time_s"].max())
    if timeline:
        _timeline(rng, 60, t_end).to_csv(run_dir / "timeline.csv", index=False)
    jct = jobs["jct_s"].dropna()
    row = {"policy": policy, "jobs": len(jobs), "avg_jct_s": jct.mean(), "p50_jct_s": jct.quantile(0.5),
           "p90_jct_s": jct.quantile(0.9), "p99_jct_s": jct.quantile(0.99),
           "avg_queue_s": jobs["queue_s"].mean(), "makespan_s": t_end,
           "throughput_tokens_per_s": 1.2e5 * speed, "gpu_alloc_util": min(0.5 * speed, 1.0),
           "gpu_compute_util": 0.2 * speed, "avg_slowdown": jobs["slowdown"].mean()}
    (run_dir / "config.json").write_text(json.dumps(
        {"policy": policy, "trace": "synthetic:test", "cluster": "4x8xH100", "seed": seed}))
    if summary:
        (run_dir / "summary.json").write_text(json.dumps(row))
    return row


def _write_compare(out: Path, policies=POLICIES, **kwargs) -> Path:
    rows = [_write_run(out / p, p, seed=i, speed=1.0 + i, **kwargs) for i, p in enumerate(policies)]
    pd.DataFrame(rows, columns=SUMMARY_COLUMNS).to_csv(out / "summary.csv", index=False)
    return out


def _assert_valid(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000, path
    if path.suffix == ".png":
        assert data.startswith(PNG_MAGIC), path
    elif path.suffix == ".pdf":
        assert data.startswith(b"%PDF-"), path
        assert b"%%EOF" in data[-64:], path
    else:
        raise AssertionError(f"unexpected file {path}")


def _expected(figdir: Path, names=rundata.FIGURE_NAMES, formats=("png", "pdf")) -> list[Path]:
    return [figdir / f"{n}.{f}" for n in names for f in formats]


def test_plot_run_writes_all_figures(tmp_path):
    run = tmp_path / "run"
    _write_run(run, "tlora", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rundata.PlotWarning)
        paths = plots.plot_run(run)
    assert paths == _expected(run / "figures")
    for p in paths:
        _assert_valid(p)
    # no temp files are left behind
    assert sorted(x.name for x in (run / "figures").iterdir()) == sorted(p.name for p in paths)


def test_plot_compare_plot_any_and_reproducible_bytes(tmp_path):
    out = _write_compare(tmp_path / "cmp")
    with warnings.catch_warnings():
        warnings.simplefilter("error", rundata.PlotWarning)
        paths = plots.plot_compare(out)
    assert paths == _expected(out / "figures")
    for p in paths:
        _assert_valid(p)
    pdfs = {p: p.read_bytes() for p in paths if p.suffix == ".pdf"}
    # plot_any detects the comparison; the same inputs give byte-identical PDFs
    again = plots.plot_any(out, formats=("pdf",))
    assert again == list(pdfs)
    assert all(p.read_bytes() == data for p, data in pdfs.items())
    # ... and a run directory
    run_paths = plots.plot_any(out / "mlora", formats=["png"])
    assert run_paths == _expected(out / "mlora" / "figures", formats=("png",))


def test_missing_optional_files_skip_figures_with_warning(tmp_path):
    run = tmp_path / "run"
    _write_run(run, "alto", seed=3, timeline=False, summary=False)
    with pytest.warns(rundata.PlotWarning) as record:
        paths = plots.plot_run(run, formats=("png",))
    assert [p.name for p in paths] == ["jct_cdf.png", "slowdown_cdf.png"]
    text = " ".join(str(w.message) for w in record)
    assert "timeline.csv" in text and "summary.json" in text

    # A policy in summary.csv without a run directory: bars keep it, the other figures leave it out.
    out = _write_compare(tmp_path / "cmp", policies=("independent", "tlora"))
    summary = pd.read_csv(out / "summary.csv")
    extra = summary.iloc[[1]].assign(policy="tlora-nogroup")
    pd.concat([summary, extra]).to_csv(out / "summary.csv", index=False)
    with pytest.warns(rundata.PlotWarning, match="tlora-nogroup"):
        paths = plots.plot_compare(out, formats=("png",))
    assert [p.name for p in paths] == [f"{n}.png" for n in rundata.FIGURE_NAMES]


def test_wrong_directory_raises_input_error(tmp_path):
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    (empty / "notes.txt").write_text("hi")
    with pytest.raises(InputError, match="nothing_here") as err:
        plots.plot_any(empty)
    assert "jobs.csv" in str(err.value) and "summary.csv" in str(err.value)
    with pytest.raises(InputError, match="does_not_exist"):
        plots.plot_any(tmp_path / "does_not_exist")
    with pytest.raises(InputError, match="jobs.csv"):
        plots.plot_run(empty)
    with pytest.raises(InputError, match="summary.csv"):
        plots.plot_compare(empty)
    # malformed files name the file, row and field
    run = tmp_path / "bad"
    _write_run(run, "tlora", seed=4)
    jobs = pd.read_csv(run / "jobs.csv")
    jobs["jct_s"] = jobs["jct_s"].astype(object)
    jobs.loc[2, "jct_s"] = "soon"
    jobs.to_csv(run / "jobs.csv", index=False)
    with pytest.raises(InputError, match=r"jobs\.csv, row 3, field 'jct_s'"):
        plots.plot_run(run)
    with pytest.raises(InputError, match="format"):
        plots.plot_run(tmp_path / "bad", formats=("gif",))


def test_policy_styles_stable_and_distinct():
    names = ["ours", "tlora-nogroup", "tlora", "alto", "independent", "mlora", "lorafusion"]
    styles = fs.policy_styles(names)
    # an ablation follows its base policy, in the base's colour but its own line style
    assert list(styles) == ["independent", "mlora", "lorafusion", "alto", "tlora", "tlora-nogroup",
                            "ours"]
    assert fs.policy_styles(reversed(names)) == styles
    assert styles["tlora-nogroup"].color == styles["tlora"].color
    colors = [s.color for n, s in styles.items() if not n.endswith("-nogroup")]
    assert len(set(colors)) == len(colors)
    assert set(colors) <= set(fs.OKABE_ITO.values())
    assert len({s.linestyle for s in styles.values()}) == len(styles)
    # known policies keep their look whatever else is plotted
    for subset in (["tlora"], ["independent", "tlora"], ["tlora", "zzz", "aaa"]):
        sub = fs.policy_styles(subset)
        assert sub["tlora"] == fs.PolicyStyle(**{**styles["tlora"].__dict__, "order": sub["tlora"].order})
    # many unknown policies: (colour, line style) pairs stay distinct
    many = fs.policy_styles([f"abl{i}" for i in range(10)])
    assert len({(s.color, s.linestyle) for s in many.values()}) == 10


def test_time_weighted_bins_downsamples_and_conserves_integral():
    rng = np.random.default_rng(0)
    n = 1_000_000
    t = np.cumsum(rng.exponential(30.0, n))
    t[5:8] = t[5]  # same-instant rows: only the last one holds (the others have zero length)
    v = rng.uniform(0.0, 3e5, n)
    t_end = float(t[-1]) + 100.0
    edges, means = rundata.time_weighted_bins(t, v, t_end_s=t_end)
    assert len(means) <= rundata.MAX_POINTS_PER_LINE
    assert len(edges) == len(means) + 1
    assert edges[0] == t[0] and edges[-1] == t_end
    widths = np.diff(np.append(t, t_end))
    exact = float(np.sum(v * widths))
    assert float(np.sum(means * np.diff(edges))) == pytest.approx(exact, rel=1e-9)
    assert means.min() >= v.min() and means.max() <= v.max()

    # short series come back exactly; the zero-length last row ends the series
    e, m = rundata.time_weighted_bins([0.0, 10.0, 10.0, 30.0], [1.0, 5.0, 2.0, 0.0])
    assert e.tolist() == [0.0, 10.0, 30.0] and m.tolist() == [1.0, 2.0]
    e, m = rundata.time_weighted_bins([0.0, 10.0, 30.0], [1.0, 2.0, 4.0], t_end_s=40.0, max_bins=2)
    assert e.tolist() == [0.0, 20.0, 40.0] and m.tolist() == [1.5, 3.0]
    e, m = rundata.time_weighted_bins([], [])
    assert e.size == 0 and m.size == 0


def test_million_row_timeline_plots_fast(tmp_path):
    run = tmp_path / "big"
    _write_run(run, "tlora", seed=5)
    rng = np.random.default_rng(5)
    n = 1_000_000
    t = np.sort(rng.uniform(0.0, 30 * 86400.0, n))
    util = rng.uniform(0, 1, n)
    big = pd.DataFrame({"time_s": t, "tokens_per_s": util * 1e6, "gpu_alloc_util": util,
                        "gpu_compute_util": util / 3})
    pa = pytest.importorskip("pyarrow")
    import pyarrow.csv as pa_csv  # 10x faster than DataFrame.to_csv for a million rows

    pa_csv.write_csv(pa.Table.from_pandas(big, preserve_index=False), run / "timeline.csv")
    run_data = rundata.load_run(run)
    binned = rundata.read_timeline(run_data)
    for edges, means in binned.values():
        assert len(means) <= rundata.MAX_POINTS_PER_LINE
    paths = plots.plot_run(run, formats=("png",))
    assert run / "figures" / "throughput_time.png" in paths


def test_import_needs_no_display_and_leaves_backend_alone(tmp_path):
    code = ("import os, sys; os.environ.pop('DISPLAY', None); "
            "import tlora_sim.sim.report.plots, tlora_sim.sim.report.style; "
            "assert 'matplotlib.pyplot' not in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_cli_main(tmp_path, capsys):
    out = _write_compare(tmp_path / "cmp", policies=("independent", "tlora"))
    assert plots.main([str(out), "--formats", "png"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(p) for p in _expected(out / "figures", formats=("png",))]
    assert plots.main([str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_save_figure_atomic_and_units(tmp_path):
    with fs.style_context():
        fig = fs.new_figure()
        ax = fig.add_subplot()
        ax.plot([1, 2], [3, 4])
        ax.set_xlabel("Time")  # no unit
        with pytest.raises(ValueError, match="unit"):
            fs.save_figure(fig, tmp_path, "bad")
        ax.set_xlabel(fs.axis_label("Time", "s"))
        ax.set_ylabel(fs.axis_label("Rate", "tokens/s"))
        paths = fs.save_figure(fig, tmp_path / "sub", "good", ("png", "pdf"))
    assert [p.name for p in paths] == ["good.png", "good.pdf"]
    for p in paths:
        _assert_valid(p)
    assert sorted(x.name for x in (tmp_path / "sub").iterdir()) == ["good.pdf", "good.png"]
    assert not list(tmp_path.glob("bad*"))


# --------------------------------------------------------------------------------------------
# Queueing delay against offered load, relative table, many-policy bars
# --------------------------------------------------------------------------------------------

SWEEP_POLICIES = ("independent", "tlora")


def _write_sweep_point(out: Path, trace: str, cluster: str = "4x8xH100", lora_dist: str = "tlora",
                       speed: float = 1.0, policies=SWEEP_POLICIES, axes: bool = True) -> Path:
    """A comparison directory whose runs record ``trace``, ``cluster`` and (``axes``) the axes as
    replay.py does."""
    _write_compare(out, policies=policies, timeline=False)
    base_q = pd.read_csv(out / policies[0] / "jobs.csv")["queue_s"]
    for i, pol in enumerate(policies):
        jobs = pd.read_csv(out / pol / "jobs.csv")
        jobs["queue_s"] = base_q / speed * (1 + i)  # a known delay: policy i waits (1 + i)x the first
        jobs.to_csv(out / pol / "jobs.csv", index=False)
        inputs = {"trace": trace, "policy": pol, "cluster": cluster, "seed": 0, "lora_dist": lora_dist,
                  "policy_options": {}, "regroup_pause_s": 30.0}
        config = {"inputs": inputs, "policy": pol, "trace": trace, "cluster": cluster}
        if axes:  # what replay records (sim/experiments/spec.py axes)
            config["axes"] = spec_axes(ExperimentSpec(**inputs), parse_cluster(cluster).total_gpus)
        (out / pol / "config.json").write_text(json.dumps(config))
    summary = pd.read_csv(out / "summary.csv")
    summary["avg_queue_s"] = [pd.read_csv(out / p / "jobs.csv")["queue_s"].mean() for p in summary["policy"]]
    summary.to_csv(out / "summary.csv", index=False)
    return out


def _sweep(root: Path) -> Path:
    spec = "synthetic:jobs=40,seed=5,load={},gpus=32,max_gpus=8"
    for i, load in enumerate((0.5, 0.9, 1.1)):  # p0-p2: the load sweep (p10 sorts after p2)
        _write_sweep_point(root / f"p{10 if i == 2 else i}", spec.format(load), speed=2.0 - load)
    _write_sweep_point(root / "p3", spec.format(0.8), cluster="3x8xH100")     # other cluster: alone
    _write_sweep_point(root / "p4", spec.format(0.9))                          # same as p1: dropped
    _write_sweep_point(root / "itp", "itp:cluster02.csv.gz")                   # no load at all
    return root


def test_queue_vs_load_points_and_figure(tmp_path):
    root = _sweep(tmp_path / "sens")
    assert [d.name for d in load_sweep.find_compare_dirs(root)] == ["itp", "p0", "p1", "p3", "p4", "p10"]
    with pytest.warns(rundata.PlotWarning) as record:
        points = load_sweep.load_sweep_points(load_sweep.find_compare_dirs(root))
    text = " ".join(str(w.message) for w in record)
    assert "itp" in text and "load=" in text and "p3" in text
    assert set(points["series"]) == {1}
    assert points["load"].tolist() == [0.5, 0.5, 0.9, 0.9, 1.1, 1.1]
    assert points["policy"].tolist() == ["independent", "tlora"] * 3
    assert [Path(d).name for d in points["compare_dir"]] == ["p0", "p0", "p1", "p1", "p10", "p10"]
    for _, row in points.iterrows():
        q = pd.read_csv(Path(row["compare_dir"]) / row["policy"] / "jobs.csv")["queue_s"].dropna()
        assert row["avg_queue_s"] == pytest.approx(q.mean())
        assert row["p90_queue_s"] == pytest.approx(np.percentile(q, 90))
    # tlora's delays are twice independent's by construction
    wide = points.pivot(index="load", columns="policy", values="avg_queue_s")
    assert np.allclose(wide["tlora"], 2 * wide["independent"])

    # the figure: one line per policy over the three loads, in both panels, units on every axis
    with fs.style_context():
        fig = load_sweep.queue_vs_load_figure(points)
    axes = fig.get_axes()
    assert len(axes) == 2 and not fs.missing_units(fig)
    for ax in axes:
        labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert labels == ["independent", "tlora"]
        assert all(list(ln.get_xdata()) == [0.5, 0.9, 1.1] for ln in ax.get_lines()[:2])
    unit = axes[0].get_ylabel()
    scale = {"(s)": 1.0, "(min)": 60.0, "(h)": 3600.0}[unit[unit.rindex("("):]]
    assert axes[0].get_lines()[0].get_ydata() == pytest.approx(wide["independent"].to_numpy() / scale)

    # plot_any on the parent: the queueing figure in parent/figures
    with pytest.warns(rundata.PlotWarning):
        paths = plots.plot_any(root, formats=("png", "pdf"))
    assert paths == [root / "figures" / "queue_vs_load.png", root / "figures" / "queue_vs_load.pdf"]
    for p in paths:
        _assert_valid(p)


def test_queue_vs_load_offered_load_explicit_loads_and_errors(tmp_path):
    # A second sweep on 16 GPUs: offered load = load x gpus / cluster GPUs, its own figure.
    root = tmp_path / "two"
    spec = "synthetic:jobs=40,seed=5,load={},gpus=32"
    for i, load in enumerate((0.4, 0.6)):
        _write_sweep_point(root / f"a{i}", spec.format(load))
        _write_sweep_point(root / f"b{i}", spec.format(load), cluster="2x8xH100")
    points = load_sweep.load_sweep_points(load_sweep.find_compare_dirs(root))
    assert sorted(set(points["series"])) == [1, 2]
    by_series = points.groupby("series")["load"].unique()
    assert list(by_series[1]) == [0.4, 0.6] and list(by_series[2]) == pytest.approx([0.8, 1.2])
    paths = load_sweep.plot_queue_vs_load(root, formats=("png",))
    assert [p.name for p in paths] == ["queue_vs_load.png", "queue_vs_load_2.png"]

    # Real traces carry no load: an explicit mapping makes them one sweep, output where asked.
    itp = [_write_sweep_point(tmp_path / "itp" / n, "itp:cluster02.csv.gz", cluster=c)
           for n, c in (("big", "16x8xH100"), ("small", "12x8xH100"))]
    with pytest.raises(InputError, match="no load sweep"):
        with pytest.warns(rundata.PlotWarning):
            load_sweep.load_sweep_points(itp)
    paths = load_sweep.plot_queue_vs_load(itp, out_dir=tmp_path / "figs", formats=["png"],
                                     loads={"big": 0.6, str(itp[1]): 0.8})
    assert paths == [tmp_path / "figs" / "queue_vs_load.png"]
    with pytest.raises(InputError, match="no load given"):
        load_sweep.load_sweep_points(itp, loads={"big": 0.6})
    # a directory holding one comparison only is not a sweep; nor is an empty one
    lonely = tmp_path / "lonely"
    _write_sweep_point(lonely / "only", spec.format(0.5))
    with pytest.raises(InputError, match="two or more comparison"):
        plots.plot_any(lonely)
    with pytest.raises(InputError, match="summary.csv"):
        load_sweep.plot_queue_vs_load(tmp_path / "figs")
    # a malformed axes record names the run's config.json and the axis
    bad = tmp_path / "bad"
    _write_sweep_point(bad / "x", spec.format(0.4))
    _write_sweep_point(bad / "y", spec.format(0.5))
    for pol in SWEEP_POLICIES:
        cfg = json.loads((bad / "x" / pol / "config.json").read_text())
        cfg["axes"]["load"] = "lots"
        (bad / "x" / pol / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"bad[/\\]x[/\\]independent[/\\]config.json.*field 'axes.load'"):
        plots.plot_any(bad)


def test_relative_table_matches_summary(tmp_path):
    out = _write_compare(tmp_path / "cmp")
    summary = pd.read_csv(out / "summary.csv")
    with pytest.raises(InputError, match="independent-backfill.*available policies: .*independent"):
        plots.relative_table(summary)  # the default is the reference baseline, named with the choices
    rel = plots.relative_table(summary, baseline="independent")
    assert rel["policy"].tolist() == ["independent", "mlora", "tlora"]
    assert [c for c in rel.columns if c != "policy"] == [c for c, _, _ in plots.RELATIVE_COLUMNS]
    s = summary.set_index("policy")
    r = rel.set_index("policy")
    assert r.loc["independent"].tolist() == pytest.approx([1.0] * 6)
    assert r.at["tlora", "throughput_x"] == pytest.approx(s.at["tlora", "throughput_tokens_per_s"]
                                                          / s.at["independent", "throughput_tokens_per_s"])
    assert r.at["mlora", "avg_jct_speedup"] == pytest.approx(s.at["independent", "avg_jct_s"] / s.at["mlora", "avg_jct_s"])
    with pytest.raises(InputError, match="baseline"):
        plots.relative_table(summary, baseline="alto")


def test_bars_many_policies_go_full_width(tmp_path):
    pols = ("independent", "mlora", "mlora-nogroup", "lorafusion", "alto", "tlora", "tlora-nogroup", "lookahead")
    rows = [{"policy": p, "avg_jct_s": 100.0 + i, "p90_jct_s": 200.0 + i, "throughput_tokens_per_s": 1e5 + i,
             "gpu_alloc_util": 0.5, "gpu_compute_util": 0.2 + 0.01 * i} for i, p in enumerate(pols)]
    with fs.style_context():
        fig = figures.bars_figure(pd.DataFrame(rows))
        paths = fs.save_figure(fig, tmp_path, "bars", ["png"])
    assert fig.get_size_inches()[0] == pytest.approx(fs.DOUBLE_COLUMN_WIDTH_IN)
    axes = [ax for ax in fig.get_axes() if ax.axison]
    assert len(axes) == 5 and all(len(ax.patches) == len(pols) for ax in axes)
    # one legend, on the figure, naming every policy; no axis holds a legend
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(pols)
    assert all(ax.get_legend() is None for ax in fig.get_axes())
    # the panels keep a readable width (a legend squeezed into a panel shrank them to slivers)
    fig.canvas.draw()
    assert min(ax.get_window_extent().width for ax in axes) > 0.1 * fig.bbox.width
    _assert_valid(paths[0])
