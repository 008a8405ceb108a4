"""``bench/policy_study.py --merge``: re-run policies replace their per-seed rows in place, the rest
are kept, and a re-run baseline that differs from the stored one stops the merge."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "policy_study.py"


@pytest.fixture(scope="module")
def study():
    """``bench/policy_study.py`` imported as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_policy_study_under_test", SCRIPT)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def rows(study, policy_jct: dict[str, float], seeds=(0, 1), commit="old") -> pd.DataFrame:
    """Per-seed rows of workload ``w``: each policy's avg JCT (s) plus the seed (so seeds differ)."""
    out = []
    for seed in seeds:
        for pol, jct in policy_jct.items():
            r = {c: 1.0 for c in study.BY_SEED}
            r.update(workload="w", policy=pol, seed=seed, avg_jct_s=jct + seed, p90_jct_s=2 * (jct + seed),
                     throughput_tokens_per_s=100.0, commit=commit)
            out.append(r)
    return pd.DataFrame(out, columns=study.BY_SEED)


def test_merge_replaces_the_re_run_rows_in_place_and_recomputes_vs_tlora(study):
    stored = rows(study, {study.BASELINE: 100.0, "tlora": 50.0, "lookahead": 40.0})
    new = rows(study, {study.BASELINE: 100.0, "tlora": 45.0}, commit="new")
    merged = study.merge(stored, new, ["tlora"])
    assert list(zip(merged.policy, merged.seed)) == list(zip(stored.policy, stored.seed))  # same rows, same order
    assert merged[merged.policy == "tlora"].avg_jct_s.tolist() == [45.0, 46.0]
    assert set(merged[merged.policy == "tlora"].commit) == {"new"}
    assert merged[merged.policy != "tlora"].equals(stored[stored.policy != "tlora"])
    table = study.ratios(merged.assign(discipline="default")).set_index("policy")
    assert table.loc["lookahead", "vs_tlora"] == pytest.approx((45 / 40 + 46 / 41) / 2)
    assert table.loc["lookahead", "commit"] == "old" and table.loc["tlora", "commit"] == "new"


def test_merge_refuses_a_baseline_that_differs_from_the_stored_one(study):
    stored = rows(study, {study.BASELINE: 100.0, "tlora": 50.0})
    new = rows(study, {study.BASELINE: 101.0, "tlora": 45.0}, commit="new")
    with pytest.raises(SystemExit, match="differ"):
        study.merge(stored, new, ["tlora"])
