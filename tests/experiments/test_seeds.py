"""Several seeds with confidence intervals: parsing, the CI formula, the synthetic seed rule and
a small ``compare --seeds`` end to end."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tlora_sim.sim.experiments.seeds import aggregate, ci95, parse_seeds, seed_spec
from tlora_sim.traces.errors import InputError


def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("3,1,1-2") == [1, 2, 3]
    for bad in ("", "a", "4-1", "-1", "0-5000", "1,,2"):
        with pytest.raises(InputError):
            parse_seeds(bad)


def test_ci95_is_students_t_half_width():
    v = np.array([10.0, 12.0, 14.0])
    # t_{0.975,2} = 4.302653; s = 2; n = 3
    assert ci95(v) == pytest.approx(4.302653 * 2 / math.sqrt(3), rel=1e-6)
    assert ci95(np.array([5.0])) == 0.0


def test_aggregate_keeps_policy_order_and_adds_ci_columns():
    by = pd.DataFrame({"policy": ["b", "a", "b", "a"], "seed": [0, 0, 1, 1], "avg_jct_s": [1.0, 3.0, 3.0, 5.0]})
    agg = aggregate(by)
    assert list(agg.policy) == ["b", "a"] and list(agg.seeds) == [2, 2]
    assert list(agg.avg_jct_s) == [2.0, 4.0] and (agg.avg_jct_s_ci95 > 0).all()


def test_seed_redraws_synthetic_traces_unless_fixed():
    assert seed_spec("synthetic:jobs=10", 3) == "synthetic:jobs=10,seed=3"
    assert seed_spec("synthetic:default", 2) == "synthetic:seed=2"
    assert seed_spec("synthetic:jobs=10,seed=1", 3) == "synthetic:jobs=10,seed=1"
    assert seed_spec("itp:x.csv", 3) == "itp:x.csv"


def test_compare_seeds_end_to_end(tmp_path):
    out = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--trace", "synthetic:jobs=40",
                        "--cluster", "1x8xH100", "--policies", "independent,independent-backfill", "--seeds", "0-2",
                        "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    agg = pd.read_csv(out / "summary.csv")
    by = pd.read_csv(out / "summary_by_seed.csv")
    assert list(agg.policy) == ["independent", "independent-backfill"] and (agg.seeds == 3).all()
    assert {"avg_jct_s", "avg_jct_s_ci95", "p90_jct_s_ci95"} <= set(agg.columns)
    assert len(by) == 6 and sorted(set(by.seed)) == [0, 1, 2]
    mine = by[by.policy == "independent"].avg_jct_s
    assert agg.avg_jct_s[0] == pytest.approx(mine.mean())
    assert mine.nunique() == 3  # each seed drew its own trace
    for s in range(3):
        assert (out / f"seed-{s}" / "independent" / "summary.json").is_file()
    assert (out / "figures" / "seeds_avg_jct.png").is_file()  # bars with 95% intervals
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "plot", str(out), "--format", "pdf"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "seeds_avg_jct.pdf" in r.stdout
