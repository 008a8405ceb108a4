"""Issue 41: every comparison runs and names its reference baseline, carries speed-ups against it in
every output, honours --no-plots, and takes -q/-v on either side of the sub-command."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.experiments.replay import (REFERENCE, effective_discipline, policy_options_with_discipline,
                                              with_reference)
from tlora_sim.sim.report import plots
from tlora_sim.sim.report.tables import SPEEDUP_COLUMNS, fmt_number, format_table, speedups
from tlora_sim.traces.errors import InputError

TRACE = "synthetic:jobs=24,seed=3"
ARGS = ["--trace", TRACE, "--cluster", "1x8xH100", "--seed", "0", "--no-progress"]


def test_compare_adds_the_reference_and_writes_speedups(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *ARGS, "--policies", "tlora,mlora", "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr()
    assert f"reference {REFERENCE} (added)" in printed.out and "discipline default" in printed.out
    table = pd.read_csv(out / "summary.csv")
    assert table["policy"].tolist() == [REFERENCE, "tlora", "mlora"]  # the reference first
    ref = table.set_index("policy").loc[REFERENCE]
    assert [ref[c] for c in SPEEDUP_COLUMNS] == [1.0] * 4 and set(table["reference"]) == {REFERENCE}
    t = table.set_index("policy").loc["tlora"]
    assert t["avg_jct_speedup"] == pytest.approx(ref["avg_jct_s"] / t["avg_jct_s"])
    assert t["throughput_x"] == pytest.approx(t["throughput_tokens_per_s"] / ref["throughput_tokens_per_s"])
    assert t["makespan_speedup"] == pytest.approx(ref["makespan_s"] / t["makespan_s"])
    for pol in table["policy"]:
        summary = json.loads((out / pol / "summary.json").read_text())
        assert summary["reference"] == REFERENCE
        assert summary["avg_jct_speedup"] == pytest.approx(float(table.set_index("policy").at[pol, "avg_jct_speedup"]))
        cfg = json.loads((out / pol / "config.json").read_text())
        assert cfg["reference"] == REFERENCE and cfg["discipline"]["name"] == "default"
        assert cfg["discipline"] == {"name": "default", **effective_discipline(cfg["policy_config"])}
    assert json.loads((out / REFERENCE / "config.json").read_text())["discipline"]["backfill"] == "easy"
    assert not (out / "figures").exists()  # --no-plots: no figures at all
    # the printed table: hours, plain decimals, one speed-up column per kind
    assert "avg JCT h" in printed.out and "avg JCT x" in printed.out and not re.search(r"\de[+-]\d", printed.out)


def test_baseline_and_discipline_flags(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *ARGS, "--policies", "mlora,tlora", "--baseline", "mlora", "--discipline", "shared",
                 "--out", str(out), "--no-plots"]) == 0
    assert "reference mlora;" in capsys.readouterr().out  # named, not added (it is among the policies)
    table = pd.read_csv(out / "summary.csv").set_index("policy")
    assert list(table.index) == ["mlora", "tlora"] and table.at["mlora", "avg_jct_speedup"] == 1.0
    cfg = json.loads((out / "tlora" / "config.json").read_text())
    assert cfg["discipline"]["name"] == "shared" and cfg["reference"] == "mlora"
    with pytest.raises(SystemExit):
        main(["compare", *ARGS, "--policies", "tlora", "--discipline", "fair", "--out", str(tmp_path / "x")])


@pytest.mark.parametrize("discipline", ["default", "shared", "native"])
@pytest.mark.parametrize("policy", ["independent-backfill", "mlora", "tlora", "alto"])
def test_discipline_options_only_keys_the_policy_has(policy, discipline):
    from tlora_sim.policies.registry import config_of, make_policy

    fields = config_of(make_policy(policy))
    opts = policy_options_with_discipline(policy, discipline, {})
    assert set(opts) <= set(fields)
    assert policy_options_with_discipline(policy, discipline, {"max_group_size": 3}).get("max_group_size") == 3


def test_with_reference_and_effective_discipline():
    assert with_reference(["tlora"]) == ([REFERENCE, "tlora"], True)
    assert with_reference(["tlora", REFERENCE]) == (["tlora", REFERENCE], False)
    assert effective_discipline({"ordering": "backfill"}) == {"order": "fifo", "backfill": "easy"}
    assert effective_discipline({"ordering": "urgency"}) == {"order": "urgency", "backfill": "none"}
    assert effective_discipline({"order": "sjf", "backfill": "conservative", "ordering": "fifo"}) == {
        "order": "sjf", "backfill": "conservative"}
    assert effective_discipline({}) == {"order": None, "backfill": None}


def test_relative_table_defaults_to_the_reference():
    summary = pd.DataFrame({"policy": ["tlora", REFERENCE], "avg_jct_s": [50.0, 100.0], "p90_jct_s": [80.0, 100.0],
                            "throughput_tokens_per_s": [3.0, 2.0], "makespan_s": [90.0, 100.0]})
    rel = plots.relative_table(summary).set_index("policy")
    assert rel.at["tlora", "avg_jct_speedup"] == 2.0 and rel.at[REFERENCE, "throughput_x"] == 1.0
    with pytest.raises(InputError, match="available policies: tlora "):
        plots.relative_table(summary.iloc[:1])
    sp = speedups(summary, REFERENCE).set_index("policy")
    assert sp.at["tlora", "makespan_speedup"] == pytest.approx(100 / 90) and sp.at[REFERENCE, "p90_jct_speedup"] == 1.0
    with pytest.raises(InputError, match="available policies"):
        speedups(summary, "lookahead")


def test_number_formats_have_no_e_notation():
    assert fmt_number(1.2345e-5) == "0.0000123" and fmt_number(123456789.0) == "123,456,789"
    assert fmt_number(float("nan")) == "n/a" and fmt_number(0.954) == "0.954"
    t = pd.DataFrame({"policy": ["a"], "jobs": [3], "avg_jct_s": [1e7], "avg_jct_speedup": [1.0],
                      "avg_jct_speedup_ci95": [0.25], "avg_jct_s_ci95": [3600.0]})
    text = format_table(t)
    assert "2,778 ±1.0" in text and "1.00 ±0.25" in text and "e+" not in text


def test_quiet_and_verbose_after_the_subcommand(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["replay", *ARGS, "--policy", "mlora", "--out", str(out), "--no-plots", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "mlora: kept 24 of 24 jobs" in printed  # -q never hides the kept line
    assert main(["-q", "replay", *ARGS, "--policy", "mlora", "--out", str(out), "--no-plots", "--force", "-v"]) == 0
    assert "kept 24 of 24" in capsys.readouterr().out


def test_seeds_carry_speedups_with_confidence_intervals(tmp_path, capsys):
    out = tmp_path / "seeds"
    assert main(["compare", "--trace", "synthetic:jobs=16", "--cluster", "1x8xH100", "--no-progress",
                 "--policies", "mlora", "--seeds", "0-1", "--out", str(out), "--workers", "1"]) == 0
    agg = pd.read_csv(out / "summary.csv").set_index("policy")
    assert list(agg.index) == [REFERENCE, "mlora"]
    assert agg.at[REFERENCE, "avg_jct_speedup"] == 1.0 and agg.at[REFERENCE, "avg_jct_speedup_ci95"] == 0.0
    by_seed = pd.read_csv(out / "summary_by_seed.csv")
    m = by_seed[by_seed.policy == "mlora"]["avg_jct_speedup"]
    assert agg.at["mlora", "avg_jct_speedup"] == pytest.approx(m.mean())
    assert (out / "figures" / "seeds_avg_jct.png").is_file()
    assert "±" in capsys.readouterr().out
