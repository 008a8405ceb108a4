"""Profiler figures (profiler/figures.py, profiler/kernel_figures.py) from small synthetic kernel-benchmark and profile tables.

The builders below (``synthetic_kernel_csv``, ``synthetic_profile_dir``) write tables in the
schemas of ``bench/kernels.py`` and ``tlora-sim profile`` / ``tlora-sim costmodel fit``;
tests/report/test_notebooks.py uses them too when the committed profiler data is missing.
"""

from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.report import style as fs
from tlora_sim.profiler import figures as pp
from tlora_sim.profiler import kernel_figures as kf
from tlora_sim.traces.errors import InputError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KERNEL_IMPLS = ("base", "alone", "loop", "padded", "fused")
MIXES = {"16x4": ("16", "2048", 4), "8-64": ("8,16,32,64", "2048", 4), "8+128": ("8,128", "4096,512", 2)}


# --------------------------------------------------------------------------------------------
# Synthetic inputs
# --------------------------------------------------------------------------------------------

def synthetic_kernel_csv(path: Path, *, layers=("64x48", "48x96"), with_mix: bool = True) -> Path:
    """A kernel benchmark CSV as bench/kernels.py writes it (a few mixes, made-up times in ms)."""
    cols = ["layer", "ranks", "tokens", "impl", "ms", "eager_ms", "floor_ms", "device", "torch", "triton",
            "ratio_to_base", "n_adapters"] + (["mix"] if with_mix else [])
    rows = []
    for li, layer in enumerate(layers):
        for mi, (mix, (ranks, tokens, n)) in enumerate(MIXES.items()):
            floor = 0.5 + 0.1 * li + 0.05 * mi
            factors = {"base": 1.08, "alone": 2.0 + 0.2 * n, "loop": 1.6 + 0.1 * n, "padded": 1.7, "fused": 1.15}
            for impl in KERNEL_IMPLS:
                ms = floor * factors[impl]
                row = {"layer": layer, "ranks": ranks, "tokens": tokens, "impl": impl, "ms": round(ms, 5),
                       "eager_ms": round(ms * (1.1 if impl in ("base", "fused") else 2.0 + n), 5),
                       "floor_ms": round(floor, 5), "device": "cpu (synthetic)", "torch": "0", "triton": "0",
                       "ratio_to_base": round(factors[impl] / factors["base"], 4), "n_adapters": n}
                if with_mix:
                    row["mix"] = mix
                rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def synthetic_profile_rows(gpu: str = "H100", models=("llama3-8b",), n_mixes: int = 20, seed: int = 0) -> list[dict]:
    """Rows of a ``tlora-sim profile`` CSV (profiler.provenance.COLUMNS): a smooth made-up layer model
    (ms) plus 4 % log-normal noise on the mixes, enough rows of every kind for profiler.fit."""
    from tlora_sim.profiler.provenance import COLUMNS

    rng = random.Random(seed)
    prov = {"gpu": gpu, "gpu_name": f"synthetic {gpu}", "driver": "0", "cuda": "0", "torch": "0", "triton": "0",
            "git_commit": "synthetic", "git_dirty": "0", "profile_id": "synthetic", "mode": "tiny",
            "timestamp": "2026-01-01T00:00:00+00:00"}
    rows: list[dict] = []

    def row(**kw):
        r = {c: "" for c in COLUMNS}
        r.update(prov)
        r.update(kw)
        rows.append(r)

    for p, nt in ((1e6, 10), (1e7, 50), (1e8, 200), (5e7, 20)):
        row(kind="opt", params=p, tensors=nt, step_ms=0.01 + 2e-9 * p + 1e-4 * nt)
    row(kind="ceiling", plan="matmul_flops", step_ms=700.0)
    for k, model in enumerate(models):
        size = 1.0 + 0.5 * k
        l0 = lambda t: size * (0.05 + 6e-5 * t)  # noqa: E731
        attn = lambda b, s: size * (0.01 + 2e-8 * b * s * s)  # noqa: E731
        for t in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
            row(kind="noattn", model=model, impl="none", tokens=t, step_ms=l0(t), peak_bytes=t * 4e4)
            row(kind="head", model=model, impl="head", tokens=t, step_ms=0.02 + 3e-5 * t, peak_bytes=t * 1e5)
        for s in (512, 1024, 2048, 4096):
            for b in (1, 2, 4, 8, 16, 32):
                row(kind="attn", model=model, impl="sdpa", batch_sizes=b, seq_lens=s, tokens=b * s, step_ms=attn(b, s))
        row(kind="base", model=model, impl="none", tokens=1024, batch_sizes=2, seq_lens=512,
            step_ms=l0(1024) + attn(2, 512))
        mixes = [[(r, 1, 512)] for r in (4, 16, 64)] + [[(r, 2, 2048)] for r in (4, 16, 64)]
        while len(mixes) < n_mixes:
            n = rng.choice((2, 3, 4, 6, 8))
            mixes.append([(rng.choice((2, 4, 8, 16, 32, 64, 128)), rng.choice((1, 2, 4)),
                           rng.choice((512, 1024, 2048))) for _ in range(n)])
        for m in mixes:
            T = sum(b * s for _, b, s in m)
            base = l0(T) + sum(attn(b, s) for _, b, s in m)
            rt = sum(r * b * s for r, b, s in m)
            for plan in (["alone", "fused"] if len(m) == 1 else ["loop", "fused"]):
                term = 0.02 + 4e-9 * rt + 0.002 * len(m) if plan == "fused" else 0.03 * len(m) + 1.2e-8 * rt
                row(kind="mix", model=model, plan=plan, impl="fused" if plan == "fused" else "loop",
                    n_adapters=len(m), ranks=";".join(str(r) for r, _, _ in m),
                    batch_sizes=";".join(str(b) for _, b, _ in m), seq_lens=";".join(str(s) for _, _, s in m),
                    tokens=T, step_ms=(base + term) * math.exp(rng.gauss(0, 0.04)),
                    peak_bytes=T * 5e4 + 1e6 * len(m), saved_bytes=T * 2e4, kernel_variant=plan)
    return rows


def synthetic_profile_dir(folder: Path, gpu: str = "H100", models=("llama3-8b",), *, artifact: bool = True,
                          e2e: bool = False) -> Path:
    """A ``profiler/data``-like directory: ``profile_<gpu>.csv`` and, with ``artifact``, the
    ``costmodel_<gpu>.json`` that ``tlora-sim costmodel fit`` makes of it (profiler.fit.build); with
    ``e2e``, ``e2e_<gpu>.csv`` full-model steps (the artifact's prediction x 1.0-1.2)."""
    from tlora_sim.profiler.provenance import COLUMNS

    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"profile_{gpu.lower()}.csv"
    with open(raw, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(synthetic_profile_rows(gpu, models))
    if artifact or e2e:
        from tlora_sim.profiler.fit import build

        build([str(raw)], gpu, folder)
    if e2e:
        from tlora_sim.sim.costmodel.interface import Member
        from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
        from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact

        cm = ProfiledCostModel(load_artifact(artifact_path(gpu, folder)))
        rows = []
        for i, (model, plan, mem) in enumerate([(m, p, mm) for m in models for p in ("loop", "fused")
                                                for mm in ([(16, 2, 1024)] * 2, [(8, 1, 512), (64, 2, 2048)])]):
            pred = cm.predict(model, gpu, [Member(*x) for x in mem], 1, plan).step_time_s * 1e3
            rows.append({"model": model, "plan": plan, "ranks": ";".join(str(r) for r, _, _ in mem),
                         "batch_sizes": ";".join(str(b) for _, b, _ in mem),
                         "seq_lens": ";".join(str(s) for _, _, s in mem),
                         "tokens": sum(b * s for _, b, s in mem), "step_ms": pred * (1.0 + 0.05 * (i % 4)),
                         "peak_bytes": 3e10, "error": ""})
        rows.append({**rows[0], "step_ms": "", "error": "OutOfMemoryError"})
        pd.DataFrame(rows).to_csv(folder / f"e2e_{gpu.lower()}.csv", index=False)
    return folder


def _assert_valid(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000, path
    if path.suffix == ".png":
        assert data.startswith(PNG_MAGIC), path
    else:
        assert path.suffix == ".pdf" and data.startswith(b"%PDF-") and b"%%EOF" in data[-64:], path


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    return synthetic_profile_dir(tmp_path_factory.mktemp("profile"), models=("llama3-8b", "qwen3-8b"), e2e=True)


# --------------------------------------------------------------------------------------------
# Kernel benchmark
# --------------------------------------------------------------------------------------------

def test_kernel_figure_bars_floor_and_files(tmp_path):
    csv_path = synthetic_kernel_csv(tmp_path / "kernel_bench_cpu.csv")
    df = kf.read_kernel_bench(csv_path)
    table = kf.kernel_table(df)
    assert len(table) == 2 * len(MIXES) * len(KERNEL_IMPLS)
    fused = table[(table["impl"] == "fused") & (table["layer"] == "64x48")]
    assert fused["ratio_to_floor"].to_numpy() == pytest.approx([1.15] * len(MIXES))
    assert fused["ratio_to_base"].to_numpy() == pytest.approx([1.15 / 1.08] * len(MIXES))

    with fs.style_context():
        fig = kf.kernel_figure(df)
    axes = fig.get_axes()
    assert len(axes) == 2 and not fs.missing_units(fig)
    assert [ax.get_title(loc="left") for ax in axes] == ["64x48 layer", "48x96 layer"]
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == list(MIXES)
        bars = {}
        for patch in ax.patches:
            bars.setdefault(patch.get_gid(), []).append(patch)
        assert list(bars) == [f"impl:{i}" for i in KERNEL_IMPLS]  # display order
        assert all(len(b) == len(MIXES) for b in bars.values())
        assert bars["impl:fused"][0].get_facecolor()[:3] == pytest.approx(
            tuple(int(fs.OKABE_ITO["vermillion"][i:i + 2], 16) / 255 for i in (1, 3, 5)))
        floor = [ln for ln in ax.get_lines() if ln.get_gid() == "floor"]
        assert len(floor) == 1 and list(floor[0].get_ydata()) == [1.0, 1.0]  # the floor at 1
        assert ax.get_yscale() == "linear"
    assert "roofline floor" in [t.get_text() for t in fig.legends[0].get_texts()]

    # relative to the frozen base: no base bars, the floor drawn per mix at floor / base
    with fs.style_context():
        fig = kf.kernel_figure(df, relative_to="base")
    ax = fig.get_axes()[0]
    assert "impl:base" not in {p.get_gid() for p in ax.patches}
    floors = [c for c in ax.collections if c.get_gid() == "floor"]
    assert len(floors) == 1
    segs = floors[0].get_segments()
    assert [s[0][1] for s in segs] == pytest.approx([1 / 1.08] * len(MIXES))
    # eager times span more than 6x: log y-axis
    with fs.style_context():
        fig = kf.kernel_figure(df, timing="eager_ms")
    assert fig.get_axes()[0].get_yscale() == "log"

    paths = kf.plot_kernels(csv_path, tmp_path / "figs")
    assert [p.name for p in paths] == ["kernels.png", "kernels.pdf"]
    for p in paths:
        _assert_valid(p)
    paths = kf.plot_kernels(csv_path, tmp_path / "figs", ["png"], relative_to="base", timing="eager_ms")
    assert [p.name for p in paths] == ["kernels_eager_vs_base.png"]


def test_kernel_csv_without_mix_column_and_bad_input(tmp_path):
    csv_path = synthetic_kernel_csv(tmp_path / "k.csv", layers=("64x48",), with_mix=False)
    df = kf.read_kernel_bench(csv_path)
    assert list(dict.fromkeys(df["mix_label"])) == ["r16\u00d74 @2048", "r8,16,32,64 @2048", "r8,128 @4096/512"]
    with fs.style_context():
        fig = kf.kernel_figure(df)
    assert "ranks" in fig.get_axes()[-1].get_xlabel()

    good = pd.read_csv(csv_path, dtype=str)
    good.drop(columns=["floor_ms"]).to_csv(tmp_path / "nofloor.csv", index=False)
    with pytest.raises(InputError, match=r"nofloor\.csv, field 'floor_ms'"):
        kf.read_kernel_bench(tmp_path / "nofloor.csv")
    bad = good.copy()
    bad.loc[3, "ms"] = "fast"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(InputError, match=r"bad\.csv, row 4, field 'ms'"):
        kf.read_kernel_bench(tmp_path / "bad.csv")
    bad = good.copy()
    bad.loc[0, "floor_ms"] = "0"
    bad.to_csv(tmp_path / "zero.csv", index=False)
    with pytest.raises(InputError, match=r"row 1, field 'floor_ms'"):
        kf.read_kernel_bench(tmp_path / "zero.csv")
    with pytest.raises(InputError, match="does not exist"):
        kf.read_kernel_bench(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="empty"):
        kf.plot_kernels(tmp_path / "empty.csv", tmp_path / "figs")
    with pytest.raises(InputError, match="format"):
        kf.plot_kernels(csv_path, tmp_path / "figs", ["gif"])


# --------------------------------------------------------------------------------------------
# Cost model: predicted against measured
# --------------------------------------------------------------------------------------------

def test_costmodel_predictions_hold_out_every_kth_mix(profile_dir):
    from tlora_sim.profiler.fit import heldout_mask, read_rows

    files = pp.costmodel_files(profile_dir)
    assert list(files) == ["H100"]
    assert files["H100"]["artifact"].name == "costmodel_h100.json"
    assert files["H100"]["e2e"].name == "e2e_h100.csv"
    pred = pp.costmodel_predictions(profile_dir)
    art = json.loads(files["H100"]["artifact"].read_text())
    k = art["heldout"]["k"]
    assert pred.attrs["holdout_every"] == k
    rows = read_rows([str(p) for p in files["H100"]["profile"]])
    mask = heldout_mask(rows, k)
    mix = rows[rows["kind"] == "mix"]
    assert len(pred) == len(mix)
    assert int(pred["heldout"].sum()) == int(mask[mix.index].sum()) > 0
    # the held-out rows are every k-th mix of each model, with all their plans
    assert set(pred.loc[pred["heldout"], "model"]) == {"llama3-8b", "qwen3-8b"}
    held_keys = set(zip(pred.loc[pred["heldout"], "model"], pred.loc[pred["heldout"], "mix"]))
    assert not held_keys & set(zip(pred.loc[~pred["heldout"], "model"], pred.loc[~pred["heldout"], "mix"]))
    # the same held-out error as `tlora-sim costmodel validate` (profiler.fit.validate)
    from tlora_sim.profiler.fit import validate

    vpred, summary = validate(rows, "H100", k)
    held = pred[pred["heldout"]]
    assert held["ape"].median() == pytest.approx(summary["median_ape"])
    assert held["ape"].median() < 0.3 and (pred["predicted_ms"] > 0).all()
    assert pp.costmodel_predictions(profile_dir, holdout_every=3)["heldout"].sum() != held.shape[0]


def test_costmodel_figure_marks_heldout_points(profile_dir, tmp_path):
    pred = pp.costmodel_predictions(profile_dir)
    with fs.style_context():
        fig = pp.costmodel_figure(pred)
    axes = [ax for ax in fig.get_axes() if ax.axison]
    assert [ax.get_title(loc="left") for ax in axes] == ["llama3-8b", "qwen3-8b"]
    assert not fs.missing_units(fig)
    n_held = n_fit = 0
    for ax, model in zip(axes, ("llama3-8b", "qwen3-8b")):
        sub = pred[pred["model"] == model]
        held = {c.get_gid(): c for c in ax.collections if str(c.get_gid()).startswith("heldout:")}
        fit = {c.get_gid(): c for c in ax.collections if str(c.get_gid()).startswith("fit:")}
        assert set(held) == {f"heldout:{p}" for p in sub.loc[sub["heldout"], "plan"].unique()}
        for gid, c in held.items():
            plan = gid.split(":", 1)[1]
            rows = sub[sub["heldout"] & (sub["plan"] == plan)]
            assert np.allclose(np.sort(c.get_offsets()[:, 0]), np.sort(rows["measured_ms"]))
            assert np.allclose(np.sort(c.get_offsets()[:, 1]), np.sort(rows["predicted_ms"]))
            # drawn apart from the training points: filled, black-edged, larger, on top, labelled
            assert c.get_facecolors().shape[0] == 1 and c.get_edgecolors()[0][:3] == pytest.approx((0, 0, 0))
            assert c.get_sizes()[0] > fit[f"fit:{plan}"].get_sizes()[0]
            assert c.get_zorder() > fit[f"fit:{plan}"].get_zorder()
            assert "held out" in c.get_label()
            n_held += len(c.get_offsets())
        for c in fit.values():
            assert c.get_facecolors().shape[0] == 0  # open circles
            n_fit += len(c.get_offsets())
        assert any(t.get_text().startswith("held-out APE") and "median" in t.get_text() for t in ax.texts)
        assert ax.get_xscale() == ax.get_yscale() == "log"
    assert n_held == int(pred["heldout"].sum()) and n_fit == int((~pred["heldout"]).sum())
    assert {"held out", "fitted on"} <= {t.get_text() for t in fig.legends[0].get_texts()}

    paths = pp.plot_costmodel(profile_dir, tmp_path / "figs")
    assert [p.name for p in paths] == ["costmodel_h100.png", "costmodel_h100.pdf",
                                      "costmodel_e2e_h100.png", "costmodel_e2e_h100.pdf"]
    for p in paths:
        _assert_valid(p)
    e2e = pp.e2e_predictions(profile_dir / "e2e_h100.csv", profile_dir / "costmodel_h100.json")
    assert len(e2e) == 8 and e2e["error"].abs().max() == pytest.approx(0.15 / 1.15, rel=1e-6)


def test_costmodel_from_one_csv_without_artifact_and_errors(tmp_path):
    folder = synthetic_profile_dir(tmp_path / "raw", artifact=False)
    pred = pp.costmodel_predictions(folder / "profile_h100.csv")
    assert pred.attrs["holdout_every"] == pp.DEFAULT_HOLDOUT_EVERY and pred["heldout"].any()
    paths = pp.plot_costmodel(folder, tmp_path / "figs", ["png"])
    assert [p.name for p in paths] == ["costmodel_h100.png"]  # no artifact: no e2e figure
    with pytest.raises(InputError, match="does not exist"):
        pp.costmodel_files(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="profile_<gpu>.csv"):
        pp.plot_costmodel(tmp_path / "empty", tmp_path / "figs")
    with pytest.raises(InputError, match="A100"):
        pp.costmodel_predictions(folder, gpu="A100")
    with pytest.raises(ValueError, match="columns"):
        pp.costmodel_figure(pd.DataFrame())


def test_cli_and_import_without_torch(tmp_path, capsys):
    csv_path = synthetic_kernel_csv(tmp_path / "kernel_bench_cpu.csv", layers=("64x48",))
    folder = synthetic_profile_dir(tmp_path / "data", artifact=False)
    assert pp.main(["--kernels", str(csv_path), "--costmodel", str(folder), "--out", str(tmp_path / "o"),
                    "--formats", "png"]) == 0
    printed = [Path(p).name for p in capsys.readouterr().out.split()]
    assert printed == ["kernels.png", "kernels_eager.png", "costmodel_h100.png"]
    assert pp.main(["--kernels", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.csv" in capsys.readouterr().err

    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "import tlora_sim.profiler.figures as pp, tlora_sim.profiler.kernel_figures as kf\n"
            "assert 'matplotlib.pyplot' not in sys.modules\n"
            f"print(len(kf.plot_kernels({str(csv_path)!r}, {str(tmp_path / 'o2')!r}, ['png'])))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "1", res.stderr


def test_impl_styles_fixed_order_and_colours():
    styles = fs.impl_styles(["fused#1", "peft", "fused", "other", "base", "loop", "fused#0", "alone", "padded"])
    assert list(styles) == ["base", "alone", "loop", "padded", "peft", "fused", "fused#0", "fused#1", "other"]
    assert styles["fused"].color == styles["fused#0"].color == fs.OKABE_ITO["vermillion"]
    assert styles["fused#0"].hatch != styles["fused#1"].hatch
    assert fs.impl_styles(["fused"])["fused"] == fs.PolicyStyle(**{**styles["fused"].__dict__, "order": 0})
    assert len({s.color for n, s in styles.items() if "#" not in n}) == 7
