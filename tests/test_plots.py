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

from sim import figstyle as fs
from sim import plots
from sim.errors import InputError

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


def _expected(figdir: Path, names=plots.FIGURE_NAMES, formats=("png", "pdf")) -> list[Path]:
    return [figdir / f"{n}.{f}" for n in names for f in formats]


def test_plot_run_writes_all_figures(tmp_path):
    run = tmp_path / "run"
    _write_run(run, "tlora", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", plots.PlotWarning)
        paths = plots.plot_run(run)
    assert paths == _expected(run / "figures")
    for p in paths:
        _assert_valid(p)
    # no temp files are left behind
    assert sorted(x.name for x in (run / "figures").iterdir()) == sorted(p.name for p in paths)


def test_plot_compare_plot_any_and_reproducible_bytes(tmp_path):
    out = _write_compare(tmp_path / "cmp")
    with warnings.catch_warnings():
        warnings.simplefilter("error", plots.PlotWarning)
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
    with pytest.warns(plots.PlotWarning) as record:
        paths = plots.plot_run(run, formats=("png",))
    assert [p.name for p in paths] == ["jct_cdf.png", "slowdown_cdf.png"]
    text = " ".join(str(w.message) for w in record)
    assert "timeline.csv" in text and "summary.json" in text

    # A policy in summary.csv without a run directory: bars keep it, the other figures leave it out.
    out = _write_compare(tmp_path / "cmp", policies=("independent", "tlora"))
    summary = pd.read_csv(out / "summary.csv")
    extra = summary.iloc[[1]].assign(policy="tlora-nogroup")
    pd.concat([summary, extra]).to_csv(out / "summary.csv", index=False)
    with pytest.warns(plots.PlotWarning, match="tlora-nogroup"):
        paths = plots.plot_compare(out, formats=("png",))
    assert [p.name for p in paths] == [f"{n}.png" for n in plots.FIGURE_NAMES]


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
    edges, means = plots.time_weighted_bins(t, v, t_end_s=t_end)
    assert len(means) <= plots.MAX_POINTS_PER_LINE
    assert len(edges) == len(means) + 1
    assert edges[0] == t[0] and edges[-1] == t_end
    widths = np.diff(np.append(t, t_end))
    exact = float(np.sum(v * widths))
    assert float(np.sum(means * np.diff(edges))) == pytest.approx(exact, rel=1e-9)
    assert means.min() >= v.min() and means.max() <= v.max()

    # short series come back exactly; the zero-length last row ends the series
    e, m = plots.time_weighted_bins([0.0, 10.0, 10.0, 30.0], [1.0, 5.0, 2.0, 0.0])
    assert e.tolist() == [0.0, 10.0, 30.0] and m.tolist() == [1.0, 2.0]
    e, m = plots.time_weighted_bins([0.0, 10.0, 30.0], [1.0, 2.0, 4.0], t_end_s=40.0, max_bins=2)
    assert e.tolist() == [0.0, 20.0, 40.0] and m.tolist() == [1.5, 3.0]
    e, m = plots.time_weighted_bins([], [])
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
    run_data = plots.load_run(run)
    binned = plots._read_timeline(run_data)
    for edges, means in binned.values():
        assert len(means) <= plots.MAX_POINTS_PER_LINE
    paths = plots.plot_run(run, formats=("png",))
    assert run / "figures" / "throughput_time.png" in paths


def test_import_needs_no_display_and_leaves_backend_alone(tmp_path):
    code = ("import os, sys; os.environ.pop('DISPLAY', None); "
            "import sim.plots, sim.figstyle; "
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
