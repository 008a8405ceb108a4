"""``compare --decompose`` (issue 40): the ladder eager-alone -> fused-alone -> + order ->
+ grouping, each step's speed-up in the printed table, ``summary.csv`` and ``decompose.csv``."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.experiments import decompose
from tlora_sim.traces.errors import InputError

TRACE = "synthetic:jobs=60,load=1.5,seed=3"


def test_decompose_writes_and_prints_the_ladder(tmp_path, capsys):
    out = tmp_path / "dec"
    rc = main(["compare", "--decompose", "--policies", "tlora", "--trace", TRACE, "--cluster", "1x8xH100",
               "--out", str(out), "--no-progress", "--no-plots", "--workers", "1",
               "--option", "tlora.order=sjf"])
    assert rc == 0
    printed = capsys.readouterr().out
    for step in decompose.STEPS:
        assert step in printed
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["policy"]) == ["independent-backfill", "independent-fused", "tlora-nogroup", "tlora"]
    assert list(summary["ladder_step"]) == list(decompose.STEPS)
    jct = summary.set_index("policy")["avg_jct_s"]
    # each step's speed-up is the previous run's average JCT over this one's; they multiply to the total
    steps = summary["step_speedup"].tolist()
    assert steps[0] == 1.0
    assert steps[2] == pytest.approx(jct["independent-fused"] / jct["tlora-nogroup"])
    assert math.prod(steps) == pytest.approx(summary["total_speedup"].iloc[-1])
    ladder = pd.read_csv(out / decompose.LADDER_FILE)
    assert list(ladder["run"]) == list(summary["policy"])
    # the +order step got tlora's option too (its config records it)
    import json

    cfg = json.loads((out / "tlora-nogroup" / "config.json").read_text())
    assert cfg["policy_config"]["order"] == "sjf" and cfg["policy_config"]["grouping"] is False
    assert json.loads((out / "independent-fused" / "config.json").read_text())["plan"] == "fused"


def test_ladder_runs_and_refusals():
    assert decompose.ladder_runs(["tlora", "mlora"]) == ["independent-backfill", "independent-fused",
                                                        "tlora-nogroup", "tlora", "mlora-nogroup", "mlora"]
    for bad in ("independent", "independent-fused", "tlora-nogroup"):
        with pytest.raises(InputError):
            decompose.ladder_runs([bad])


def test_ladder_table_ratios():
    summary = pd.DataFrame({"policy": ["independent-backfill", "independent-fused", "x-nogroup", "x"],
                            "avg_jct_s": [100.0, 50.0, 40.0, 20.0],
                            "throughput_tokens_per_s": [1.0, 1.0, 2.0, 4.0]})
    t = decompose.ladder_table(summary, ["x"])
    assert t["step_speedup"].tolist() == [1.0, 2.0, 1.25, 2.0]
    assert t["total_speedup"].tolist() == [1.0, 2.0, 2.5, 5.0]
    assert t["total_throughput_x"].tolist() == [1.0, 1.0, 2.0, 4.0]
