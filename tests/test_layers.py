"""The layering rules of docs/architecture.md, checked on the source with ``ast``.

* Every row of the layer table (``## Layers``) is read from the document itself: its package and
  the backticked packages or modules it *may import*; every import of every module (imports
  inside functions count: they are imports all the same) must stay inside its own package or
  go to one of those. ``KNOWN_LAYER_VIOLATIONS`` lists the imports that break a row today, each
  with why it is left; the list may only shrink (a fixed entry must be removed from it).
* No import cycle between modules, imports inside functions counted.
* No private name (leading underscore) imported across modules: none at all in
  ``sim/costmodel``; elsewhere only the ``KNOWN_PRIVATE_IMPORTS`` of today, which may only shrink.
* ``sim/costmodel`` holds no re-export shim (an import kept only for other modules, ``noqa: F401``).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "policies", "traces", "profiler")
ARCH = ROOT / "docs" / "architecture.md"


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


MODS = _modules()


def _resolve(name: str) -> str | None:
    """The project module ``name`` is, or is inside (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name and name not in MODS:
        name = name.rpartition(".")[0]
    return name or None


def _scan(mod: str) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules ``mod`` imports anywhere in its file, (module, name) of each private name it imports)."""
    tree = ast.parse(MODS[mod].read_text())
    deps, private = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tlora_sim"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                target = full if full in MODS else _resolve(node.module)
                if target and target != mod:
                    deps.add(target)
                    if full not in MODS and a.name.startswith("_") and not a.name.startswith("__"):
                        private.append((node.module, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = _resolve(a.name) if a.name.startswith("tlora_sim") else None
                if target and target != mod:
                    deps.add(target)
    return deps, private


SCAN = {m: _scan(m) for m in MODS}


def _dotted(cell: str) -> str:
    """``sim/costmodel/`` or ``traces.errors`` -> ``tlora_sim.sim.costmodel`` / ``tlora_sim.traces.errors``."""
    return "tlora_sim." + cell.strip().strip("/").replace("/", ".").removesuffix(".py")


def layer_rows() -> dict[str, tuple[str, ...] | None]:
    """The layer table of docs/architecture.md: package -> what it may import (module prefixes;
    None = everything)."""
    text = ARCH.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        pkg = _dotted(cells[0].strip("`"))
        may = cells[2]
        if may.strip() == "everything":
            rows[pkg] = None
        else:
            rows[pkg] = tuple(_dotted(x) for x in re.findall(r"`([^`]+)`", may))
            assert rows[pkg] or may.strip() == "nothing of the project", f"row {cells[0]}: cannot read {may!r}"
    return rows


ROWS = layer_rows()


def _row_of(mod: str) -> str | None:
    hits = [r for r in ROWS if mod == r or mod.startswith(r + ".")]
    return max(hits, key=len) if hits else None


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


# Imports that break a row of the table today, left for the rooms that own them (issue 42, items
# 3 and 4). Remove an entry when its import goes; add none.
KNOWN_LAYER_VIOLATIONS = {
    # the executor reuses replay's run-coverage and version records (item 4: one runtime room)
    ("tlora_sim.sim.executor.execute", "tlora_sim.sim.experiments.replay"),
    # the profiler's figures refit and re-predict the artifact (they belong with the profiler)
    ("tlora_sim.sim.report.profiler_plots", "tlora_sim.profiler.fit"),
    ("tlora_sim.sim.report.profiler_plots", "tlora_sim.sim.costmodel.profiled.artifact"),
    ("tlora_sim.sim.report.profiler_plots", "tlora_sim.sim.costmodel.profiled.model"),
    # the step-ratio validation reads executor runs (a validate-run tool living in the profiler)
    ("tlora_sim.profiler.validation.step_ratio", "tlora_sim.sim.executor.steptable"),
    ("tlora_sim.profiler.validation.step_ratio", "tlora_sim.sim.executor.validate"),
    ("tlora_sim.profiler.validation.step_ratio", "tlora_sim.sim.executor.workload"),
}


def _layer_violations() -> set[tuple[str, str]]:
    bad = set()
    for m, (deps, _) in SCAN.items():
        row = _row_of(m)
        for d in deps:
            if row is None:
                bad.add((m, d))  # a module outside every row may import nothing of the project
                continue
            may = ROWS[row]
            if may is None or _under(d, row) or any(_under(d, p) for p in may):
                continue
            bad.add((m, d))
    return bad


def test_the_layer_table_has_every_package():
    want = {"tlora_sim.traces", "tlora_sim.sim.costmodel", "tlora_sim.sim.core", "tlora_sim.policies",
            "tlora_sim.sim.experiments", "tlora_sim.sim.report", "tlora_sim.sim.executor", "tlora_sim.sim.cli",
            "tlora_sim.profiler", "tlora_sim.sim.api"}
    assert want <= set(ROWS), sorted(want - set(ROWS))
    for row, may in ROWS.items():
        assert row in MODS, f"docs/architecture.md names {row}, which is no package"
        for p in may or ():
            assert p in MODS, f"row {row}: {p} is no module or package"


def test_every_module_imports_only_what_its_row_allows():
    bad = _layer_violations()
    new = sorted(bad - KNOWN_LAYER_VIOLATIONS)
    assert not new, "imports against docs/architecture.md's layer table:\n" + "\n".join(f"{m} -> {d}" for m, d in new)


def test_known_layer_violations_only_shrink():
    gone = sorted(KNOWN_LAYER_VIOLATIONS - _layer_violations())
    assert not gone, "fixed, remove from KNOWN_LAYER_VIOLATIONS: " + ", ".join(f"{m} -> {d}" for m, d in gone)


def test_the_row_check_finds_a_violation():
    """The check itself: a core module importing a policy is reported (not an allowed prefix)."""
    row = _row_of("tlora_sim.sim.core.engine")
    assert row == "tlora_sim.sim.core"
    assert not any(_under("tlora_sim.policies.tlora", p) for p in ROWS[row])
    assert any(_under("tlora_sim.sim.costmodel.profiled.model", p) for p in ROWS[row])


def test_no_import_cycle_between_modules():
    graph = {m: SCAN[m][0] for m in MODS}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


# Private names imported across modules today, outside sim/costmodel (which has none), by
# importing module: the splits of large files into rooms that kept their helpers private. Remove
# an entry when its import goes; add none. Counts: sim/report 22, profiler 2 (unused re-exports removed).
KNOWN_PRIVATE_IMPORTS = {
    "tlora_sim.sim.report.plots": {
        "tlora_sim.sim.report.rundata": "_BAR_METRICS _TIMELINE_COLUMNS _check_formats _read_timeline _warn",
        "tlora_sim.sim.report.figures": "_available_bar_metrics",
    },
    "tlora_sim.sim.report.load_sweep": {
        "tlora_sim.sim.report.rundata": "_LW _S_PER_H _check_formats _numeric _warn",
        "tlora_sim.sim.report.figures": "_legend",
    },
    "tlora_sim.sim.report.figures": {
        "tlora_sim.sim.report.rundata": "_BARS_COLUMN_MAX_POLICIES _BAR_METRICS _LW _S_PER_DAY _S_PER_H _warn",
    },
    "tlora_sim.sim.report.profiler_plots": {
        "tlora_sim.sim.report.kernel_figures": "_BAND _RELATIVE _log_ticks _warn",
    },
    "tlora_sim.profiler.data.kernel_small4_h100_2026-11-27.gpu29_sanity": {
        "tlora_sim.profiler.kernels._tiny": "_tb_kernel _tf_kernel",
    },
}


def _private_imports() -> set[tuple[str, str, str]]:
    return {(m, src, name) for m, (_, priv) in SCAN.items() for src, name in priv}


def _known_private() -> set[tuple[str, str, str]]:
    return {(m, src, n) for m, by in KNOWN_PRIVATE_IMPORTS.items() for src, names in by.items() for n in names.split()}


def test_no_private_name_imported_across_modules():
    found = _private_imports()
    cost = sorted(x for x in found if x[0].startswith("tlora_sim.sim.costmodel"))
    assert not cost, cost
    assert not any(m.startswith("tlora_sim.sim.costmodel") for m in KNOWN_PRIVATE_IMPORTS)
    new = sorted(found - _known_private())
    assert not new, "private names imported across modules:\n" + "\n".join(f"{m}: {n} from {s}" for m, s, n in new)


def test_known_private_imports_only_shrink():
    gone = sorted(_known_private() - _private_imports())
    assert not gone, "fixed, remove from KNOWN_PRIVATE_IMPORTS: " + ", ".join(f"{m}: {n}" for m, _, n in gone)
    by_pkg = Counter(".".join(m.split(".")[1:3]) if m.startswith("tlora_sim.sim.") else m.split(".")[1]
                     for m, _, _ in _known_private())
    assert by_pkg["sim.report"] <= 46 and by_pkg["sim.experiments"] <= 3 and by_pkg["profiler"] <= 4, by_pkg


def test_costmodel_holds_no_reexport_shim():
    shims = [f"{p.relative_to(ROOT)}:{i}" for m, p in MODS.items() if m.startswith("tlora_sim.sim.costmodel")
             for i, line in enumerate(p.read_text().splitlines(), 1) if "import" in line and "F401" in line]
    assert not shims, shims
