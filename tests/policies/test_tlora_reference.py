"""``tlora-ref`` (``policies/tlora/reference.py``: the plain reading of ``policies/tlora/rules.py``,
every group and pair examined in every decision) and ``tlora`` (the same rules through the index,
``policies/tlora/index.py``) write byte-identical ``jobs.csv`` files through ``tlora-sim compare`` on
small contended workloads, as ``lookahead`` and ``tlora-ref`` with ``lookahead``'s options do.

The regroup pause is not priced here (``--regroup-pause 0``): with it priced, a refusal that the
index keeps while a group is unchanged can go stale as the members' budgets grow (docs/policies.md,
"tLoRA's promise"), and the two may differ. And the binary cut of ``rules.py`` finds the largest
feasible prefix.
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, strategies as st

from tlora_sim.policies.tlora import rules
from tlora_sim.sim.cli.main import main

CASES = [
    ("synthetic:jobs=300,seed=5,load=0.9,gpus=32", "4x8xH100", "profiled"),
    ("synthetic:jobs=300,seed=2,load=1.2,gpus=32", "4x8xH100", "roofline"),
]

LOOKAHEAD = ["--option", "tlora-ref.order=srpt-aged", "--option", "tlora-ref.backfill_order=sjf",
             "--option", "tlora-ref.join_rule=throughput"]


def _compare(tmp_path, policies: str, trace: str, spec: str, cost_model: str, *extra: str) -> tuple[bytes, bytes]:
    out = tmp_path / "cmp"
    rc = main(["compare", "--policies", policies, "--trace", trace, "--cluster", spec, "--cost-model", cost_model,
               "--regroup-pause", "0", "--out", str(out), "--no-plots", "--no-progress", "-q", *extra])
    assert rc in (0, None)
    fast, ref = policies.split(",")
    return (out / fast / "jobs.csv").read_bytes(), (out / ref / "jobs.csv").read_bytes()


def _exercised(path) -> None:
    """The workload is contended and grouped: jobs wait, share groups and change groups."""
    jobs = pd.read_csv(path)
    assert (jobs.queue_s > 0).mean() > 0.2, "the workload must build a queue"
    assert (jobs.max_group_size > 1).sum() > 20 and (jobs.group_changes > 0).sum() > 10


@pytest.mark.parametrize("trace, spec, cost_model", CASES)
def test_tlora_ref_writes_tloras_jobs_csv(tmp_path, trace, spec, cost_model):
    fast, ref = _compare(tmp_path, "tlora,tlora-ref", trace, spec, cost_model)
    _exercised(tmp_path / "cmp" / "tlora-ref" / "jobs.csv")
    assert fast == ref


@pytest.mark.parametrize("trace, spec, cost_model", CASES[:1])
def test_tlora_ref_with_lookaheads_options_writes_lookaheads_jobs_csv(tmp_path, trace, spec, cost_model):
    fast, ref = _compare(tmp_path, "lookahead,tlora-ref", trace, spec, cost_model, *LOOKAHEAD)
    _exercised(tmp_path / "cmp" / "tlora-ref" / "jobs.csv")
    assert fast == ref


@given(st.integers(0, 40), st.integers(0, 50))
def test_binary_cut_finds_the_largest_feasible_prefix(n, last_ok):
    """``rules.binary_cut`` over a predicate true up to ``last_ok`` and false after: the largest k
    in 0..n it holds for, in O(log n) calls."""
    calls = []

    def ok(k: int) -> bool:
        calls.append(k)
        return k <= last_ok

    assert rules.binary_cut(ok, n) == min(n, last_ok)
    assert len(calls) <= max(n, 1).bit_length() + 1 and all(1 <= k <= n for k in calls)
