"""The open policy API: check_policy, load_policy_module, --policy-module from outside the repo,
the entry-point group, and the external example in docs/examples."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tlora_sim.policies import api
from tlora_sim.policies.contract import check_policy, standard_snapshots
from tlora_sim.policies.registry import available, load_policy_module, make_policy, unregister
from tlora_sim.sim.core.snapshot import AddMembers, StartGroup
from tlora_sim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "equal_rank.py"


@pytest.mark.parametrize("name", [e.name for e in available()])
def test_every_builtin_policy_keeps_the_contract(name):
    assert check_policy(make_policy(name)) == []


class _Base:
    plan = "alone"
    timer_s = None

    def __init__(self, config=None):
        self.config = config


class Raises(_Base):
    def decide(self, snap):
        raise ZeroDivisionError("boom")


class NotAList(_Base):
    def decide(self, snap):
        return {"start": 1}


class Greedy(_Base):
    """Starts every queued job on node 0 with one GPU: wrong GPU counts, GPUs not free."""

    def decide(self, snap):
        return [StartGroup((j.index,), ((0, 1),), self.plan) for j in snap.queue]


class Twice(_Base):
    def decide(self, snap):
        return [StartGroup((j.index,), ((0, j.num_gpus),), "alone") for j in snap.queue[:1]] * 2


class Mixer(_Base):
    def decide(self, snap):
        models = {j.model: j for j in snap.queue}
        if len(models) < 2:
            return []
        jobs = list(models.values())[:2]
        return [StartGroup(tuple(j.index for j in jobs), ((0, 1),), "fused")]


class Ghost(_Base):
    def decide(self, snap):
        return [AddMembers(99, (0,))] if snap.queue else []


class BadTimer(_Base):
    timer_s = float("nan")

    def decide(self, snap):
        return []


@pytest.mark.parametrize("cls,rule", [(Raises, "raises"), (NotAList, "return type"), (Greedy, "gpus"),
                                      (Greedy, "gpus not free"), (Twice, "job twice"),
                                      (Mixer, "mixed base models"), (Ghost, "unknown group"),
                                      (BadTimer, "timer_s")])
def test_broken_policies_are_caught(cls, rule):
    found = check_policy(cls())
    assert rule in {v.rule for v in found}, [str(v) for v in found]
    assert all(str(v) for v in found)


def test_standard_snapshots_cover_the_documented_cases():
    names = [n for n, _ in standard_snapshots()]
    assert {"empty queue", "one job", "two base models", "full cluster", "running group"} <= set(names)


def test_load_policy_module_registers_and_is_idempotent(tmp_path):
    f = tmp_path / "equal_rank.py"
    shutil.copy(EXAMPLE, f)
    assert load_policy_module(str(f)) == ["equal-rank"]
    assert load_policy_module(str(f)) == ["equal-rank"]
    pol = make_policy("equal-rank", {"max_group_size": "3"})
    assert pol.config.max_group_size == 3 and pol.name == "equal-rank"
    assert check_policy(pol) == []


@pytest.mark.parametrize("body,match", [(None, "no such"), ("raise RuntimeError('nope')", "RuntimeError: nope"),
                                        ("x = 1", "registered no policy"), ("import not_a_module_xyz", "No module")])
def test_load_policy_module_errors_name_the_file(tmp_path, body, match):
    f = tmp_path / "p.py"
    if body is not None:
        f.write_text(body + "\n")
    with pytest.raises(InputError, match=match) as e:
        load_policy_module(str(f))
    assert e.value.file == str(f) and "\n" not in str(e.value)


def test_a_name_cannot_be_taken_twice():
    with pytest.raises(InputError, match="already registered"):
        @api.register("tlora", type("C", (), {"__annotations__": {}}), "x")
        class Impostor(_Base):
            pass


def test_unregister_forgets_a_registered_policy_but_no_builtin():
    @api.register("unregister-test", type("Cfg", (), {"__dataclass_fields__": {}}), "test only")
    class Throwaway:
        pass

    assert "unregister-test" in [e.name for e in available()]
    assert unregister("unregister-test") and not unregister("unregister-test")
    assert "unregister-test" not in [e.name for e in available()]
    with pytest.raises(InputError, match="unknown policy"):
        make_policy("unregister-test")
    with pytest.raises(ValueError, match="built-in"):
        unregister("tlora")
    assert "tlora" in [e.name for e in available()]


def test_non_finite_option_rejected():
    with pytest.raises(InputError, match="finite"):
        make_policy("tlora", {"tick_s": "nan"})


def test_entry_points_are_loaded(monkeypatch, tmp_path):
    import importlib.metadata as md

    from tlora_sim.policies import registry

    mod = tmp_path / "ep_policy_mod.py"
    mod.write_text(EXAMPLE.read_text().replace('"equal-rank"', '"equal-rank-ep"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = md.EntryPoint(name="eq", value="ep_policy_mod", group=registry.ENTRY_POINT_GROUP)
    real = md.entry_points
    monkeypatch.setattr(md, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == registry.ENTRY_POINT_GROUP else real(**kw))
    monkeypatch.setattr(registry, "_loaded", False)
    try:
        assert "equal-rank-ep" in [e.name for e in available()]
    finally:
        unregister("equal-rank-ep")


def test_replay_with_policy_module_from_outside_the_repo(tmp_path):
    f = tmp_path / "equal_rank.py"
    shutil.copy(EXAMPLE, f)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "replay", "--policy-module", "equal_rank.py",
                        "--policy", "equal-rank", "--trace", "synthetic:jobs=60,seed=1", "--cluster", "2x8xH100",
                        "--out", str(out), "--no-progress", "--no-plots"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["policy"] == "equal-rank" and cfg["inputs"]["policy_modules"] == [str(f)]
    jobs = (out / "jobs.csv").read_text().splitlines()
    assert len(jobs) == 61


def test_compare_with_policy_module_in_workers(tmp_path):
    f = tmp_path / "equal_rank.py"
    shutil.copy(EXAMPLE, f)
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--policy-module", str(f),
                        "--policies", "independent,equal-rank", "--trace", "synthetic:jobs=40,seed=2",
                        "--cluster", "1x8xH100", "--out", str(tmp_path / "cmp"), "--workers", "2",
                        "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "equal-rank" in (tmp_path / "cmp" / "summary.csv").read_text()


def test_bad_policy_module_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "replay", "--policy-module", "missing.py",
                        "--policy", "x", "--trace", "synthetic:jobs=5", "--cluster", "1x8xH100",
                        "--out", str(tmp_path / "o")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "missing.py" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_api_exports_resolve():
    for name in api.__all__:
        assert getattr(api, name) is not None
    assert dataclasses.is_dataclass(make_policy("independent").config)
