"""The profiled cost model counts predictions per instance, so two runs in one process each
record their own counts in config.json (issue 15: the counters were process-wide)."""

from __future__ import annotations

import json

import pytest

from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact
from tlora_sim.sim.experiments.replay import ReplayConfig, replay

from tlora_sim.sim.costmodel.profiled.artifact import artifact_path

ART = load_artifact(artifact_path("H100"))


def test_counters_are_per_instance():
    a, b = ProfiledCostModel(ART), ProfiledCostModel(ART)
    m = (Member(8, 2, 1024),)
    a.step_time_s("llama3-8b", "H100", m, 1, "fused")
    a.step_time_s("llama3-8b", "H100", m, 1, "fused")  # the same question counts once
    a.step_time_s("llama3-8b", "H100", (Member(4, 1, 512),), 1, "alone")
    assert a.describe()["predictions"] == 2
    assert b.describe()["predictions"] == 0
    b.step_time_s("llama3-8b", "A100", m, 1, "fused")  # another GPU: the roofline answers
    d = b.describe()
    assert d["predictions"] == 1 and d["roofline_fallback"] == 1 and d["extrapolated"] == 1
    assert a.describe()["roofline_fallback"] == 0


@pytest.mark.slow
def test_two_runs_in_one_process_record_their_own_counts(tmp_path):
    cfg = ReplayConfig(trace="synthetic:jobs=30,seed=4", policy="independent", cluster="1x8xH100")
    replay(cfg, tmp_path / "a", progress=False, plots=False)
    replay(cfg, tmp_path / "b", progress=False, plots=False)
    ca = json.loads((tmp_path / "a" / "config.json").read_text())["cost_model"]
    cb = json.loads((tmp_path / "b" / "config.json").read_text())["cost_model"]
    assert ca["predictions"] == cb["predictions"] > 0
    assert ca["extrapolated"] == cb["extrapolated"]
