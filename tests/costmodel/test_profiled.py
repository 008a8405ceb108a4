"""The profiled cost model (sim/costmodel/profiled/model.py) and its shipped H100 artifact, without torch.

Loads ``profiler/data/costmodel_h100.json``; checks the CostModel protocol, provenance in
``describe()``, monotonicity in tokens, exact interpolation at measured grid points, flagged
roofline-shaped extrapolation, the default-model choice per GPU type, and the format of
``tlora-sim costmodel validate``'s last line.
"""
from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from tlora_sim.sim.costmodel.interface import PLANS, CostModel, Member
from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
from tlora_sim.sim.costmodel.profiled.tables import Tables
from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
from tlora_sim.sim.costmodel.roofline import RooflineCostModel

ART = artifact_path("H100")
pytestmark = pytest.mark.skipif(not ART.is_file(), reason="no shipped H100 artifact")


@pytest.fixture(scope="module")
def art():
    return load_artifact(ART)


@pytest.fixture(scope="module")
def cm(art):
    return ProfiledCostModel(art)


def _unmeasured_copy(tmp_path, plans=("lorafusion", "grouped"), drop_fits=False) -> ProfiledCostModel:
    """The shipped H100 artifact as one fitted before ``plans`` were measured: a copy whose
    ``measured_plans`` lacks them (and, with ``drop_fits``, whose models lack their families too).
    Built here rather than taken from a shipped file, which may measure every plan."""
    import json

    a = json.loads(ART.read_text())
    a["measured_plans"] = [p for p in a.get("measured_plans", ["alone", "loop", "fused"]) if p not in plans]
    if drop_fits:
        for e in a["models"].values():
            for fam in plans:
                e["plans"].pop(fam, None)
    p = tmp_path / "costmodel_h100_unmeasured.json"
    p.write_text(json.dumps(a))
    return ProfiledCostModel(load_artifact(p))


def test_import_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "import tlora_sim.sim.costmodel.profiled.model, tlora_sim.sim.cli.costmodel, tlora_sim.profiler.fit\n"
            "from tlora_sim.sim.costmodel.factory import default_cost_model\n"
            "print(default_cost_model('H100').name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "profiled"


def test_protocol_and_describe(cm, art):
    assert isinstance(cm, CostModel)
    d = cm.describe()
    assert d["name"] == "profiled" and d["gpu"] == "H100" and d["artifact"] == art["id"]
    for k in ("gpu_name", "driver", "torch", "triton", "git_commit", "kernel_variants"):
        assert d["source"][k], k
    h = d["heldout"]
    assert 0 <= h["median_ape"] <= h["p90_ape"] <= h["max_ape"] and h["rows"] > 0
    assert set(art["models"]) >= {"llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"}


def test_default_cost_model_per_gpu():
    assert default_cost_model("H100").name == "profiled"
    assert isinstance(default_cost_model("A100"), RooflineCostModel)


@pytest.mark.parametrize("model", ["llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"])
@pytest.mark.parametrize("plan", PLANS)
def test_predictions_positive_and_monotone_in_tokens(cm, model, plan):
    for n_gpus in (1, 2, 8):
        for members in ([Member(16, 1, 512)], [Member(8, 2, 1024)] * 4, [Member(r, 1, 2048) for r in (2, 4, 8, 16, 64)]):
            prev = 0.0
            for bs in (1, 2, 4, 8):
                mm = [Member(x.rank, x.batch_size * bs, x.seq_len) for x in members]
                t = cm.step_time_s(model, "H100", mm, n_gpus, plan)
                assert math.isfinite(t) and t > 0
                assert t >= prev * (1 - 1e-9), (model, plan, n_gpus, bs, t, prev)
                prev = t
                mem = cm.memory_bytes(model, "H100", mm, n_gpus, plan)
                assert mem > 0 and math.isfinite(mem)
    one = [Member(16, 2, 1024)]
    assert cm.isolated_step_time_s(model, "H100", one[0], 1) == cm.step_time_s(model, "H100", one, 1, "alone")


def test_interpolation_exact_at_grid_points(art):
    for model, entry in art["models"].items():
        tab = Tables(model, "H100", entry)
        for t, ms in zip(entry["l0"]["tokens"], entry["l0"]["ms"]):
            v, ext = tab.l0(t)
            assert not ext and v == pytest.approx(ms, rel=1e-9)
        for t, ms in zip(entry["head"]["tokens"], entry["head"]["ms"]):
            v, ext = tab.head(t)
            assert not ext and v == pytest.approx(ms, rel=1e-9)
        for s, a in entry["attn"].items():
            for b, ms in zip(a["seqs"], a["ms"]):
                v, ext = tab.attn_ms(int(s), b)
                assert not ext and v == pytest.approx(ms, rel=1e-9)
        # between grid points the value lies between its neighbours
        t0, t1 = entry["l0"]["tokens"][2:4]
        m0, m1 = entry["l0"]["ms"][2:4]
        v, _ = tab.l0((t0 + t1) / 2)
        assert min(m0, m1) <= v <= max(m0, m1)


def test_extrapolation_is_flagged_and_roofline_shaped(cm, art, tmp_path):
    inside = cm.predict("llama3-8b", "H100", [Member(16, 2, 1024)] * 4, 1, "fused")
    assert not inside.extrapolated and inside.reasons == ()
    big = cm.predict("llama3-8b", "H100", [Member(16, 8, 4096)] * 16, 1, "fused")  # 524k tokens on one GPU
    assert big.extrapolated and "layer" in big.reasons
    assert big.step_time_s > inside.step_time_s
    before = cm.describe()["extrapolated"]
    cm.predict("llama3-70b", "H100", [Member(256, 8, 4096)] * 20, 1, "loop")
    assert cm.describe()["extrapolated"] == before + 1
    tab = Tables("llama3-8b", "H100", art["models"]["llama3-8b"])
    hi = art["models"]["llama3-8b"]["l0"]["tokens"][-1]
    v1, e1 = tab.l0(hi)
    v2, e2 = tab.l0(2 * hi)
    assert not e1 and e2 and 1.8 < v2 / v1 < 2.2  # compute-bound: about linear in tokens
    # a plan the artifact does not list in measured_plans is flagged, even where its family is fitted
    un = _unmeasured_copy(tmp_path).predict("llama3-8b", "H100", [Member(16, 2, 1024)] * 4, 1, "lorafusion")
    assert un.extrapolated and any(r.startswith("analytic_plan") for r in un.reasons)
    measured = cm.predict("llama3-8b", "H100", [Member(16, 2, 1024)] * 4, 1, "lorafusion")
    assert not measured.extrapolated    # the H100 artifact measured it (2026-11-25)
    small = cm.predict("llama3-8b", "H100", [Member(8, 2, 1024), Member(4, 2, 1024)], 1, "lorafusion")
    assert small.extrapolated and "lorafusion:max_rank<16" in small.reasons   # not runnable there


def test_other_gpu_falls_back_to_roofline(cm):
    mm = [Member(16, 2, 1024)]
    p = cm.predict("llama3-8b", "A100", mm, 1, "alone")
    assert p.extrapolated and p.reasons == ("roofline:gpu",)
    assert p.step_time_s == RooflineCostModel().step_time_s("llama3-8b", "A100", mm, 1, "alone")


def test_group_accounting(cm):
    a, b = Member(8, 1, 1024), Member(16, 2, 512)
    alone = cm.step_time_s("llama3-8b", "H100", [a, b], 1, "alone")
    assert alone == pytest.approx(cm.step_time_s("llama3-8b", "H100", [a], 1, "alone")
                                  + cm.step_time_s("llama3-8b", "H100", [b], 1, "alone"))
    fused = cm.step_time_s("llama3-8b", "H100", [a] * 8, 1, "fused")
    assert fused < 8 * cm.step_time_s("llama3-8b", "H100", [a], 1, "alone")  # co-location pays
    two = cm.predict("llama3-8b", "H100", [Member(8, 2, 1024)] * 4, 2, "fused", parallelism="dp")
    one = cm.step_time_s("llama3-8b", "H100", [Member(8, 1, 1024)] * 4, 1, "fused")
    assert two.parallelism == "dp2" and two.step_time_s > one  # same tokens per GPU plus communication
    # the planner weighs the other plans too and never picks a slower one than data parallel
    best = cm.predict("llama3-8b", "H100", [Member(8, 2, 1024)] * 4, 2, "fused")
    assert best.step_time_s <= two.step_time_s and best.parallelism in ("dp2", "fsdp2", "tp2", "local2")
    m1 = cm.memory_bytes("llama3-8b", "H100", [a] * 4, 1, "fused", micro_batches=1)
    m4 = cm.memory_bytes("llama3-8b", "H100", [a] * 4, 1, "fused", micro_batches=4)
    assert m4 < m1


@pytest.mark.slow
def test_validate_last_line(capsys):
    from tlora_sim.sim.cli.costmodel import add_parsers, run
    import argparse

    ap = argparse.ArgumentParser()
    add_parsers(ap.add_subparsers(dest="command"))
    assert run(ap.parse_args(["costmodel", "validate", "--gpu", "H100"])) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(re.fullmatch(r"heldout_mape=0\.\d{4}", x) for x in lines)
    # the two-GPU H100 profile of 2026-11-26 (profiler/MULTIGPU.md): its leave-one-row-out error
    # (11.0% median, 28.9% p90 when fitted; kept under 15% / 35% here)
    assert re.fullmatch(r"multigpu_heldout_median_ape=0\.\d{4}", lines[-1]), lines[-1]
    assert float(lines[-1].split("=")[1]) < 0.15 and float(lines[-2].split("=")[1]) < 0.35, lines[-2:]
    assert run(ap.parse_args(["costmodel", "show", "--gpu", "H100"])) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "llama3-70b" in out


@pytest.mark.slow
@pytest.mark.skipif(not artifact_path("H200").is_file(), reason="no shipped H200 artifact")
def test_h200_artifact_is_the_default_and_meets_its_accuracy(capsys):
    """The H200 artifact (four quick profiles on H200s, the last two with ``lorafusion`` and
    ``grouped``): default for H200, its provenance names the H200, every plan measured for every
    model, held-out error within the targets (median <= 5%, p90 <= 10%) when refitted from the
    shipped rows, and every full Llama-3-8B step of the e2e CSV within 10%."""
    import argparse

    from tlora_sim.sim.cli.costmodel import add_parsers, run

    cm = default_cost_model("H200")
    assert cm.name == "profiled"
    d = cm.describe()
    assert d["gpu"] == "H200" and d["source"]["gpu_name"] == ["NVIDIA H200"] and len(d["source"]["profile_id"]) == 5
    assert d["heldout"]["median_ape"] <= 0.05 and d["heldout"]["p90_ape"] <= 0.10
    mm = [Member(16, 2, 1024)] * 4
    assert not cm.predict("llama3-8b", "H200", mm, 1, "fused").extrapolated
    assert d["measured_plans"] == ["alone", "loop", "fused", "lorafusion", "grouped"]
    for model in ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"):
        for plan in ("lorafusion", "grouped"):   # measured on the H200 (2026-11-25)
            assert not cm.predict(model, "H200", mm, 1, plan).extrapolated, (model, plan)
    # the H200 is faster than the H100 on a GPU-bound mix (more bandwidth, same compute)
    big = [Member(16, 8, 4096)] * 4
    assert cm.step_time_s("llama3-8b", "H200", big, 1, "fused") < default_cost_model("H100").step_time_s(
        "llama3-8b", "H100", big, 1, "fused")
    ap = argparse.ArgumentParser()
    add_parsers(ap.add_subparsers(dest="command"))
    e2e = ART.parent / "costmodel_h200_e2e.csv"
    assert run(ap.parse_args(["costmodel", "validate", "--gpu", "H200", "--e2e", str(e2e)])) == 0
    out = capsys.readouterr().out.strip().splitlines()
    mape = float(next(ln for ln in out if ln.startswith("heldout_mape=")).split("=")[1])
    assert mape <= 0.05
    # the two-GPU profile's leave-one-out error ends the output (measured 0.0877: above issue 17's
    # 5% target; profiler/MULTIGPU.md says why); this guards against regressions of the fit
    assert re.fullmatch(r"multigpu_heldout_median_ape=0\.\d{4}", out[-1]), out[-1]
    assert float(out[-1].split("=")[1]) <= 0.10
    rows = [ln.split() for ln in out if ln.strip().startswith("llama3-8b") and len(ln.split()) >= 8]
    errors = [abs(float(r[6])) for r in rows]
    assert len(errors) == 12 and max(errors) <= 0.10


def test_seed_plans_measured_iff_the_artifact_says_so(tmp_path, cm):
    """Rows of plans ``lorafusion`` and ``grouped`` are fitted as their own families and listed in
    ``measured_plans``; the cost model then predicts them from those fits (no ``analytic_plan``
    flag). An artifact without such rows (here a copy of the H100 one with them taken out) keeps
    fused x roofline ratio, flagged."""
    import json

    import pandas as pd

    from tlora_sim.profiler.fit import fit_artifact, read_rows
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path as ap

    mm = [Member(16, 2, 1024)] * 4
    before = _unmeasured_copy(tmp_path, drop_fits=True)   # as if profiled before these plans were
    for plan in ("lorafusion", "grouped"):
        old = before.predict("llama3-8b", "H100", mm, 1, plan)
        assert old.extrapolated and f"analytic_plan:{plan}" in old.reasons
    assert before.describe()["measured_plans"] == ["alone", "loop", "fused"]
    df = read_rows([ap("H100").with_name("profile_h100.csv")])
    df = df[df.model.isin(["", "llama3-8b"]) & ~df.plan.isin(["lorafusion", "grouped"])]
    fused = df[(df.kind == "mix") & (df.plan == "fused") & (df.n_adapters > 1)]
    extra = [fused.assign(plan="lorafusion", impl="lorafusion", kernel_variant="lorafusion@test",
                          step_ms=fused.step_ms * 1.3),
             fused.assign(plan="grouped", impl="grouped", kernel_variant="grouped[test]", step_ms=fused.step_ms * 0.9)]
    art = fit_artifact(pd.concat([df] + extra, ignore_index=True), "H100")
    assert art["measured_plans"] == ["alone", "loop", "fused", "lorafusion", "grouped"]
    e = art["models"]["llama3-8b"]
    assert {"lorafusion", "grouped"} <= set(e["plans"]) and e["variants"]["lorafusion"] == ["lorafusion@test"]
    p = tmp_path / "costmodel_h100.json"
    p.write_text(json.dumps(art))
    new = ProfiledCostModel(load_artifact(p))
    assert new.describe()["measured_plans"] == art["measured_plans"]
    for plan, k in (("lorafusion", 1.3), ("grouped", 0.9)):
        lay, _ = new.layer_ms("llama3-8b", [(16, 2, 1024)] * 4, plan)
        ref, _ = new.layer_ms("llama3-8b", [(16, 2, 1024)] * 4, "fused")
        assert abs(lay / (k * ref) - 1) < 0.15, (plan, lay, ref)
        pr = new.predict("llama3-8b", "H100", mm, 1, plan)
        assert not any(r.startswith("analytic_plan") for r in pr.reasons)
        # several GPUs: the planner with the plan's own per-GPU layer fit; the CPU sharing of a host
        # is the fused plan's (the two-GPU profile has loop and fused only), flagged
        two = new.predict("llama3-8b", "H100", mm, 2, plan)
        assert not any(r.startswith("analytic_plan") for r in two.reasons)
        assert f"multigpu:host_scale_of_fused:{plan}" in two.reasons
        f2 = new.predict("llama3-8b", "H100", mm, 2, "fused")
        assert 0.8 * k < two.step_time_s / f2.step_time_s < 1.2 * k, (plan, two, f2)
    for plan in ("lorafusion", "grouped"):  # the older artifact: still fused x roofline ratio on two GPUs
        assert f"analytic_plan:{plan}" in before.predict("llama3-8b", "H100", mm, 2, plan).reasons


def test_one_adapter_lorafusion_and_grouped_are_flagged(cm):
    """LoRAFusion's kernels and the grouped GEMM were profiled on mixes of two or more adapters
    only, so a one-adapter mix under those plans is outside the fit (reason ``layer``), on one GPU
    and inside the multi-GPU planner; fused and alone, measured with one adapter, are not."""
    one, two = [Member(16, 4, 1024)], [Member(16, 4, 1024), Member(8, 4, 1024)]
    for plan in ("lorafusion", "grouped"):
        assert "layer" in cm.predict("llama3-8b", "H100", one, 1, plan).reasons
        assert "layer" not in cm.predict("llama3-8b", "H100", two, 1, plan).reasons
        assert "layer" in cm.predict("llama3-8b", "H100", one, 2, plan).reasons  # dp2: one adapter per GPU
    for plan in ("fused", "alone"):
        assert "layer" not in cm.predict("llama3-8b", "H100", one, 1, plan).reasons
