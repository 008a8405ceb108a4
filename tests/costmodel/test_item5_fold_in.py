"""Issue 43 item 5, the no-GPU half: LoRAFusion's one-adapter rows of a new H200 profile folded into
the H200 measurements (``python -m tlora_sim.profiler.fit fold-in``) and refitted, on synthetic rows
in the shape ``profiler/validation/h200_item5.sh`` writes (the profiler's CSV columns).

The synthetic lone ``lorafusion`` rows are the shipped H200 profile's one-adapter ``fused`` rows
(ranks 16 and 64 at 512, 4096 and 16384 tokens, llama3-8b and qwen3-8b) x 1.15 under another
profile id. The cost model flags a prediction when its mix lies outside the fitted family's
``coverage`` (sim/costmodel/profiled/formula.py ``layer_ms``: adapters_min, default 2 for lorafusion
in ``ADAPTERS_MIN_DEFAULT``), so a lone job under ``lorafusion`` is flagged ``layer`` before and not
after; the loop and fused families see the same rows, so their predictions do not move.
"""
from __future__ import annotations

import csv
import hashlib
import json

import pytest

from tlora_sim.profiler.fit import fit_artifact, fold_in, main, predict_rows, read_rows
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

H200_CSV = artifact_path("H200").with_name("profile_h200.csv")
pytestmark = pytest.mark.skipif(not H200_CSV.is_file(), reason="no shipped H200 profile")
#: the device run of 2026-12-01 (profiler/data/lorafusion_lone_h200_2026-12-01/) whose lone
#: lorafusion rows the shipped profile now holds; the tests fold synthetic rows into the profile as
#: it was before that run (its rows taken out again)
FOLDED_ID = "h200-20261201T231357-d16a"


def _before(path):
    """The shipped H200 profile without the folded device run's rows (the state it was folded into)."""
    lines = H200_CSV.read_text().splitlines(keepends=True)
    path.write_text("".join(ln for ln in lines if FOLDED_ID not in ln))
    return path


def _synthetic(path, scale=1.15):
    """Rows as the device script writes them: lone lorafusion (the fused ones x scale), their alone
    and fused references, a not-runnable rank-4 row and a two-adapter lorafusion row (not folded)."""
    with open(H200_CSV, newline="") as f:
        rd = csv.DictReader(f)
        header, rows = rd.fieldnames, list(rd)
    lone = [r for r in rows if r["kind"] == "mix" and r["n_adapters"] == "1" and r["model"] in ("llama3-8b", "qwen3-8b")
            and r["plan"] in ("alone", "fused") and r["profile_id"] == "h200-20261122T172648-d16a"]
    out = []
    for r in lone:
        new = dict(r, profile_id="h200-20261201T230000-test", timestamp="2026-12-01T23:00:00+00:00")
        out.append(new)
        if r["plan"] == "fused":
            if r["ranks"] == "4":
                out.append(dict(new, plan="lorafusion", impl="lorafusion", kernel_variant="lorafusion@c48d7fdb1b54",
                                step_ms="", fwd_ms="", bwd_ms="", error="not runnable: MAX_R = 4"))
                continue
            lf = dict(new, plan="lorafusion", impl="lorafusion", kernel_variant="lorafusion@c48d7fdb1b54[stages4/4]")
            for c in ("fwd_ms", "bwd_ms", "step_ms", "p10_ms", "p90_ms"):
                lf[c] = f"{float(r[c]) * scale:.6g}"
            out.append(lf)
    two = next(r for r in rows if r["plan"] == "lorafusion" and r["n_adapters"] == "2")
    out.append(dict(two, profile_id="h200-20261201T230000-test"))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(out)
    return sum(1 for r in out if r["plan"] == "lorafusion" and r["n_adapters"] == "1" and not r["error"])


def _cm(art, tmp_path, name):
    p = tmp_path / name
    p.write_text(json.dumps(art))
    return ProfiledCostModel(load_artifact(p))


@pytest.mark.slow
def test_fold_in_then_refit_measures_lone_lorafusion_jobs(tmp_path):
    into = _before(tmp_path / "profile_h200.csv")
    before_bytes = into.read_bytes()
    new = tmp_path / "new" / "profile_h200.csv"
    new.parent.mkdir()
    n_lone = _synthetic(new)
    h100 = artifact_path("H100").read_bytes()
    res = fold_in(into, [new.parent], "H200")
    assert res["added"] == n_lone == 12 and res["plans"] == ["lorafusion"]
    assert res["models"] == ["llama3-8b", "qwen3-8b"]
    assert res["skipped"] == {"plan": 36, "error": 6, "adapters": 1}   # 18 alone + 18 fused, 6 rank-4 rows
    assert into.read_bytes().startswith(before_bytes)                  # appended, nothing rewritten
    again = fold_in(into, [new], "H200")                                # idempotent
    assert again["added"] == 0 and again["already"] == n_lone
    art = fit_artifact(read_rows([into]), "H200")
    old_art = fit_artifact(read_rows([_before(tmp_path / "b.csv")]), "H200")
    shipped = _cm(old_art, tmp_path, "costmodel_h200_before.json")
    cm = _cm(art, tmp_path, "costmodel_h200.json")
    for model in ("llama3-8b", "qwen3-8b"):
        cov = art["models"][model]["plans"]["lorafusion"]["coverage"]
        assert cov["adapters_min"] == 1 and cov["tokens_min"] == 512
        for mem in ([Member(16, 1, 512)], [Member(16, 2, 1024)], [Member(64, 8, 2048)]):
            before = shipped.predict(model, "H200", mem, 1, "lorafusion")
            after = cm.predict(model, "H200", mem, 1, "lorafusion")
            assert before.extrapolated and "layer" in before.reasons
            assert not after.extrapolated, (model, mem, after.reasons)
        # rank below 16: LoRAFusion's kernels cannot run it, still flagged
        assert "lorafusion:max_rank<16" in cm.predict(model, "H200", [Member(8, 2, 1024)], 1, "lorafusion").reasons
        for plan in ("alone", "loop", "fused"):                   # same rows for these families: unchanged
            for mem in ([Member(16, 2, 1024)], [Member(16, 2, 1024)] * 4):
                if plan == "alone" and len(mem) > 1:
                    continue
                assert cm.predict(model, "H200", mem, 1, plan) == shipped.predict(model, "H200", mem, 1, plan)
    # the layer steps of the folded rows: the shipped fit continued the host term of two or more
    # adapters to one (2x too slow at 512 tokens); the refit meets them
    lone = read_rows([new])
    lone = lone[(lone.plan == "lorafusion") & (lone.n_adapters == 1)]
    old, now = predict_rows(old_art, lone), predict_rows(art, lone)
    small = (now.tokens == 512).to_numpy()
    assert small.sum() == 4 and (old.ape[small] > 0.5).all() and (now.ape[small] < 0.25).all()
    assert now.ape.median() < old.ape.median() and now.ape.max() < 0.25
    # models without lone rows keep their lorafusion fit (coverage from two adapters)
    assert art["models"]["llama3-70b"]["plans"]["lorafusion"]["coverage"]["adapters_min"] >= 2
    assert artifact_path("H100").read_bytes() == h100                  # the H100 artifact is not touched
    assert hashlib.sha256(before_bytes).hexdigest() != hashlib.sha256(into.read_bytes()).hexdigest()
    # the shipped artifact is the refit with the device run's real rows: lone jobs measured too
    real = ProfiledCostModel(load_artifact(artifact_path("H200")))
    for model in ("llama3-8b", "qwen3-8b"):
        assert not real.predict(model, "H200", [Member(16, 1, 512)], 1, "lorafusion").extrapolated


def test_fold_in_cli_reports_and_refuses_bad_input(tmp_path, capsys):
    into = _before(tmp_path / "profile_h200.csv")
    before_bytes = into.read_bytes()
    new = tmp_path / "profile_h200_new.csv"
    _synthetic(new)
    assert main(["fold-in", "--into", str(into), "--rows", str(new), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would add 12 rows (lorafusion; models llama3-8b, qwen3-8b)" in out
    assert load_artifact(artifact_path("H200"))["id"] in out and "costmodel fit --gpu H200" in out
    assert into.read_bytes() == before_bytes                           # dry run: nothing written
    # the reference plans against the shipped artifact: the same rows it was fitted on, ratio ~1
    lines = [ln.split() for ln in out.splitlines() if ln.split()[:3] == ["llama3-8b", "fused", "gpu"]]
    assert lines and 0.9 < float(lines[0][4]) < 1.1
    assert main(["fold-in", "--into", str(into), "--rows", str(new), "--gpu", "H100"]) == 2
    assert "no successful H100 mix rows" in capsys.readouterr().err
    bad = tmp_path / "other.csv"
    bad.write_text("kind,model\nmix,llama3-8b\n")
    assert main(["fold-in", "--into", str(into), "--rows", str(bad)]) == 2
    assert "header differs" in capsys.readouterr().err


def test_lone_grid_and_a_tiny_mixes_only_profile(tmp_path):
    """The device script's grid: one adapter per mix, every token count x rank, coarse to fine; the
    profile with --mixes-only writes mix rows only (CPU, tiny shapes; LoRAFusion where its source is)."""
    torch = pytest.importorskip("torch")
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from tlora_sim.profiler.grid import lone_mixes, lorafusion_compile_keys
    from tlora_sim.profiler.kernels.lorafusion_ext import lorafusion_available
    from tlora_sim.profiler.profile import main as profile_main

    g = lone_mixes([16, 64], [512, 16384, 2048], 2048)
    assert g == [[(16, 1, 512)], [(64, 1, 512)], [(16, 8, 2048)], [(64, 8, 2048)], [(16, 1, 2048)], [(64, 1, 2048)]]
    with pytest.raises(ValueError):
        lone_mixes([16], [3000], 2048)
    assert lorafusion_compile_keys("m", g + [[(8, 1, 512)]]) == [("m", 16, 16), ("m", 64, 64)]
    os.environ.setdefault("TLORA_GIT_COMMIT", "0123456789abcdef")
    assert profile_main(["--device", "cpu", "--tiny", "--mixes-only", "--plans", "alone,lorafusion", "--lone-ranks",
                         "16", "--lone-tokens", "16,32", "--lone-seq", "16", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "profile_cpu.csv")))
    assert {r["kind"] for r in rows} == {"mix"} and all(r["n_adapters"] == "1" and not r["error"] for r in rows)
    assert sorted((r["plan"], r["tokens"]) for r in rows) == sorted(
        [("alone", "16"), ("alone", "32")] + ([("lorafusion", "16"), ("lorafusion", "32")] if lorafusion_available() else []))
    assert profile_main(["--device", "cpu", "--tiny", "--lone-ranks", "16", "--lone-tokens", "24", "--lone-seq", "16",
                         "--out", str(tmp_path / "bad")]) == 2
