"""Defect class "exit 0 with nothing done" (issue 45, item 1): plug-in loading cannot end the
process. ``SystemExit`` and other ``BaseException`` subclasses raised while a policy module or an
entry point is imported become one error line naming the module (exit 2); a broken entry point
names its distribution and does not break commands that do not need it; built-in names cannot be
replaced, even by a class of the same ``__qualname__``."""

from __future__ import annotations

import pytest

from tlora_sim.policies import registry
from tlora_sim.policies.registry import available, load_policy_module, make_policy
from tlora_sim.sim.cli.main import main
from tlora_sim.traces.errors import InputError

BODIES = {
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "SystemExit(3)": "raise SystemExit(3)\n",
    "GeneratorExit": "raise GeneratorExit('x')\n",
    "BaseException": "raise BaseException('odd')\n",
    "custom BaseException": "class E(BaseException):\n    pass\nraise E('mine')\n",
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_base_exception_in_a_policy_module_is_one_error_line(tmp_path, capsys, kind, reliability):
    f = tmp_path / "plug.py"
    f.write_text(BODIES[kind])
    rc = main(["policies", "--policy-module", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(f) in err[0], (rc, err)
    reliability("bad_inputs")


def test_keyboard_interrupt_from_a_policy_module_still_propagates(tmp_path):
    f = tmp_path / "plug.py"
    f.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_policy_module(str(f))


def test_a_failed_module_leaves_none_of_its_policies_registered(tmp_path):
    f = tmp_path / "half.py"
    f.write_text("from dataclasses import dataclass\nfrom tlora_sim.policies.api import register\n"
                 "@dataclass\nclass C:\n    pass\n"
                 "@register('half-registered', C, 'x')\nclass P:\n    def __init__(self, c):\n        pass\n"
                 "raise SystemExit(0)\n")
    with pytest.raises(InputError, match="SystemExit"):
        load_policy_module(str(f))
    assert "half-registered" not in {e.name for e in available()}


@pytest.mark.parametrize("qualname", ["TLoRA", "Impostor"])
def test_a_builtin_name_cannot_be_replaced_by_a_user_module(tmp_path, qualname):
    builtin = make_policy("tlora")
    f = tmp_path / "impostor.py"
    f.write_text("from dataclasses import dataclass\nfrom tlora_sim.policies.api import register\n"
                 "@dataclass\nclass C:\n    pass\n"
                 f"@register('tlora', C, 'impostor')\nclass {qualname}:\n    def __init__(self, c):\n        pass\n")
    with pytest.raises(InputError, match="built-in .* cannot be replaced") as e:
        load_policy_module(str(f))
    assert e.value.file == str(f)
    assert type(make_policy("tlora")) is type(builtin)


def _broken_entry_point(monkeypatch, tmp_path, body: str) -> None:
    """An installed distribution ``fakeplug 1.0`` (a ``.dist-info`` on ``sys.path``) whose entry
    point ``brk`` in the ``tlora_sim.policies`` group imports a module that fails with ``body``."""
    (tmp_path / "broken_ep_mod.py").write_text(body)
    info = tmp_path / "fakeplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nbrk = broken_ep_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_BROKEN", {})


def test_a_broken_entry_point_does_not_break_other_commands(monkeypatch, tmp_path, capsys):
    _broken_entry_point(monkeypatch, tmp_path, "raise SystemExit(0)\n")
    out = tmp_path / "run"
    rc = main(["replay", "--policy", "independent", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100",
               "--out", str(out), "--no-progress", "--no-plots"])
    assert rc == 0 and (out / "summary.json").is_file()
    capsys.readouterr()
    assert main(["policies"]) == 0
    io = capsys.readouterr()
    assert "independent" in io.out
    warn = [ln for ln in io.err.splitlines() if "brk" in ln]
    assert len(warn) == 1 and "SystemExit" in warn[0] and "distribution fakeplug 1.0" in warn[0]


def test_a_policy_missing_because_its_entry_point_broke_names_the_entry_point(monkeypatch, tmp_path, capsys):
    _broken_entry_point(monkeypatch, tmp_path, "raise ImportError('no torch here')\n")
    rc = main(["replay", "--policy", "from-plugin", "--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100",
               "--out", str(tmp_path / "run"), "--no-progress", "--no-plots"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'brk'" in err[0] and "no torch here" in err[0] and "fakeplug" in err[0]
    assert not (tmp_path / "run").exists()


def test_a_dotted_policy_module_that_exits_is_one_error_line(tmp_path, monkeypatch, capsys, reliability):
    pkg = tmp_path / "exitpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pol.py").write_text("raise SystemExit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["policies", "--policy-module", "exitpkg.pol"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "exitpkg.pol" in err[0] and "SystemExit" in err[0]
    reliability("bad_inputs")
