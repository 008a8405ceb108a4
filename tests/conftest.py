"""Shared helpers for the simulator tests: hand-built jobs, snapshots and engine runs, Hypothesis
settings, and the reliability counters printed at the end of a run.

Reliability counters: a test adds to them with the ``reliability`` fixture
(``reliability("bad_inputs")``, ``reliability("invariant_cases", n)``, ...). The numbers travel as
pytest ``user_properties`` (so they survive ``pytest -n 2``), only passing tests count, and the
terminal summary prints one line per counter (``tests/RELIABILITY.md`` quotes them).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import pytest

try:
    from hypothesis import HealthCheck, settings

    # Modest example counts: the property tests run in about a minute on 2 cores.
    settings.register_profile("ci", deadline=None, max_examples=40, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
    settings.register_profile("thorough", deadline=None, max_examples=500,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass

# ---- the fast lane (`make test-fast`) ---------------------------------------------------------------
# With TLORA_TEST_FAST=1 the GPU-side and heavy optional stacks are hidden: importing torch, triton,
# ray or nbclient fails, so `pytest.importorskip(...)` skips the tests that need them, and test files
# that import them at module level are not collected at all.
FAST_LANE = os.environ.get("TLORA_TEST_FAST") == "1"
HEAVY_MODULES = ("torch", "triton", "ray", "nbclient")
_HEAVY_LINE = re.compile(r"^(?:import|from)\s+(?:%s)\b|^from tlora_sim\.profiler\.kernels\b|^\w+\s*=\s*pytest\.importorskip\(\"(?:%s)\"\)"
                         % ("|".join(HEAVY_MODULES), "|".join(HEAVY_MODULES)), re.MULTILINE)
if FAST_LANE:
    import importlib.abc
    import sys

    class _HideHeavy(importlib.abc.MetaPathFinder):
        """Makes ``import torch`` (etc.) raise ModuleNotFoundError, without a ``sys.modules`` entry
        (scipy and others look there and would take a placeholder for the real module)."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY_MODULES:
                raise ModuleNotFoundError(f"{name} is hidden in the fast lane (TLORA_TEST_FAST=1)", name=name)
            return None

    sys.meta_path.insert(0, _HideHeavy())


def pytest_ignore_collect(collection_path, config):
    """In the fast lane, skip collecting test files that need a heavy stack at module level."""
    if FAST_LANE and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        try:
            return bool(_HEAVY_LINE.search(collection_path.read_text(encoding="utf-8")))
        except OSError:
            return None
    return None


from tlora_sim.sim.core.cluster import ClusterSpec, parse_cluster
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.core.engine import Engine, SimResult
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus
from tlora_sim.sim.costmodel.roofline import RooflineCostModel
from tlora_sim.sim.core.snapshot import GroupView, Snapshot

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
ITP02 = SHARED / "msr-itp-elasticflow" / "cluster02.csv.gz"
needs_itp = pytest.mark.skipif(not ITP02.is_file(),
                               reason=f"ITP trace not found at {ITP02} (../shared/traces is not checked out)")

CM = RooflineCostModel()


# ---- reliability counters ------------------------------------------------------------------------
_COUNTS: Counter = Counter()
COUNTER_NAMES = {
    "bad_inputs": "bad inputs rejected with one clear error (file/row/field, exit 2, no traceback)",
    "fuzz_files": "malformed trace files fed to the readers (fuzzing; each rejected cleanly or read validly)",
    "invariant_cases": "simulations checked against every invariant (generated + hand-built)",
    "policy_cases": "snapshots (generated + hand-built) whose policy decision was checked against its rules",
    "violations_caught": "deliberately broken runs whose invariant violation was caught with its history",
    "determinism_cases": "output files compared byte for byte between repeated runs",
    "signal_cases": "interrupted runs that left only complete files and no temp file",
}


@pytest.fixture
def reliability(record_property) -> Callable[[str, int], None]:
    """``reliability(name, n=1)``: add ``n`` to a reliability counter (counted if the test passes)."""

    def add(name: str, n: int = 1) -> None:
        assert name in COUNTER_NAMES, name
        record_property(f"reliability:{name}", int(n))

    return add


def pytest_runtest_logreport(report) -> None:
    """Collect the counters of passing tests (runs on the xdist controller too)."""
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if isinstance(key, str) and key.startswith("reliability:"):
                _COUNTS[key.split(":", 1)[1]] += int(value)


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the reliability counters (only when some test recorded one)."""
    if not _COUNTS:
        return
    terminalreporter.section("reliability counts (passing tests only)")
    for name, what in COUNTER_NAMES.items():
        terminalreporter.write_line(f"{name:>18}: {_COUNTS.get(name, 0):6d}  {what}")


# ---- hand-built objects -------------------------------------------------------------------------
def cluster(spec: str = "2x8xH100") -> ClusterSpec:
    """A cluster from its ``NODESxGPUSxTYPE`` spec."""
    return parse_cluster(spec)


def make_job(index: int, *, submit: float = 0.0, gpus: int = 1, model: str = "llama3-8b", rank: int = 8,
             batch: int = 2, seq: int = 1024, steps: int = 100, slowdown: float = 1.5,
             gpu: str = "H100", iso_scale: float = 1.0, job_id: str | None = None) -> Job:
    """A job whose isolated step time comes from the roofline model (plan ``alone``), times ``iso_scale``."""
    iso = CM.step_time_s(model, gpu, (Member(rank, batch, seq),), gpus, "alone") * iso_scale
    return Job(index, job_id or f"j{index}", float(submit), gpus, model, rank, batch, seq, int(steps),
               steps * iso, iso, float(slowdown))


def reindex(jobs: Sequence[Job]) -> list[Job]:
    """Sort jobs by submit time (stable) and renumber ``index`` 0..n-1."""
    from dataclasses import replace

    return [replace(j, index=i) for i, j in enumerate(sorted(jobs, key=lambda j: (j.submit_time_s, j.index)))]


def snapshot(queue: Sequence[Job], *, spec: str = "1x8xH100", free: Sequence[int] | None = None,
             groups: Sequence[GroupView] = (), now: float = 0.0) -> Snapshot:
    """A read-only snapshot: ``free`` GPUs per node (default: all free minus the groups' placements)."""
    c = cluster(spec)
    if free is None:
        free = [c.gpus_per_node] * c.nodes
        for g in groups:
            for node, k in g.placement:
                free[node] -= k
    return Snapshot(now, tuple(queue), {g.group_id: g for g in groups},
                    FreeGpus(list(free), c.gpus_per_node, c.nodes_per_rack), c, CM)


def group_view(gid: int, members: Sequence[Job], placement, plan: str = "fused", *, remaining=None,
               version: int = 0) -> GroupView:
    """A running group as a policy sees it (step time from the roofline model)."""
    n = sum(k for _, k in placement)
    step = CM.step_time_s(members[0].model, "H100", [j.member for j in members], n, plan)
    rem = tuple(remaining) if remaining is not None else tuple(float(j.total_steps) for j in members)
    return GroupView(gid, members[0].model, n, tuple(placement), plan, tuple(members), rem, step, 0.0, version)


def run_engine(jobs: Sequence[Job], policy, spec: str = "2x8xH100", *, pause: float = 30.0,
               check: bool = True, cost_model=None) -> SimResult:
    """Run the engine (invariants checked by default) and return its result (cost model: the
    suite's roofline ``CM`` unless given)."""
    return Engine(list(jobs), cluster(spec), cost_model or CM, policy, regroup_pause_s=pause,
                  check_invariants=check).run()


def policy(name: str, **options):
    """A registered policy with config overrides."""
    from tlora_sim.policies.registry import make_policy

    return make_policy(name, options)
