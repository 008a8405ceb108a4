"""The layering rules of docs/architecture.md, checked on the source with ``ast``: which package
may import which, and no import cycle between modules (imports inside functions count too, except
in ``sim/cli``, the top, and ``sim/experiments``, which may reach any layer)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "policies", "traces", "profiler")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out["tlora_sim." + ".".join(parts)] = p
    return out


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tlora_sim"):
            found.add(node.module)
            for a in node.names:
                found.add(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tlora_sim"))
    return found


MODS = _modules()


def _deps(mod: str, top_level_only: bool = False) -> set[str]:
    return {d for d in _imports(MODS[mod], top_level_only) if d in MODS and d != mod}


def test_traces_import_nothing_from_the_rest():
    bad = {m: d for m in MODS if m.startswith("tlora_sim.traces")
           for d in _deps(m) if not d.startswith("tlora_sim.traces")}
    assert not bad, bad


def test_costmodel_sits_below_core_and_policies():
    bad = [(m, d) for m in MODS if m.startswith("tlora_sim.sim.costmodel") for d in _deps(m)
           if d.startswith(("tlora_sim.sim.core", "tlora_sim.sim.experiments", "tlora_sim.sim.report",
                            "tlora_sim.sim.cli", "tlora_sim.policies", "tlora_sim.profiler"))]
    assert not bad, bad


def test_core_imports_no_policy_experiment_report_or_cli():
    bad = [(m, d) for m in MODS if m.startswith("tlora_sim.sim.core") for d in _deps(m)
           if d.startswith(("tlora_sim.sim.experiments", "tlora_sim.sim.report", "tlora_sim.sim.cli",
                            "tlora_sim.policies", "tlora_sim.profiler"))]
    assert not bad, bad


def test_policies_use_only_the_snapshot_side_of_the_simulator():
    allowed = ("tlora_sim.policies", "tlora_sim.traces", "tlora_sim.sim.core.snapshot", "tlora_sim.sim.core.jobs",
               "tlora_sim.sim.core.placement", "tlora_sim.sim.core.cluster", "tlora_sim.sim.costmodel.interface",
               "tlora_sim.sim.costmodel.roofline")  # roofline: the contract checker's default snapshots
    bad = [(m, d) for m in MODS if m.startswith("tlora_sim.policies") for d in _deps(m) if not d.startswith(allowed)]
    assert not bad, bad


def test_no_import_cycle_between_modules():
    graph = {m: _deps(m, top_level_only=True) for m in MODS}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                cycle.extend(path[path.index(d):] + [d] if d in path else [m, d])
                return True
            if d not in state and visit(d, path + [d]):
                return True
        state[m] = 2
        return False

    for m in sorted(graph):
        if m not in state and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)


def test_no_source_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODS.values() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
