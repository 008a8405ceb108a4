"""One set of action rules (``sim/core/action_rules.py``) for both backends: a policy's bad action
is rejected with the very same message by the SimPy engine (checks on or off) and by the real-time
executor (steps that take the cost model's time: no torch)."""

from __future__ import annotations

import pytest

from conftest import CM, cluster, make_job
from tlora_sim.sim.core import action_rules as rules
from tlora_sim.sim.core.engine import Engine, InvariantError
from tlora_sim.sim.core.snapshot import AddMembers, RemoveMembers, SetExecution, StartGroup, StopMembers

# job 0 (llama) runs alone in group 0 on the one GPU from t=0; at t=10 jobs 1 (qwen) and 2 (llama)
# arrive and the policy answers with the bad action
BAD = [
    (StartGroup((2, 2), ((0, 1),), "fused"), "StartGroup names a job twice: (2, 2)"),
    (StartGroup((7,), ((0, 1),), "fused"), "StartGroup names job index 7, which is not queued"),
    (StartGroup((7, 7), ((0, 1),), "fused"), "StartGroup names job index 7, which is not queued"),
    (StartGroup((), ((0, 1),), "fused"), "StartGroup with no jobs"),
    (StartGroup((1, 2), ((0, 1),), "fused"), "StartGroup mixes base models ['llama3-8b', 'qwen3-8b']"),
    (StartGroup((2,), ((0, 1),), "fused"), "StartGroup [2] on ((0, 1),) double-books GPUs"),
    (AddMembers(0, (1,)), "AddMembers puts jobs ['j1'] on a llama3-8b group"),
    (AddMembers(5, (2,)), "AddMembers names group 5, which is not running"),
    (RemoveMembers(0, (2,)), "RemoveMembers: job index 2 not in group 0"),
    (StopMembers(0, (0, 0)), "StopMembers names a job twice: (0, 0)"),
    (StopMembers(0, ()), "StopMembers on group 0 with no jobs"),
    (SetExecution(0, 0, 1), "SetExecution needs counts >= 1, got SetExecution("),
    ("not an action", "unknown action 'not an action'"),
]


class Bad:
    """Start job 0 alone, then answer the next decision with ``action``."""

    name, plan, timer_s = "bad", "fused", None

    def __init__(self, action):
        self.action = action

    def decide(self, snap):
        if not snap.groups:
            return [StartGroup((0,), ((0, 1),), "fused")]
        return [self.action]


class _Steps:
    """A trainer whose groups' steps take the cost model's time (nothing trains)."""

    def __init__(self, jobs):
        self.jobs = jobs

    def group(self, model, plan, members):
        mem = tuple(self.jobs[m[0]].member for m in members)

        class G:
            build_ms = 0.0  # what a build costs on the virtual clock

            def step(self, nano=1, micro=1):
                return CM.step_time_s(model, "H100", mem, 1, plan, nano, micro) * 1e3

            def save(self):
                return 0.0

        return G()

    def release(self):
        pass


def _jobs():
    return [make_job(0, steps=10_000), make_job(1, submit=10.0, model="qwen3-8b"), make_job(2, submit=10.0)]


def _engine_error(action, check: bool) -> str:
    with pytest.raises(InvariantError) as info:
        Engine(_jobs(), cluster("1x1xH100"), CM, Bad(action), check_invariants=check).run()
    return str(info.value)


def _executor_error(action) -> str:
    from tlora_sim.sim.executor.clock import VirtualClock
    from tlora_sim.sim.executor.runtime import RealTimeExecutor

    jobs = _jobs()
    with pytest.raises(InvariantError) as info:
        RealTimeExecutor(jobs, cluster("1x1xH100"), CM, Bad(action), _Steps(jobs), clock=VirtualClock()).run()
    return str(info.value)


@pytest.mark.parametrize("action, message", BAD, ids=[m.split(",")[0][:40] for _, m in BAD])
def test_both_backends_reject_a_bad_action_with_the_same_message(action, message):
    checked, plain, executed = _engine_error(action, True), _engine_error(action, False), _executor_error(action)
    assert plain.startswith(f"t=10.000000s: {message}")
    # with the invariant checker (the executor always runs it): the same line, then the history
    assert checked.splitlines()[0] == executed.splitlines()[0] == f"[action] {plain}"
    assert "last 5 event(s)" in executed


def test_take_queued_checks_before_it_removes():
    queue = {0: "a", 1: "b"}
    with pytest.raises(rules.ActionRejected, match="not queued"):
        rules.take_queued(queue, (0, 5), "StartGroup")
    with pytest.raises(rules.ActionRejected, match="twice"):
        rules.take_queued(queue, (1, 1), "AddMembers")
    assert queue == {0: "a", 1: "b"}  # nothing taken by a rejected action
    assert rules.take_queued(queue, (1, 0), "StartGroup") == [1, 0] and queue == {}
