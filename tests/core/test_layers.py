"""The layering rules of docs/architecture.md, checked on the source with ``ast``.

* Every row of the layer table (``## Layers``) is read from the document itself: its package and
  the backticked packages or modules it *may import*; every import of every module (imports
  inside functions count: they are imports all the same) must stay inside its own package or
  go to one of those. ``KNOWN_LAYER_VIOLATIONS`` lists the imports that break a row today, each
  with why it is left; the list may only shrink (a fixed entry must be removed from it).
* No import cycle between modules, imports inside functions counted.
* No private name (leading underscore) imported across modules, in any package nor in bench/ and
  tests/ (nor read as an attribute of an imported module), and no private module imported from
  outside its own package: tests go through the public API (or a name its module made public).
* No re-export shim in any package: no name imported only for other modules to take (unused at
  the top level of a module, or on a ``noqa: F401`` line), and none imported through a module
  that does not define it; only a declared API (a package's ``__init__.py``, a module named
  ``api``) imports names for others. ``KNOWN_REEXPORTS`` lists those left in files other rooms are
  rewriting; it may only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
SCRIPT_DIRS = ("bench", "tests")


def _script_modules() -> dict[str, Path]:
    """The files of bench/ and tests/ under the names they are imported by: ``bench.kernels``
    (bench/ is imported from the repository root), ``conftest`` (pytest puts tests/ on the path;
    ``from conftest import ...``), the test files by their path (``tests.core.test_engine``)."""
    out = {}
    for d in SCRIPT_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            out["conftest" if rel == Path("tests/conftest") else ".".join(rel.parts)] = p
    return out


SCRIPTS = _script_modules()
ALL = {**MODS, **SCRIPTS}
# folders imported as namespace packages (no ``__init__.py``): ``from bench import kernels``
NAMESPACES = {m.rsplit(".", k)[0] for m in SCRIPTS for k in range(1, m.count(".") + 1)} - set(ALL)


def _resolve(name: str) -> str | None:
    """The project module ``name`` is, or is inside (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name and name not in ALL:
        name = name.rpartition(".")[0]
    return name or None


def _source(mod: str, node: ast.ImportFrom) -> str | None:
    """The project module a ``from ... import`` in ``mod`` reads (relative imports resolved)."""
    if not node.level:
        return node.module if node.module and (_resolve(node.module) or node.module in NAMESPACES) else None
    pkg = mod if ALL[mod].name == "__init__.py" else mod.rpartition(".")[0]
    for _ in range(node.level - 1):
        pkg = pkg.rpartition(".")[0]
    return pkg + ("." + node.module if node.module else "")


def _package(mod: str) -> str:
    """The package ``mod`` is in (itself for a package's ``__init__.py``; ``bench`` for
    ``bench.kernels``; ``""`` for ``conftest``)."""
    return mod if ALL[mod].name == "__init__.py" else mod.rpartition(".")[0]


def _private_module(target: str, mod: str) -> tuple[str, str] | None:
    """(package, name) when ``target`` is a private module (``tlora_sim.profiler.kernels._old``, or
    one inside a private package) that ``mod`` imports from outside the package holding it; a
    private module is its package's own business."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            if not _under(_package(mod), owner):
                return owner, part
            return None
    return None


def _scan(mod: str, text: str | None = None) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules ``mod`` imports anywhere in its file, (module, name) of each private name it imports
    or reads through an imported module, ``mod_alias._name``, and of each private module it imports
    from outside that module's package); relative imports (``from ._old import ...``) count as the
    absolute ones they are. ``mod`` is a package module or a file of bench/ or tests/ (``ALL``)."""
    tree = ast.parse(ALL[mod].read_text() if text is None else text)
    deps, private = set(), []
    modules = {}  # name bound to another project module -> that module (``from . import lora_kernels as K_``)

    def private_module(name: str) -> None:  # ``name``: the module as the import names it
        hit = _private_module(name, mod)
        if hit and hit not in private:
            private.append(hit)

    for node in ast.walk(tree):
        src = _source(mod, node) if isinstance(node, ast.ImportFrom) else None
        if src:
            private_module(src)
            for a in node.names:
                full = f"{src}.{a.name}"
                target = full if full in ALL else _resolve(src)
                if target and target != mod:
                    deps.add(target)
                    if full in ALL:
                        private_module(full)
                        modules[a.asname or a.name] = full
                    elif _private(a.name):
                        private.append((src, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = _resolve(a.name)
                if target and target != mod:
                    deps.add(target)
                    private_module(a.name)
                    if a.asname and a.name in ALL:
                        modules[a.asname] = a.name
    for node in ast.walk(tree):  # ``K_._f1_kernel``: a private name of another module, read through it
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr) and f"{modules[node.value.id]}.{node.attr}" not in ALL):
            private.append((modules[node.value.id], node.attr))
    return deps, private


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


SCAN = {m: _scan(m) for m in MODS}
SCRIPT_SCAN = {m: _scan(m) for m in SCRIPTS}


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


# Imports that break a row of the table today, left for the rooms that own them (issue 42, items
# 3 and 4). Remove an entry when its import goes; add none.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()  # none left (issue 42)


def _layer_violations() -> set[tuple[str, str]]:
    bad = set()
    for m, (deps, _) in SCAN.items():
        row = _row_of(m)
        for d in deps & MODS.keys():  # the packages' rows: bench/ and tests/ have none
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
    graph = {m: SCAN[m][0] & MODS.keys() for m in MODS}
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


def test_no_private_name_imported_across_modules():
    """Package modules and the files of bench/ and tests/ alike: tests check the public API (or a
    name its module made public), benchmarks time it."""
    scans = {**SCAN, **SCRIPT_SCAN}
    found = sorted((m, src, name) for m, (_, priv) in scans.items() for src, name in priv)
    assert not found, "private names imported across modules:\n" + "\n".join(f"{m}: {n} from {s}" for m, s, n in found)


def test_the_scan_covers_bench_and_tests():
    assert {"bench.kernel_host", "bench.kernels", "conftest", "tests.core.test_layers"} <= set(SCRIPT_SCAN)
    assert "tlora_sim.profiler.kernels.lora_kernels" in SCRIPT_SCAN["bench.kernel_host"][0]
    assert "bench.kernels" in SCRIPT_SCAN["bench.kernel_host"][0]   # ``from bench.kernels import ...``
    assert "conftest" in SCRIPT_SCAN["tests.core.test_engine"][0]   # ``from conftest import ...``


def test_the_private_check_finds_private_names(monkeypatch):
    """The check itself, on made-up modules: a private name imported (relative or absolute) or
    read through an imported module is reported, in a package module or a bench/ or tests/ file;
    a private module is reported where it is imported from outside its package, not inside it;
    public names are not."""
    k = "tlora_sim.profiler.kernels"
    monkeypatch.setitem(ALL, f"{k}._old", ALL[f"{k}.lora_kernels"])   # a private module of the kernels
    text = ("from . import _old as K_\nfrom ._old import _gone, dot_prec\nfrom . import lora_kernels as L_\n"
            "from tlora_sim.sim.report.rundata import _warn, load_run\nx = K_._f1_kernel, K_.f1_kernel, L_._x\n")
    _, found = _scan(f"{k}.program", text)
    assert sorted(found) == sorted([(f"{k}._old", "_gone"), ("tlora_sim.sim.report.rundata", "_warn"),
                                    (f"{k}._old", "_f1_kernel"), (f"{k}.lora_kernels", "_x")]), found
    text = ("from tlora_sim.profiler.kernels import _old as K_\nimport tlora_sim.profiler.kernels._old\n"
            "from tlora_sim.profiler.kernels._old import f1_kernel\nfrom tlora_sim.policies import registry\n"
            "from conftest import _helper, make_job\nfrom bench.kernels import MIXES\nregistry._REGISTRY.pop('x')\n")
    for script in ("bench.kernel_host", "tests.core.test_engine"):
        _, found = _scan(script, text)
        assert sorted(set(found)) == sorted([(k, "_old"), ("conftest", "_helper"),
                                             ("tlora_sim.policies.registry", "_REGISTRY")]), (script, found)


# ---- re-export shims -------------------------------------------------------------------------

def _is_api(mod: str) -> bool:
    """A declared API: a package's ``__init__.py`` or a module named ``api`` (``policies/api.py``,
    ``sim/experiments/api.py``). Only these may import names for other modules to take."""
    return MODS[mod].name == "__init__.py" or mod.rpartition(".")[2] == "api"


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines itself at its top level (def, class, assignment; inside top-level
    if/try/with blocks too), not the names it imports."""
    out: set[str] = set()

    def walk(body: list) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    out.update(x.id for x in ast.walk(target) if isinstance(x, ast.Name))
            elif isinstance(n, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for field in ("body", "orelse", "finalbody"):
                    walk(getattr(n, field, None) or [])
                for h in getattr(n, "handlers", []):
                    walk(h.body)

    walk(tree.body)
    return out


def _used_names(tree: ast.Module) -> set[str]:
    """Every name a module reads: ``ast.Name`` nodes, and names inside string annotations."""
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    notes = [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation]
    notes += [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    for a in notes:
        for c in ast.walk(a):
            if isinstance(c, ast.Constant) and isinstance(c.value, str):
                try:
                    used.update(x.id for x in ast.walk(ast.parse(c.value, mode="eval")) if isinstance(x, ast.Name))
                except SyntaxError:
                    pass
    return used


TREES = {m: ast.parse(p.read_text()) for m, p in MODS.items()}
DEFINED = {m: _top_level_names(t) for m, t in TREES.items()}


def reexports(mod: str, tree: ast.Module, text: str) -> set[tuple[str, str]]:
    """(source module, name) of each project name ``mod`` imports for other modules to take:

    * at the top level, a name it never reads (kept only to be imported from here; listing it in
      ``__all__`` does not read it), unless ``mod`` is a declared API (:func:`_is_api`) that says
      so with ``__all__`` rather than a ``noqa: F401`` telling the linter to look away;
    * anywhere (imports inside functions too), a name taken from a module that does not define it
      itself and is no declared API (an import through a middleman, which keeps a shim alive).
    """
    lines = text.splitlines()
    used = _used_names(tree)
    top = set(map(id, tree.body))
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        src = _source(mod, node)
        if src is None or src not in MODS:
            continue
        noqa = any("F401" in line for line in lines[node.lineno - 1:node.end_lineno])
        for a in node.names:
            if f"{src}.{a.name}" in MODS or a.name == "*":
                continue  # a module, not a name
            unused = id(node) in top and (a.asname or a.name) not in used and (noqa or not _is_api(mod))
            middleman = src != mod and not _is_api(src) and a.name not in DEFINED[src]
            if unused or middleman:
                out.add((src, a.name))
    return out


# Re-exports still allowed: module -> names it imports only for others. None is left (issue 42);
# add none.
KNOWN_REEXPORTS: dict[str, str] = {}


def _reexports() -> set[tuple[str, str]]:
    return {(m, name) for m in MODS for _, name in reexports(m, TREES[m], MODS[m].read_text())}


def test_no_reexport_shim():
    known = {(m, n) for m, names in KNOWN_REEXPORTS.items() for n in names.split()}
    new = sorted(_reexports() - known)
    assert not new, ("names imported only for other modules, or through a module that does not define them "
                     "(import them from the defining module):\n" + "\n".join(f"{m}: {n}" for m, n in new))


def test_known_reexports_only_shrink():
    known = {(m, n) for m, names in KNOWN_REEXPORTS.items() for n in names.split()}
    gone = sorted(known - _reexports())
    assert not gone, "fixed, remove from KNOWN_REEXPORTS: " + ", ".join(f"{m}: {n}" for m, n in gone)


def test_the_reexport_check_finds_shims():
    """The check itself, on made-up modules: an unused import (with or without ``noqa: F401``) and a
    name taken through a middleman are each reported; a used import and an API's ``__all__`` are not."""
    mod, api = "tlora_sim.sim.report.plots", "tlora_sim.policies.api"
    text = ("from tlora_sim.sim.report.rundata import load_run, load_compare\n"
            "from tlora_sim.sim.report.style import legend_above  # noqa: F401\n"
            "from tlora_sim.sim.core.cluster import GPUS\n"
            "def f():\n    return load_run(GPUS)\n")
    found = reexports(mod, ast.parse(text), text)
    assert found == {("tlora_sim.sim.report.rundata", "load_compare"), ("tlora_sim.sim.report.style", "legend_above"),
                     ("tlora_sim.sim.core.cluster", "GPUS")}, found
    text = "from tlora_sim.sim.core.snapshot import Snapshot\n__all__ = ['Snapshot']\n"
    assert reexports(api, ast.parse(text), text) == set()
    text = "from tlora_sim.sim.core.snapshot import Snapshot  # noqa: F401\n"
    assert reexports(api, ast.parse(text), text) == {("tlora_sim.sim.core.snapshot", "Snapshot")}
