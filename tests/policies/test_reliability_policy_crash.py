"""Defect class "tracebacks where one line is promised" for policies (issue 45): a policy whose
``decide()`` raises or returns None is reported like an invalid action: exit 3, one line naming the
policy, the decision time and the exception; the traceback in ``error.txt`` of the kept staging
directory (or behind ``-v``); also under ``compare --workers 2`` (no remote traceback). The previous
run at ``--out`` is untouched."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tlora_sim.sim.cli.main import main
from tlora_sim.sim.core.engine import Engine
from tlora_sim.sim.core.policy_call import PolicyError

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--trace", "synthetic:jobs=20,seed=1", "--cluster", "1x8xH100", "--no-progress"]

CRASHY = '''
from dataclasses import dataclass
from tlora_sim.policies.api import register


@dataclass
class CrashyConfig:
    mode: str = "raise"
    after: int = 0
    init_fails: bool = False


@register("crashy", CrashyConfig, "raises or returns junk in decide()")
class Crashy:
    plan = "alone"
    timer_s = None

    def __init__(self, config):
        if config.init_fails:
            raise SystemExit(0)
        self.config = config
        self.calls = 0

    def decide(self, snap):
        self.calls += 1
        if self.calls <= self.config.after:
            return []
        if self.config.mode == "raise":
            return helper(snap)
        if self.config.mode == "exit":
            raise SystemExit(0)
        if self.config.mode == "none":
            return None
        if self.config.mode == "int":
            return 7
        return "start everything"


def helper(snap):
    raise ZeroDivisionError("boom in decide")
'''


@pytest.fixture(scope="module")
def crashy(tmp_path_factory):
    f = tmp_path_factory.mktemp("plugin") / "crashy.py"  # one file: its policy name is registered once
    f.write_text(CRASHY)
    return f


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("mode,what", [("raise", "ZeroDivisionError: boom in decide"), ("none", "returned None"),
                                       ("int", "returned 7"),
                                       ("exit", "SystemExit: 0"), ("str", "returned 'start everything'")])
def test_a_crashing_policy_is_exit_3_and_one_line(tmp_path, crashy, capsys, mode, what, reliability):
    out = tmp_path / "run"
    rc = main(["replay", "--policy-module", str(crashy), "--policy", "crashy", "--option", f"crashy.mode={mode}",
               *TINY, "--out", str(out), "--no-plots"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 3 and "'crashy'" in line and what in line and re.search(r"t=\d+\.\d+s", line), line
    assert not out.exists()
    if mode == "raise":  # the traceback is kept in the staging area, named in the line
        kept = Path(re.search(r"traceback in (\S+)\)", line).group(1))
        assert kept.name == "error.txt" and "helper" in kept.read_text() and "ZeroDivisionError" in kept.read_text()
    reliability("violations_caught")


def test_a_policy_whose_constructor_exits_is_one_line_exit_2(tmp_path, crashy, capsys, reliability):
    out = tmp_path / "run"
    rc = main(["replay", "--policy-module", str(crashy), "--policy", "crashy", "--option", "crashy.init_fails=true",
               *TINY, "--out", str(out), "--no-plots"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and "'crashy'" in line and "SystemExit" in line and not out.exists()
    reliability("bad_inputs")


def test_verbose_prints_the_policy_traceback(tmp_path, crashy, capsys):
    rc = main(["-v", "replay", "--policy-module", str(crashy), "--policy", "crashy", *TINY,
               "--out", str(tmp_path / "run"), "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 3 and "in helper" in err and "ZeroDivisionError" in err


def test_a_crashing_policy_leaves_the_previous_run_intact(tmp_path, crashy, capsys):
    out = tmp_path / "run"
    assert main(["replay", "--policy", "independent", *TINY, "--out", str(out), "--no-plots"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["replay", "--policy-module", str(crashy), "--policy", "crashy", *TINY, "--out", str(out),
                 "--no-plots", "--force"]) == 3
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_compare_with_two_workers_reports_one_line_no_remote_traceback(tmp_path, crashy):
    out = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "compare", "--policy-module", str(crashy),
                        "--policies", "independent,crashy", "--option", "crashy.after=2", "--workers", "2", *TINY,
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = _one_line(r.stderr)
    assert r.returncode == 3 and "'crashy'" in line and "ZeroDivisionError" in line, r.stderr
    assert "RemoteTraceback" not in r.stderr and not out.exists()
    kept = Path(re.search(r"traceback in (\S+)\)", line).group(1))
    assert "helper" in kept.read_text()


def test_policy_error_survives_pickling():
    e = PolicyError("p", 12.5, "ValueError: x", "Traceback ...")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.policy, e2.time_s, e2.what, e2.traceback_text, str(e2)) == (e.policy, 12.5, e.what, e.traceback_text,
                                                                           str(e))


def _workload():
    from tlora_sim.sim.experiments.replay import ReplayConfig, load_workload

    jobs, cluster, cm, *_ = load_workload(ReplayConfig(trace="synthetic:jobs=8,seed=1", policy="independent",
                                                       cluster="1x8xH100"))
    return jobs, cluster, cm


_WORKLOAD = _workload()


class _Raises:
    plan = "alone"
    timer_s = None
    name = "gen-raises"

    def __init__(self, exc: BaseException, after: int) -> None:
        self.exc, self.after, self.calls = exc, after, 0

    def decide(self, snap):
        self.calls += 1
        if self.calls > self.after:
            raise self.exc
        return []


@given(exc=st.sampled_from([ValueError("v"), KeyError("k"), TypeError("t"), RuntimeError(""), AssertionError("a"),
                            IndexError("i"), AttributeError("no attr"), RecursionError("deep")]),
       after=st.integers(0, 3))
def test_any_exception_from_decide_becomes_a_policy_error(exc, after):
    eng = Engine(*_WORKLOAD, _Raises(exc, after))
    with pytest.raises(PolicyError) as e:
        eng.run()
    assert e.value.policy == "gen-raises" and type(exc).__name__ in e.value.what
    assert "\n" not in str(e.value) and type(exc).__name__ in e.value.traceback_text


def test_the_kept_stage_is_removed_by_the_next_complete_run(tmp_path, crashy, capsys):
    out = tmp_path / "run"
    assert main(["replay", "--policy-module", str(crashy), "--policy", "crashy", *TINY, "--out", str(out),
                 "--no-plots"]) == 3
    assert [p for p in tmp_path.iterdir() if ".stage-" in p.name]
    assert main(["replay", "--policy", "independent", *TINY, "--out", str(out), "--no-plots"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
