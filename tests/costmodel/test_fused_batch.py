"""The batch form of the profiled fused-plan model (``tlora_sim.sim.costmodel.profiled.formula``) gives the scalar model's
step times bit for bit, for single groups and merged pairs, inside and outside the measured grids
(``formula.layer_formula`` is one implementation over floats and arrays)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.profiled.formula import MAX_SEQ_LENS, REL_MARGIN, FusedBatch
from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.roofline import RooflineCostModel

RANKS = [4, 8, 16, 32, 64, 128, 256]
BATCHES = [1, 2, 4, 8, 16, 32, 64]
SEQS = [128, 512, 1024, 1536, 2048, 3000, 4096, 8192]  # measured lengths, between them and beyond them


def _groups(rng, count):
    return [[Member(int(rng.choice(RANKS)), int(rng.choice(BATCHES)), int(rng.choice(SEQS)))
             for _ in range(int(rng.integers(1, 9)))] for _ in range(count)]


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_batch_step_times_equal_the_scalar_model_for_groups_and_merges(gpu):
    cm = default_cost_model(gpu)
    rng = np.random.default_rng(7)
    for model in cm.artifact["models"]:
        assert FusedBatch.of(cm, model, gpu, 4) is None  # several GPUs: the planner answers
        for n in (1,):
            fb = FusedBatch.of(cm, model, gpu, n)
            assert fb is not None
            groups = _groups(rng, 24)
            rows = np.array([fb.row(g) for g in groups])
            i, j = rng.integers(0, len(groups), 24), rng.integers(0, len(groups), 24)
            for nano in (1, 2, 8):
                nanos = rng.choice([1, nano], len(i))
                merged = fb.step_times(FusedBatch.merge(rows[i], rows[j]), nanos)
                got = np.concatenate([fb.step_times(rows, nano), merged])
                want = [cm.step_time_s(model, gpu, tuple(sorted(g)), n, "fused", nano) for g in groups]
                want += [cm.step_time_s(model, gpu, tuple(sorted(groups[a] + groups[b])), n, "fused", int(k))
                         for a, b, k in zip(i, j, nanos)]
                assert got.tolist() == want
    assert fb.step_times(np.zeros((0, rows.shape[1])), 2).shape == (0,)  # no candidates: no answers


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(RANKS), st.integers(1, 128), st.sampled_from(SEQS)), min_size=1, max_size=16),
       st.just(1), st.integers(1, 16))
def test_batch_matches_the_scalar_model_on_any_mix(mix, n, nano):
    cm = default_cost_model("H100")
    members = [Member(*x) for x in mix]
    fb = FusedBatch.of(cm, "llama3-8b", "H100", n)
    got = float(fb.step_times(fb.row(members), nano)[0])
    want = cm.step_time_s("llama3-8b", "H100", tuple(sorted(members)), n, "fused", nano)
    assert got == want
    assert REL_MARGIN > 0  # callers still act only beyond it (the batch is exact: a margin to spare)


def test_merged_rows_are_the_rows_of_the_union():
    cm = default_cost_model("H100")
    fb = FusedBatch.of(cm, "qwen3-8b", "H100", 1)
    a = [Member(8, 4, 512), Member(64, 2, 2048)]
    b = [Member(128, 1, 512)]
    assert np.array_equal(FusedBatch.merge(fb.row(a), fb.row(b)), fb.row(a + b))


def test_the_batch_declines_what_it_cannot_describe():
    assert FusedBatch.of(RooflineCostModel(), "llama3-8b", "H100", 8) is None
    cm = default_cost_model("H100")
    assert FusedBatch.of(cm, "llama3-8b", "A100", 1) is None  # no measured tables for that GPU
    assert FusedBatch.of(cm, "llama3-8b", "H100", 8) is None  # several GPUs: the planner weighs plans
    fb = FusedBatch.of(cm, "llama3-8b", "H100", 1)
    assert fb.row([Member(8, 1, 100 + s) for s in range(MAX_SEQ_LENS)]) is not None
    assert fb.row([Member(8, 1, 5000)]) is None  # one sequence length too many for its columns


def test_the_batch_knows_a_profiled_model_by_its_registered_artifact():
    """``FusedBatch.of`` recognises the profiled model without importing its class
    (``artifact.profiled_source``): two models that loaded the same file both get a batch, with
    the same answers; an object whose ``key`` is not its artifact's registered key gets none."""
    from types import SimpleNamespace

    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    a, b = (ProfiledCostModel(load_artifact(artifact_path("H100"))) for _ in range(2))
    assert a.artifact is not b.artifact and a.key == b.key
    fa, fb = FusedBatch.of(a, "llama3-8b", "H100", 1), FusedBatch.of(b, "llama3-8b", "H100", 1)
    assert fa is not None and fb is not None
    g = [Member(16, 4, 1024), Member(64, 2, 2048)]
    assert fa.step_times(fa.row(g), 1).tolist() == fb.step_times(fb.row(g), 1).tolist()
    fake = SimpleNamespace(artifact=dict(a.artifact, id="other"), key=a.key)
    assert FusedBatch.of(fake, "llama3-8b", "H100", 1) is None
